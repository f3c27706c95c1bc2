"""Chapter 09: the radix cache.

Eight chat requests share one long system prompt and differ only in their question. With the
naive cache every request computes its whole prompt; with the radix cache the shared prefix is
computed once and reused by every later request. The same tokens come out either way; the
work does not.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("LOG_LEVEL", "WARNING")
from examples.helpers.scripted import ScriptedScheduler, make_config, user_msg  # noqa: E402
from minisgl.kvcache.radix_cache import RadixPrefixCache, RadixTreeNode  # noqa: E402
from tools.models import DEMO_MODEL  # noqa: E402
from tools.parity import load_tokenizer, run_parity  # noqa: E402

SYSTEM = (
    "You are a patient teacher. Answer in one short sentence, use simple words, and never "
    "repeat the question. If you do not know, say so."
)
QUESTIONS = [
    "What is the capital of France?",
    "Why is the sky blue?",
    "What is 7 times 8?",
    "Who wrote Hamlet?",
    "What do bees make?",
    "How many legs does a spider have?",
    "What is ice made of?",
    "Which planet is the largest?",
]


class CountingScheduler(ScriptedScheduler):
    """Counts the prompt tokens each prefill really computes."""

    computed = 0

    def _forward(self, forward_input):
        if forward_input.batch.is_prefill:
            self.computed += sum(r.extend_len for r in forward_input.batch.reqs)
        return super()._forward(forward_input)


def run(cache_type: str, prompts: List[List[int]], page_size: int = 1):
    arrivals = [(2 * i, user_msg(i, p, 10)) for i, p in enumerate(prompts)]
    config = make_config(
        DEMO_MODEL, cache_type=cache_type, page_size=page_size, num_page_override=2048 // page_size
    )
    sched = CountingScheduler(config, arrivals)
    outputs = sched.run()
    sched.cache_manager.check_integrity()
    return sched, outputs


def describe_tree(
    node: RadixTreeNode, tok, depth: int = 0, lines: List[str] | None = None
) -> List[str]:
    lines = [] if lines is None else lines
    for child in sorted(node.children.values(), key=lambda n: n.uuid):
        text = tok.decode(child._key.tolist())
        text = text if len(text) <= 40 else text[:18] + " ... " + text[-17:]
        lines.append(f"{'  ' * depth}[{child.length:3d} tokens, ref {child.ref_count}] {text!r}")
        describe_tree(child, tok, depth + 1, lines)
    return lines


def show_reuse() -> None:
    tok = load_tokenizer(DEMO_MODEL)
    prompts = [
        tok.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )["input_ids"]
        for q in QUESTIONS
    ]
    total = sum(len(p) for p in prompts)
    print(f"8 prompts, {total} prompt tokens in all, each arriving 2 steps after the previous one")
    results: Dict[str, Dict[int, List[int]]] = {}
    for cache_type in ("naive", "radix"):
        sched, results[cache_type] = run(cache_type, prompts)
        print(
            f"{cache_type:5s} cache: {sched.computed:4d} prompt tokens computed "
            f"({total - sched.computed} reused)"
        )
        if cache_type == "radix":
            assert isinstance(sched.cache_manager.prefix_cache, RadixPrefixCache)
            info = sched.cache_manager.prefix_cache.size_info
            print(
                f"the tree after the workload ({info.total_size} cached tokens, all evictable now):"
            )
            for line in describe_tree(sched.cache_manager.prefix_cache.root_node, tok)[:12]:
                print("  " + line)
        sched.shutdown()
    print(f"same tokens with both caches: {results['naive'] == results['radix']}")
    for q, out in list(zip(QUESTIONS, [results["radix"][i] for i in range(8)]))[:3]:
        print(f"  {q!r} -> {tok.decode(out)!r}")
    print()


def generate(name: str, prompts: List[List[int]], n: int) -> List[List[int]]:
    """Each prompt twice: the second copy reuses the first one's cached prefix."""
    doubled = [p for p in prompts for _ in range(2)]
    arrivals = [(2 * i, user_msg(i, p, n)) for i, p in enumerate(doubled)]
    config = make_config(name, cache_type="radix", page_size=4, num_page_override=256)
    sched = CountingScheduler(config, arrivals)
    try:
        outputs = sched.run()
        sched.cache_manager.check_integrity()
    finally:
        sched.shutdown()
    assert sched.computed < sum(len(p) for p in doubled), "the second copies reused nothing"
    assert all(outputs[2 * i] == outputs[2 * i + 1] for i in range(len(prompts)))
    return [outputs[2 * i + 1] for i in range(len(prompts))]  # the copies that reused a prefix


def main() -> int:
    show_reuse()
    return 0 if run_parity(generate).ok else 1


if __name__ == "__main__":
    sys.exit(main())
