"""Upstream's simple online benchmark (benchmark/online/bench_simple.py): a closed batch of
streamed chat requests to a running server, on this package's client.

    python -m minisgl --model ~/.cache/minisgl-book/models/smollm2-135m --port 1919 &
    python benchmark/online/bench_simple.py --port 1919 --max-input 512 --max-output 64

Upstream's shape: random.seed(42), 64 requests, each a text of a random number of tokens (1 to
8,192 by default) made of random ids of the served model's tokenizer, and 16 to 1,024 new
tokens each (greedy, EOS ignored); one request of 100 tokens first, to test the connection.
It prints the serving metrics (minisgl.benchmark.client.process_benchmark_results).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("LOG_LEVEL", "WARNING")  # the report is printed once, below

from openai import AsyncOpenAI  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from minisgl.benchmark.client import (  # noqa: E402
    benchmark_one,
    benchmark_one_batch,
    generate_prompt,
    get_model_name,
    process_benchmark_results,
)


async def run(port: int, num_requests: int, max_input: int, max_output: int) -> int:
    rng = random.Random(42)
    async with AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                           max_retries=0, timeout=3600) as client:  # fmt: skip
        model = await get_model_name(client)
        tokenizer = AutoTokenizer.from_pretrained(model)
        test = await benchmark_one(client, generate_prompt(tokenizer, 100, rng), 2, model)
        if test.tokens != 2:
            print(f"the test request got {test.tokens} tokens, not 2", file=sys.stderr)
            return 1
        prompts = [generate_prompt(tokenizer, rng.randint(1, max_input), rng)
                   for _ in range(num_requests)]  # fmt: skip
        lengths = [rng.randint(min(16, max_output), max_output) for _ in range(num_requests)]
        result = process_benchmark_results(
            await benchmark_one_batch(client, prompts, lengths, model)
        )
    for line in result.report():
        print(line)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=1919)
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--max-input", type=int, default=8192)
    parser.add_argument("--max-output", type=int, default=1024)
    args = parser.parse_args()
    return asyncio.run(run(args.port, args.num_requests, args.max_input, args.max_output))


if __name__ == "__main__":
    sys.exit(main())
