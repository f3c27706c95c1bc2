"""Online serving on this machine: `python -m minisgl` under load, measured the way a client
sees it (time to first token, time between tokens, end to end, throughput).

    python tools/bench_online.py             # writes docs/data/ch15-online-bench.md
    python tools/bench_online.py --url http://127.0.0.1:1919 --print   # a server you started

The workload: 32 chat requests for SmolLM2-135M-Instruct in float32, each a question of its
own under no shared prefix, with prompts of seeded random lengths and exactly 64 new tokens
each (EOS ignored, so every run does the same work), streamed through the official `openai`
client. The requests arrive all at once, or one after another at a rate (exponential gaps,
seeded: a Poisson process). A run is a measurement, not a test: the server and the client
share this machine's cores, and on a busy machine the numbers vary by 20% or more.
Upstream's client (python/minisgl/benchmark/client.py) is the model; chapter 21 brings it
into the package.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import platform
import random
import statistics
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import openai  # noqa: E402

from examples.helpers.server_process import ServerProcess  # noqa: E402
from tools.models import SMOLLM2, ensure_model  # noqa: E402

OUT = ROOT / "docs" / "data" / "ch15-online-bench.md"
NUM_REQUESTS = 32
NEW_TOKENS = 64
WORDS = ("river stone cloud lamp garden winter paper music engine forest window harbour "
         "letter mountain bridge candle market silver").split()  # fmt: skip


@dataclass
class Timing:
    """One request as its client saw it: when it was sent, when each chunk came."""

    sent: float
    chunks: List[float] = field(default_factory=list)
    tokens: int = 0  # completion tokens, from the usage chunk


def workload(num_requests: int, seed: int, run: int = 0) -> List[str]:
    """Questions of 20 to 200 words, different from their first words on, so that the prefix
    cache has nothing to reuse but the chat template: not between the requests of a run, nor
    between two runs (the same words, under another run number)."""
    rng = random.Random(seed)
    questions = []
    for i in range(num_requests):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 200)))
        questions.append(f"Run {run}, request {i}: write a story with these words: {words}")
    return questions


async def one_request(client: openai.AsyncOpenAI, question: str, delay: float) -> Timing:
    await asyncio.sleep(delay)
    timing = Timing(sent=time.perf_counter())
    stream = await client.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": question}],
        max_tokens=NEW_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            timing.chunks.append(time.perf_counter())
        if chunk.usage is not None:
            timing.tokens = chunk.usage.completion_tokens
    return timing


async def run(url: str, questions: Sequence[str], rate: float, seed: int) -> List[Timing]:
    """Every question, sent at `rate` requests per second (0: all at once)."""
    rng = random.Random(seed)
    delays, at = [], 0.0
    for _ in questions:
        delays.append(at)
        at += rng.expovariate(rate) if rate > 0 else 0.0
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0,
                                timeout=600)  # fmt: skip
    try:
        return await asyncio.gather(*(one_request(client, q, d) for q, d in zip(questions, delays)))
    finally:
        await client.close()


def percentiles(values: Sequence[float]) -> List[float]:
    """p50, p90, p99 (nearest rank)."""
    ordered = sorted(values)
    return [ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] for p in (50, 90, 99)]


def duration(timings: List[Timing]) -> float:
    """From the first request sent to the last chunk received."""
    return max(t.chunks[-1] for t in timings) - min(t.sent for t in timings)


def summarize(label: str, timings: List[Timing]) -> str:
    for t in timings:
        if t.tokens != NEW_TOKENS:
            raise RuntimeError(f"a request got {t.tokens} tokens, not {NEW_TOKENS}")
    ttft = [(t.chunks[0] - t.sent) * 1000 for t in timings]
    tbt = [(b - a) * 1000 for t in timings for a, b in zip(t.chunks, t.chunks[1:])]
    e2e = [t.chunks[-1] - t.sent for t in timings]
    seconds = duration(timings)
    tokens = sum(t.tokens for t in timings)

    def cells(values: Sequence[float], digits: int) -> str:
        return " | ".join(f"{v:.{digits}f}" for v in percentiles(values))

    return (f"| {label} | {cells(ttft, 0)} | {cells(tbt, 0)} | {statistics.mean(tbt):.0f} | "
            f"{cells(e2e, 1)} | {seconds:.1f} | {tokens / seconds:.1f} | "
            f"{len(timings) / seconds:.2f} |")  # fmt: skip


def offline_row(path: str, runs: Sequence[Sequence[str]]) -> str:
    """The same prompts through LLM.generate in this process, with the server's settings: what
    the engine does without HTTP, sockets and the other processes."""
    import torch
    from transformers import AutoTokenizer

    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    tok = AutoTokenizer.from_pretrained(path)
    with LLM(path, dtype=torch.float32, num_page_override=8192) as llm:
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))  # warm-up
        params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
        seconds = float("inf")
        for questions in runs:
            prompts = [tok(chat_text(tok, q)).input_ids for q in questions]
            begin = time.perf_counter()
            tokens = sum(len(r["token_ids"]) for r in llm.generate(prompts, params))
            seconds = min(seconds, time.perf_counter() - begin)
    dashes = " | ".join(["-"] * 10)
    return (f"| offline: `LLM.generate`, all at once | {dashes} | {seconds:.1f} | "
            f"{tokens / seconds:.1f} | {len(prompts) / seconds:.2f} |")  # fmt: skip


def chat_text(tok, question: str) -> str:  # noqa: ANN001 (a transformers tokenizer)
    chat = [{"role": "user", "content": question}]
    return tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)


HEADER = [
    "| arrivals | TTFT p50 (ms) | p90 | p99 | between tokens p50 (ms) | p90 | p99 | mean | "
    "end to end p50 (s) | p90 | p99 | seconds | generated tokens/s | requests/s |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
    "| ---: |",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server (default: start one on SmolLM2)")
    parser.add_argument("--rates", type=float, nargs="+", default=[0.0, 2.0, 0.5],
                        help="request rates per second to measure; 0 is all at once")  # fmt: skip
    parser.add_argument("--num-requests", type=int, default=NUM_REQUESTS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=2,
                        help="runs of each row; the table shows the shortest")  # fmt: skip
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--print", action="store_true", help="print the table, write nothing")
    args = parser.parse_args()
    os.environ.setdefault("LOG_LEVEL", "WARNING")  # LLM.generate's start-up log
    questions = workload(args.num_requests, args.seed)
    fresh = (workload(args.num_requests, args.seed, run=r) for r in itertools.count(1))
    server = None if args.url else ServerProcess(ensure_model(SMOLLM2), "--num-pages", "8192")
    rows = []
    with server or nullcontext():
        url = args.url or server.url  # type: ignore[union-attr]
        warm_up = workload(2, args.seed, run=-1)
        asyncio.run(run(url, warm_up, 0.0, args.seed))
        for rate in args.rates:
            label = "all at once" if rate == 0 else f"{rate:g} per second"
            runs = [asyncio.run(run(url, next(fresh), rate, args.seed)) for _ in range(args.repeat)]
            rows.append(summarize(label, min(runs, key=duration)))
            print(rows[-1], file=sys.stderr)
    import torch
    from transformers import AutoTokenizer

    path = str(ensure_model(SMOLLM2))
    if not args.url:
        rows.append(offline_row(path, [next(fresh) for _ in range(args.repeat)]))
        print(rows[-1], file=sys.stderr)
    tok = AutoTokenizer.from_pretrained(path)
    lengths = [len(tok(chat_text(tok, q)).input_ids) for q in questions]
    served = f"the server at {args.url}" if args.url else "SmolLM2-135M-Instruct, float32"
    lines = [
        f"{served}, CPU ({platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, torch {torch.__version__}), server and client on the same "
        f"machine; {args.num_requests} streamed chat requests, prompts of {min(lengths)} to "
        f"{max(lengths)} tokens, {NEW_TOKENS} new tokens each (EOS ignored). Regenerate with "
        "`python tools/bench_online.py`.",
        "",
        *HEADER,
        *rows,
    ]
    text = "\n".join(lines) + "\n"
    if args.print:
        print(text)
    else:
        args.out.write_text(text)
        print(f"wrote {args.out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
