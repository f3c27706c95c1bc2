"""Upstream's offline workload, and one timed run of it through `LLM.generate`.

Upstream's ``benchmark/offline/bench.py`` draws 256 requests from ``random.seed(0)``: for each,
a prompt of ``randint(100, 1024)`` random token ids below 10,000; then, for each, a number of
new tokens ``randint(100, 1024)``, sampled at temperature 0.6 with EOS ignored, so that every
request generates exactly that many tokens and two engines do the same work. Throughput is the
generated tokens divided by the wall time of one `generate` of all of them, after a warm-up.
`make_offline_workload` draws the same numbers in the same order (smaller sizes give the same
shape for a CPU); `run_offline` times the call and counts what the scheduler did.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, List

from minisgl.core import SamplingParams

if TYPE_CHECKING:
    from minisgl.llm import LLM


@dataclass(frozen=True)
class OfflineWorkload:
    prompts: List[List[int]]
    sampling_params: List[SamplingParams]

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def output_tokens(self) -> int:
        return sum(p.max_tokens for p in self.sampling_params)


def make_offline_workload(
    num_seqs: int = 256,
    max_input_len: int = 1024,
    max_output_len: int = 1024,
    *,
    min_input_len: int = 100,
    min_output_len: int = 100,
    vocab_size: int = 10000,
    temperature: float = 0.6,
    seed: int = 0,
) -> OfflineWorkload:
    """Upstream's requests with the defaults, drawn in upstream's order."""
    rng = random.Random(seed)  # the same numbers as random.seed(seed) and random.randint
    prompts = [
        [rng.randint(0, vocab_size) for _ in range(rng.randint(min_input_len, max_input_len))]
        for _ in range(num_seqs)
    ]
    params = [
        SamplingParams(
            temperature=temperature,
            ignore_eos=True,
            max_tokens=rng.randint(min_output_len, max_output_len),
        )
        for _ in range(num_seqs)
    ]
    return OfflineWorkload(prompts, params)


@dataclass(frozen=True)
class OfflineResult:
    seconds: float
    output_tokens: int
    prompt_tokens: int  # in the requests
    computed_prompt_tokens: int  # what prefill batches computed (less where a prefix was cached)
    prefill_batches: int
    decode_batches: int
    token_ids: List[List[int]]

    @property
    def throughput(self) -> float:
        """Generated tokens per second."""
        return self.output_tokens / self.seconds


def run_offline(
    llm: LLM,
    prompts: List[List[int]],
    sampling_params: List[SamplingParams],
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> OfflineResult:
    """One timed `llm.generate(prompts, sampling_params)`, counting the batches it ran. On a GPU
    the clock stops when `generate` returns: its results are on the host by then."""
    counts = {"computed": 0, "prefill": 0, "decode": 0}
    plain_forward = llm._forward

    def counting_forward(forward_input: Any) -> Any:
        batch = forward_input.batch
        if batch.is_prefill:
            counts["computed"] += sum(r.extend_len for r in batch.reqs)
            counts["prefill"] += 1
        else:
            counts["decode"] += 1
        return plain_forward(forward_input)

    llm._forward = counting_forward  # type: ignore[method-assign]
    try:
        begin = clock()
        outputs = llm.generate(prompts, sampling_params)
        seconds = clock() - begin
    finally:
        del llm._forward  # the class's method again
    errors = [o["error"] for o in outputs if o["error"]]
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed, the first: {errors[0]}")
    token_ids = [list(o["token_ids"]) for o in outputs]  # type: ignore[arg-type]
    return OfflineResult(
        seconds=seconds,
        output_tokens=sum(len(t) for t in token_ids),
        prompt_tokens=sum(len(p) for p in prompts),
        computed_prompt_tokens=counts["computed"],
        prefill_batches=counts["prefill"],
        decode_batches=counts["decode"],
        token_ids=token_ids,
    )
