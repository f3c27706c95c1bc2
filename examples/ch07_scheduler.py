"""Chapter 07: the scheduler and continuous batching.

Requests arrive while others are decoding. Each step the scheduler runs either a prefill of
the requests that just arrived or one decode step of every running request; finished requests
leave at once and free their slot and pages. The trace shows every step's batch.
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


def show_continuous_batching() -> None:
    tok = load_tokenizer(DEMO_MODEL)
    texts = [
        "The capital of France is",
        "Water boils at",
        "def add(a, b):",
        "The sky is",
        "One, two,",
    ]
    steps, budgets = [0, 0, 3, 4, 9], [6, 3, 5, 4, 3]
    arrivals = [
        (s, user_msg(i, tok(t).input_ids, n))
        for i, (t, s, n) in enumerate(zip(texts, steps, budgets))
    ]
    print(
        "requests: "
        + "; ".join(
            f"r{i} arrives at step {s}, max_tokens={n}"
            for i, (s, n) in enumerate(zip(steps, budgets))
        )
    )
    print("step  phase    reqs  waiting  free slots  (request:new tokens)")
    sched = ScriptedScheduler(make_config(DEMO_MODEL), arrivals, trace=True)
    outputs = sched.run()
    for uid in sorted(outputs):
        print(f"  r{uid} finished at step {sched.finish_step[uid]}: {tok.decode(outputs[uid])!r}")
    sched.shutdown()
    print()


def generate(name: str, prompts: List[List[int]], n: int) -> List[List[int]]:
    """Staggered arrivals: prompt i arrives at step 3*i, while the earlier ones decode."""
    arrivals = [(3 * i, user_msg(i, p, n)) for i, p in enumerate(prompts)]
    sched = ScriptedScheduler(make_config(name), arrivals)
    try:
        outputs = sched.run()
    finally:
        sched.shutdown()
    return [outputs[i] for i in range(len(prompts))]


def main() -> int:
    show_continuous_batching()
    return 0 if run_parity(generate).ok else 1


if __name__ == "__main__":
    sys.exit(main())
