"""Chapter 10: chunked prefill.

One prefill batch computes at most `max_extend_tokens` prompt tokens. A longer prompt is
prefilled over several steps, a chunk at a time, and the requests already decoding take turns
with it instead of waiting for the whole prompt. The outputs do not change: a chunk attends
to the chunks before it through the KV cache, exactly as the decode steps do.
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

STORY = (
    "Once upon a time, in a village between two rivers, there lived a baker who rose every "
    "morning before the sun. She baked bread for the whole village, and every loaf was a "
    "little different, because she liked to try new things: seeds, herbs, a pinch of honey. "
    "One winter the rivers froze, the roads closed, and no flour came for weeks. "
)


def show_chunks() -> None:
    tok = load_tokenizer(DEMO_MODEL)
    long_prompt = tok(STORY + "What did the baker do when the flour ran out?").input_ids
    arrivals = [
        (0, user_msg(0, tok("The capital of France is").input_ids, 12)),
        (0, user_msg(1, tok("Water boils at").input_ids, 12)),
        (2, user_msg(2, long_prompt, 6)),
    ]
    print(f"r2's prompt has {len(long_prompt)} tokens; a prefill batch computes at most 32")
    print("step  phase    reqs  waiting  free slots  (request:new tokens)")
    config = make_config(DEMO_MODEL, max_extend_tokens=32)
    sched = ScriptedScheduler(config, arrivals, trace=True)
    chunked = sched.run()
    sched.cache_manager.check_integrity()
    sched.shutdown()
    whole = ScriptedScheduler(make_config(DEMO_MODEL, max_extend_tokens=8192), arrivals)
    same = whole.run() == chunked
    whole.shutdown()
    print(f"the same tokens as without chunks: {same}")
    print(f"  r2 -> {tok.decode(chunked[2])!r}\n")


def generate(name: str, prompts: List[List[int]], n: int) -> List[List[int]]:
    """A budget of 8 tokens: every prompt but the shortest is split, the chat prompt in 5."""
    arrivals = [(2 * i, user_msg(i, p, n)) for i, p in enumerate(prompts)]
    sched = ScriptedScheduler(make_config(name, max_extend_tokens=8, page_size=4), arrivals)
    try:
        outputs = sched.run()
        sched.cache_manager.check_integrity()
    finally:
        sched.shutdown()
    return [outputs[i] for i in range(len(prompts))]


def main() -> int:
    show_chunks()
    return 0 if run_parity(generate).ok else 1


if __name__ == "__main__":
    sys.exit(main())
