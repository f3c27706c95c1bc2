"""Offline throughput on this machine: LLM.generate against transformers' batched generate,
and what each of the radix cache, chunked prefill and overlap scheduling changes.

    python tools/bench_offline.py            # writes docs/data/ch11-offline-bench.md

The workload: 32 requests for SmolLM2-135M-Instruct in float32, each a chat prompt under one
shared system prompt (so a prefix cache has something to reuse) with its own question, and
exactly 48 new tokens each (EOS ignored, so every configuration does the same work). Each
configuration runs `--repeat` times (default 3) after a warm-up request, and the table gives
the best of those runs (wall-clock seconds and generated tokens per second): on a busy or
throttling machine single runs vary by 20%. It is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import Callable, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LOG_LEVEL", "WARNING")
os.environ["MINISGL_DEVICE"] = os.environ.get("MINISGL_DEVICE", "cpu")

import torch  # noqa: E402

from tools.models import SMOLLM2, ensure_model  # noqa: E402

SYSTEM = (
    "You are a friendly tutor. Explain things step by step, give one small example, and "
    "end with a question that checks understanding. Keep a calm and encouraging tone. "
) * 3
TOPICS = [
    "fractions",
    "photosynthesis",
    "gravity",
    "loops in Python",
    "the water cycle",
    "verbs",
    "prime numbers",
    "volcanoes",
    "electricity",
    "maps",
    "the moon",
    "recipes",
    "music notes",
    "magnets",
    "the alphabet",
    "clouds",
]
NEW_TOKENS = 48
OUT = ROOT / "docs" / "data" / "ch11-offline-bench.md"


def workload(tok) -> List[List[int]]:
    prompts = []
    for i in range(32):
        question = f"Teach me about {TOPICS[i % len(TOPICS)]}" + (
            " in simple words." if i >= 16 else "."
        )
        chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        prompts.append(
            tok(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)).input_ids
        )
    return prompts


REPEAT = 3


def best_of(run_once: Callable[[], Tuple[float, int]]) -> Tuple[float, int]:
    """The fastest of REPEAT runs: (seconds, tokens generated)."""
    return min((run_once() for _ in range(REPEAT)), key=lambda result: result[0])


def timed(fn: Callable[[], int]) -> Tuple[float, int]:
    begin = time.perf_counter()
    tokens = fn()
    return time.perf_counter() - begin, tokens


def run_transformers(path: str, prompts: List[List[int]]) -> Tuple[float, int]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    batch = tok.pad({"input_ids": prompts}, return_tensors="pt")
    model.generate(**tok.pad({"input_ids": prompts[:1]}, return_tensors="pt"), max_new_tokens=2)

    def go() -> int:
        with torch.inference_mode():
            out = model.generate(
                **batch, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False
            )
        return (out.shape[1] - batch["input_ids"].shape[1]) * len(prompts)

    return best_of(lambda: timed(go))


def run_minisgl(
    path: str, prompts: List[List[int]], cache_type: str, budget: int, overlap: bool
) -> Tuple[float, int, int, int]:
    """(seconds, generated tokens, prompt tokens computed, prefill batches)."""
    from minisgl.core import SamplingParams
    from minisgl.env import ENV
    from minisgl.llm import LLM

    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)

    class CountingLLM(LLM):
        """Counts the prompt tokens that prefill batches really compute."""

        computed = prefills = 0

        def _forward(self, forward_input):
            if forward_input.batch.is_prefill:
                self.computed += sum(r.extend_len for r in forward_input.batch.reqs)
                self.prefills += 1
            return super()._forward(forward_input)

    def once() -> Tuple[float, int]:
        # a fresh engine each time: a prefix cache left warm by the last run would flatter it
        ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
        llm = CountingLLM(
            path,
            dtype=torch.float32,
            max_running_req=32,
            page_size=16,
            num_page_override=1024,
            cache_type=cache_type,
            max_extend_tokens=budget,
        )
        try:
            llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))  # warm-up
            llm.computed = llm.prefills = 0
            result = timed(lambda: sum(len(r["token_ids"]) for r in llm.generate(prompts, params)))
            counts[:] = [llm.computed, llm.prefills]
            return result
        finally:
            llm.shutdown()
            ENV.DISABLE_OVERLAP_SCHEDULING.value = False

    counts = [0, 0]
    seconds, tokens = best_of(once)
    return seconds, tokens, counts[0], counts[1]


def main() -> int:
    global REPEAT
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--repeat", type=int, default=3, help="runs per configuration")
    args = parser.parse_args()
    REPEAT = args.repeat
    from transformers import AutoTokenizer

    path = str(ensure_model(SMOLLM2))
    prompts = workload(AutoTokenizer.from_pretrained(path))
    lengths = [len(p) for p in prompts]
    shared = len(os.path.commonprefix(prompts))
    hf_seconds, hf_tokens = run_transformers(path, prompts)
    rows = [
        (
            "transformers `generate`, one batch of 32 (left-padded)",
            hf_seconds,
            hf_tokens,
            sum(lengths),
            1,
        )
    ]
    configs = [
        ("minisgl `LLM.generate`: radix cache, prefill budget 512, overlap", "radix", 512, True),
        ("the same, with the naive cache instead of the radix cache", "naive", 512, True),
        ("the same, with budget 8192 (all 32 prompts in one prefill batch)", "radix", 8192, True),
        ("the same, with budget 128 (prompts split into chunks)", "radix", 128, True),
        ("the same, with overlap scheduling off", "radix", 512, False),
    ]
    for label, cache_type, budget, overlap in configs:
        rows.append((label, *run_minisgl(path, prompts, cache_type, budget, overlap)))
        print(f"{label}: {rows[-1][1]:.1f} s", file=sys.stderr)
    lines = [
        f"SmolLM2-135M-Instruct, float32, CPU ({platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}); 32 requests, prompts of "
        f"{min(lengths)} to {max(lengths)} tokens whose first {shared} tokens are the same (the "
        f"system prompt), {NEW_TOKENS} new tokens each ({32 * NEW_TOKENS} in all); best of "
        f"{REPEAT} runs. Regenerate with `python tools/bench_offline.py`.",
        "",
        "| configuration | seconds | generated tokens/s | prompt tokens computed | prefill "
        "batches |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {label} | {seconds:.1f} | {tokens / seconds:.1f} | {computed} | {batches} |"
        for label, seconds, tokens, computed, batches in rows
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
