"""Chapter 11: overlap scheduling, and the offline interface LLM.generate.

The scheduler now launches batch N+1 before it processes batch N's results, so that the CPU's
work (processing results, scheduling, preparing the next batch) happens while the device
computes. On a CPU the same loop runs, with the same one-step delay, so its logic is checked
here. Then LLM.generate serves a mixed workload: shared prefixes, prompts from 3 to several
hundred tokens, 1 to 64 new tokens, pages of 1 and 16 tokens, a small prefill budget (so long
prompts are chunked), the radix cache and overlap, and every request must match
transformers.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("LOG_LEVEL", "WARNING")
from minisgl.core import SamplingParams  # noqa: E402
from minisgl.env import ENV  # noqa: E402
from minisgl.llm import LLM  # noqa: E402
from tools.models import DEMO_MODEL, SMOLLM2, ensure_model  # noqa: E402
from tools.parity import Case, book_dtype, eos_ids, load_tokenizer, run_parity_cases  # noqa: E402

SYSTEMS = [
    "You are a helpful assistant.",
    "You are a careful reviewer of Python code. Point out bugs first, then style, and keep each "
    "remark to one sentence.",
    "You write for a cooking magazine. Every answer names the dish, the time it takes, the "
    "ingredients with their amounts, and the steps in order. Use metric units. Mention what can "
    "go wrong and how to fix it. Suggest one variation for vegetarians and one for people in a "
    "hurry. Finish with a tip on serving. " * 5,
]
QUESTIONS = [
    "Hi there!",
    "What is 2 + 2?",
    "Name a colour.",
    "Write a haiku about rain.",
    "def square(x):",
    "Explain recursion in one line.",
    "How do I boil an egg?",
    "List three prime numbers.",
]
NEW_TOKENS = [1, 64, 5, 33, 2, 17, 48, 8, 64, 3, 24, 12]
ON_OFF_MODEL = "tiny-qwen3"
PAGE_SIZES = (1, 16)  # one run per page size on the tiny models; SmolLM2 runs with the second


def mixed_cases(name: str) -> List[Case]:
    """26 requests: 8 without a system prompt (3 to 10 tokens), 18 under one of three shared
    system prompts (the longest over 300 tokens)."""
    tok = load_tokenizer(name)
    cases = []
    for i, question in enumerate(QUESTIONS):
        ids = tok(question).input_ids
        cases.append(Case(f"plain-{i}", ids, NEW_TOKENS[i % len(NEW_TOKENS)]))
    for j, system in enumerate(SYSTEMS):
        for i, question in enumerate(QUESTIONS[j : j + 6]):
            chat = [{"role": "system", "content": system}, {"role": "user", "content": question}]
            text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
            n = NEW_TOKENS[(5 * j + i) % len(NEW_TOKENS)]
            cases.append(Case(f"system{j}-{i}", tok(text).input_ids, n))
    return cases


def make_llm(name: str, **kwargs) -> LLM:
    settings = dict(max_running_req=32, page_size=16, num_page_override=512, max_extend_tokens=64)
    settings.update(kwargs)
    return LLM(str(ensure_model(name)), dtype=book_dtype(), **settings)


def with_eos(result: List[int], n: int, eos: List[int]) -> List[int]:
    """LLM.generate leaves out the final EOS token; transformers keeps it."""
    return result + eos[:1] if len(result) < n and eos else result


def show_overlap_timeline() -> None:
    """The order of events in the loop: launch N+1, then process N."""
    events: List[str] = []

    class Tracing(LLM):
        def _forward(self, forward_input):
            batch = forward_input.batch
            events.append(f"launch  {batch.phase:7s} of {[r.uid for r in batch.reqs]}")
            return super()._forward(forward_input)

        def _process_last_data(self, last_data):
            if last_data is not None:
                batch = last_data[0].batch
                events.append(f"process {batch.phase:7s} of {[r.uid for r in batch.reqs]}")
            super()._process_last_data(last_data)

    llm = Tracing(
        str(ensure_model(DEMO_MODEL)), dtype=book_dtype(), max_running_req=4, num_page_override=256
    )
    tok = load_tokenizer(DEMO_MODEL)
    out = llm.generate(["The capital of France is", "Water boils at"], SamplingParams(max_tokens=3))
    llm.shutdown()
    print("overlap scheduling: every batch is launched before the previous one is processed")
    for e in events:
        print(f"  {e}")
    print(f"  -> {[tok.decode(o['token_ids']) for o in out]}\n")


def show_llm_generate() -> None:
    llm = make_llm(DEMO_MODEL)
    tok = load_tokenizer(DEMO_MODEL)
    prompts = ["The capital of France is", tok("def fibonacci(n):").input_ids]
    params = [
        SamplingParams(max_tokens=12),
        SamplingParams(temperature=0.7, top_p=0.9, max_tokens=12),
    ]
    for prompt, result in zip(prompts, llm.generate(prompts, params)):
        shown = prompt if isinstance(prompt, str) else f"token ids {prompt}"
        print(f"LLM.generate({shown!r}) -> {result['text']!r}")
    llm.shutdown()
    # the same greedy workload with overlap on and off, on a tiny model (it is quicker)
    cases = mixed_cases(ON_OFF_MODEL)[:12]
    texts = [c.prompt for c in cases]
    sp = [SamplingParams(max_tokens=c.max_new_tokens) for c in cases]
    tokens = []
    for disable in (False, True):
        ENV.DISABLE_OVERLAP_SCHEDULING.value = disable
        llm = make_llm(ON_OFF_MODEL)
        tokens.append([r["token_ids"] for r in llm.generate(texts, sp)])
        llm.cache_manager.check_integrity()
        llm.shutdown()
    ENV.DISABLE_OVERLAP_SCHEDULING.value = False
    same = tokens[0] == tokens[1]
    print(f"12 requests on {ON_OFF_MODEL}, overlap on and off: identical tokens: {same}\n")


def runs(name: str) -> int:
    """SmolLM2 is 30 layers deep, a step of it costs as much as ten of a tiny model: it runs
    the workload once, with pages of 16 tokens."""
    return 1 if name == SMOLLM2 else len(PAGE_SIZES)


def generate(name: str, cases: List[Case], run: int) -> List[List[int]]:
    """The tiny models run it twice: pages of 1 token, then of 16; SmolLM2 with pages of 16.
    Always with overlap, radix cache, a prefill budget of 64 tokens (the longest prompts take
    five chunks)."""
    page_size = PAGE_SIZES[-1] if name == SMOLLM2 else PAGE_SIZES[run]
    llm = make_llm(name, page_size=page_size, num_page_override=8192 // page_size)
    try:
        params = [SamplingParams(max_tokens=c.max_new_tokens) for c in cases]
        results = llm.generate([c.prompt for c in cases], params)
        llm.cache_manager.check_integrity()  # every page is free or cached
    finally:
        llm.shutdown()
    eos = eos_ids(name)
    return [with_eos(r["token_ids"], c.max_new_tokens, eos) for r, c in zip(results, cases)]


def main() -> int:
    show_overlap_timeline()
    show_llm_generate()
    cases = mixed_cases(DEMO_MODEL)
    lengths, news = [len(c.prompt) for c in cases], [c.max_new_tokens for c in cases]
    print(
        f"mixed workload: {len(cases)} prompts of {min(lengths)} to {max(lengths)} tokens, "
        f"{min(news)} to {max(news)} new tokens\n"
        f"runs: page size 1 and 16 on the tiny models, 16 on {SMOLLM2}"
    )
    return 0 if run_parity_cases(generate, mixed_cases, runs=runs).ok else 1


if __name__ == "__main__":
    sys.exit(main())
