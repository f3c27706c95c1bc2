"""An online benchmark client: requests streamed to an OpenAI-compatible server, timed as a
user sees them.

Each request is a streamed chat completion with EOS ignored, so it generates exactly the tokens
it asks for. The client notes when it sent the request and when each piece of text arrived;
`process_benchmark_results` turns those times into the serving metrics:

* TTFT, time to first token: from sending to the first piece (queueing and prefill);
* TPOT, time per output token: a request's decode time, (last - first) / (tokens - 1);
* ITL, inter-token latency: the gaps between consecutive pieces, every request pooled;
* E2E: from sending to the last piece; and the throughput over the whole run.

Requests go all at once (`benchmark_one_batch`, a closed batch like upstream's
``bench_simple.py``) or at given times (`benchmark_trace`, for example a Poisson process from
`make_poisson_trace`).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence

from openai import AsyncOpenAI

from minisgl.utils import init_logger

logger = init_logger(__name__)


@dataclass(frozen=True)
class BenchmarkTrace:
    timestamp: float  # seconds after the start of the run
    message: str
    output_length: int  # new tokens
    input_length: int | None = None  # prompt tokens, where known


@dataclass(frozen=True)
class RawResult:
    """One request as its client saw it: tics[0] when it was sent, then one time per piece of
    text received; `tokens` is the server's count of completion tokens (its usage chunk)."""

    input_len: int | None
    output_len: int
    message: str
    tics: List[float]
    tokens: int


@dataclass(frozen=True)
class Stats:
    """avg, p50, p90, p99 and max of one metric (nearest-rank percentiles)."""

    avg: float
    p50: float
    p90: float
    p99: float
    max: float

    @staticmethod
    def of(values: Sequence[float]) -> Stats:
        if not values:
            raise ValueError("no values to summarise")
        ordered = sorted(values)

        def rank(p: float) -> float:
            return ordered[min(len(ordered) - 1, int(p * len(ordered)))]

        return Stats(sum(ordered) / len(ordered), rank(0.5), rank(0.9), rank(0.99), ordered[-1])


@dataclass(frozen=True)
class BenchmarkResult:
    num_requests: int
    num_tokens: int  # generated, all requests
    duration: float  # seconds, first request sent to last piece received
    ttft: Stats  # seconds
    tpot: Stats  # seconds
    itl: Stats  # seconds
    e2e: Stats  # seconds

    @property
    def token_throughput(self) -> float:
        return self.num_tokens / self.duration

    @property
    def request_throughput(self) -> float:
        return self.num_requests / self.duration

    def report(self) -> List[str]:
        def ms(stats: Stats) -> str:
            avg, p50, p90, p99, most = (v * 1e3 for v in (stats.avg, stats.p50, stats.p90,
                                                         stats.p99, stats.max))  # fmt: skip
            return f"{avg:.1f} ms (p50 {p50:.1f}, p90 {p90:.1f}, p99 {p99:.1f}, max {most:.1f})"

        return [
            f"requests {self.num_requests}, generated tokens {self.num_tokens}",
            f"TTFT {ms(self.ttft)}",
            f"TPOT {ms(self.tpot)}",
            f"ITL  {ms(self.itl)}",
            f"E2E  {ms(self.e2e)}",
            f"duration {self.duration:.2f} s, {self.token_throughput:.1f} tokens/s, "
            f"{self.request_throughput:.2f} requests/s",
        ]


def generate_prompt(tokenizer: Any, n: int, rng: random.Random | None = None) -> str:
    """A text of exactly `n` tokens under `tokenizer`, from random ids in the lower half of its
    vocabulary. Decoding ids and encoding the text again need not give the same ids, so the
    text is decoded, re-encoded and trimmed or extended until the count holds."""
    rng = rng or random.Random()
    high = tokenizer.vocab_size // 2
    ids = [rng.randint(0, high) for _ in range(n)]
    for _ in range(64):
        text = tokenizer.decode(ids)
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) == n:
            return text
        ids = ids[:n] + [rng.randint(0, high) for _ in range(n - len(ids))]
    raise ValueError(f"no text of exactly {n} tokens found in 64 tries")


async def get_model_name(client: AsyncOpenAI) -> str:
    """The first model the server lists (ours serves one)."""
    async for model in client.models.list():
        return model.id
    raise RuntimeError("the server lists no model")


async def benchmark_one(
    client: AsyncOpenAI,
    prompt: str,
    output_length: int,
    model: str,
    *,
    extra_body: Dict[str, Any] | None = None,
    input_length: int | None = None,
) -> RawResult:
    """One streamed chat request of `output_length` new tokens, greedy, EOS ignored."""
    body: Dict[str, Any] = {"ignore_eos": True, "top_k": 1, **(extra_body or {})}
    sent = time.perf_counter()
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=output_length,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=body,
    )
    tics, tokens = [sent], 0
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            tics.append(time.perf_counter())
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return RawResult(input_length, output_length, prompt, tics, tokens)


async def benchmark_one_batch(
    client: AsyncOpenAI,
    prompts: List[str],
    output_lengths: List[int] | int,
    model: str,
    *,
    extra_body: Dict[str, Any] | None = None,
    input_lengths: List[int | None] | None = None,
) -> List[RawResult]:
    """Every prompt sent at once; the results in the prompts' order."""
    if isinstance(output_lengths, int):
        output_lengths = [output_lengths] * len(prompts)
    lengths = input_lengths or [None] * len(prompts)
    return list(
        await asyncio.gather(
            *(
                benchmark_one(client, p, n, model, extra_body=extra_body, input_length=i)
                for p, n, i in zip(prompts, output_lengths, lengths, strict=True)
            )
        )
    )


async def benchmark_trace(
    client: AsyncOpenAI, msgs: List[BenchmarkTrace], model: str
) -> List[RawResult]:
    """Each message sent at its timestamp (seconds after the first one's)."""
    start = time.perf_counter()
    first = min(m.timestamp for m in msgs)

    async def at_its_time(msg: BenchmarkTrace) -> RawResult:
        await asyncio.sleep(max(0.0, start + msg.timestamp - first - time.perf_counter()))
        return await benchmark_one(
            client, msg.message, msg.output_length, model, input_length=msg.input_length
        )

    return list(await asyncio.gather(*(at_its_time(m) for m in msgs)))


def make_poisson_trace(
    prompts: List[str], output_lengths: List[int], rate: float, seed: int = 0
) -> List[BenchmarkTrace]:
    """Arrivals at `rate` requests per second with exponential gaps (a Poisson process)."""
    rng = random.Random(seed)
    traces, at = [], 0.0
    for prompt, n in zip(prompts, output_lengths, strict=True):
        traces.append(BenchmarkTrace(timestamp=at, message=prompt, output_length=n))
        at += rng.expovariate(rate)
    return traces


def scale_traces(traces: List[BenchmarkTrace], scale: float) -> List[BenchmarkTrace]:
    """The same requests with their gaps multiplied by `scale`, sorted by time, from 0."""
    first = min(t.timestamp for t in traces)
    scaled = [
        BenchmarkTrace((t.timestamp - first) * scale, t.message, t.output_length, t.input_length)
        for t in traces
    ]
    return sorted(scaled, key=lambda t: t.timestamp)


def process_benchmark_results(raw_data: List[RawResult]) -> BenchmarkResult:
    """The metrics of a run. A request that got fewer tokens than it asked for, or no text,
    is an error: its times would flatter the server."""
    for r in raw_data:
        if r.tokens != r.output_len or len(r.tics) < 2:
            raise RuntimeError(
                f"a request asked for {r.output_len} tokens and got {r.tokens} "
                f"in {len(r.tics) - 1} pieces"
            )
    ttft = [r.tics[1] - r.tics[0] for r in raw_data]
    tpot = [(r.tics[-1] - r.tics[1]) / (r.tokens - 1) for r in raw_data if r.tokens > 1]
    itl = [b - a for r in raw_data for a, b in zip(r.tics[1:], r.tics[2:])]
    e2e = [r.tics[-1] - r.tics[0] for r in raw_data]
    duration = max(r.tics[-1] for r in raw_data) - min(r.tics[0] for r in raw_data)
    result = BenchmarkResult(
        num_requests=len(raw_data),
        num_tokens=sum(r.tokens for r in raw_data),
        duration=duration,
        ttft=Stats.of(ttft),
        tpot=Stats.of(tpot or [0.0]),
        itl=Stats.of(itl or [0.0]),
        e2e=Stats.of(e2e),
    )
    for line in result.report():
        logger.info(line)
    return result
