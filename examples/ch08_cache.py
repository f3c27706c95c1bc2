"""Chapter 08: the CacheManager and admission control.

The KV pool is now small on purpose: six requests arrive together, but only as many start as
the pool can carry to their last token (prompt plus max_tokens, on top of what the running
requests may still need). The others wait; as running requests finish, their pages come back
and the next ones start. After the workload the cache's integrity check proves that every page
is back. Then the same workload runs with pages of 1, 4 and 16 tokens.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("LOG_LEVEL", "WARNING")
from examples.helpers.scripted import ScriptedScheduler, make_config, user_msg  # noqa: E402
from tools.models import DEMO_MODEL  # noqa: E402
from tools.parity import load_tokenizer, run_parity  # noqa: E402


def show_memory_pressure() -> None:
    tok = load_tokenizer(DEMO_MODEL)
    texts = [
        "The capital of France is",
        "Water boils at",
        "def add(a, b):",
        "The sky is",
        "One, two,",
        "My favourite fruit is",
    ]
    msgs = [user_msg(i, tok(t).input_ids, 12) for i, t in enumerate(texts)]
    needs = [len(m.input_ids) + m.sampling_params.max_tokens for m in msgs]
    print(f"6 requests need {needs} token slots (prompt + max_tokens); the pool has 16 pages of 4")
    print("step  phase    reqs  waiting  free slots  (request:new tokens)")
    config = make_config(DEMO_MODEL, page_size=4, num_page_override=16, cache_type="naive")
    sched = ScriptedScheduler(config, [(0, m) for m in msgs], trace=True)
    outputs = sched.run()
    sched.cache_manager.check_integrity()
    print(
        f"all done; integrity check passed: {len(sched.cache_manager.free_slots)} of "
        f"{sched.cache_manager.num_pages} pages free"
    )
    sched.shutdown()
    for page_size in (1, 16):
        config = make_config(
            DEMO_MODEL, page_size=page_size, num_page_override=64 // page_size, cache_type="naive"
        )
        other = ScriptedScheduler(
            config, [(0, user_msg(i, tok(t).input_ids, 12)) for i, t in enumerate(texts)]
        )
        same = other.run() == outputs
        other.cache_manager.check_integrity()
        print(f"page_size={page_size:<2d} (64 slots): same tokens as page_size=4: {same}")
        other.shutdown()
    print()


def generate(name: str, prompts: List[List[int]], n: int) -> List[List[int]]:
    """Every prompt at once into a pool that holds only about one request at a time."""
    longest = max(len(p) for p in prompts) + n
    pages = -(-longest // 16) + 1
    config = make_config(name, page_size=16, num_page_override=pages, cache_type="naive")
    sched = ScriptedScheduler(config, [(0, user_msg(i, p, n)) for i, p in enumerate(prompts)])
    try:
        outputs = sched.run()
        sched.cache_manager.check_integrity()
    finally:
        sched.shutdown()
    return [outputs[i] for i in range(len(prompts))]


def main() -> int:
    show_memory_pressure()
    return 0 if run_parity(generate).ok else 1


if __name__ == "__main__":
    sys.exit(main())
