"""Chapter 15: the server. `python -m minisgl` starts the scheduler, the tokenizer worker and
the API server; this main talks to it over HTTP, as any client would, with the official
`openai` package.

One server per model, each on a free port. On SmolLM2 it shows one answer, the same answer
streamed, the refusals of requests the server cannot serve, and what /metrics counts. On every
model the answers must be transformers' greedy text, with as many tokens.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import List, Tuple

import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.helpers.server_process import ServerProcess  # noqa: E402
from tools.models import DEMO_MODEL, PARITY_MODELS, ensure_model  # noqa: E402
from tools.parity import (  # noqa: E402
    DEFAULT_TEXTS,
    Summary,
    build_prompts,
    hf_references,
    load_tokenizer,
)

NEW_TOKENS = 32
# a small KV cache (it starts faster on a CPU), and float32 on a GPU too (bf16 is its default)
SERVER_FLAGS = ("--num-pages", "4096", "--dtype", "float32")


def start(name: str) -> ServerProcess:
    return ServerProcess(ensure_model(name), *SERVER_FLAGS)


def show_one_answer(server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    answer = client.chat.completions.create(
        model="any",
        messages=question,
        max_tokens=24,
        temperature=0,  # type: ignore[arg-type]
    )
    choice = answer.choices[0]
    print(f"POST /v1/chat/completions, {question[0]['content']!r}, max_tokens=24, greedy:")
    print(f"  answer        {choice.message.content!r}")
    counts = answer.usage.model_dump(exclude_none=True)  # type: ignore[union-attr]
    print(f"  finish_reason {choice.finish_reason!r}, usage {counts}")
    stream = client.chat.completions.create(
        model="any", messages=question, max_tokens=24, temperature=0, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    same_text, same_usage = streamed == choice.message.content, chunks[-1].usage == answer.usage
    print(f"the same request with stream=true: {len(chunks)} chunks, the same text: "
          f"{same_text}, the same usage: {same_usage}\n")  # fmt: skip


BAD_REQUESTS: List[Tuple[str, str, object]] = [
    ("not JSON", "/v1/completions", "{prompt: hi"),
    ("no prompt", "/v1/completions", {"max_tokens": 4}),
    ("a prompt of the wrong type", "/v1/completions", {"prompt": 42}),
    ("an unknown role", "/v1/chat/completions",
     {"messages": [{"role": "robot", "content": "hi"}]}),
    ("no messages", "/v1/chat/completions", {"messages": []}),
    ("max_tokens=-1", "/v1/completions", {"prompt": "hi", "max_tokens": -1}),
    ("temperature=-0.5", "/v1/completions", {"prompt": "hi", "temperature": -0.5}),
    ("n=2", "/v1/completions", {"prompt": "hi", "n": 2}),
    ("a field OpenAI does not have", "/v1/completions", {"prompt": "hi", "colour": "red"}),
    ("more tokens than the context", "/v1/completions", {"prompt": "hi", "max_tokens": 9000}),
    ("a prompt longer than the context", "/v1/completions", {"prompt": "hello " * 9000}),
]  # fmt: skip


def show_refusals(server: ServerProcess) -> None:
    print("requests the server cannot serve:")
    for what, path, body in BAD_REQUESTS:
        status, text = server.post(path, body)  # type: ignore[arg-type]
        message = openai_error(text)
        print(f"  {what:34s} {status} {message}")
    status, text = server.post("/v1/completions", {"prompt": "The capital of France is",
                                                   "max_tokens": 4, "temperature": 0})  # fmt: skip
    print(f"and then a good one: {status}, {json.loads(text)['choices'][0]['text']!r}")


def openai_error(text: str) -> str:
    return json.loads(text)["error"]["message"]


def show_metrics(server: ServerProcess) -> None:
    shown = ["minisgl_requests_total", "minisgl_requests_running", "minisgl_requests_waiting",
             "minisgl_kv_pages_used", "minisgl_time_to_first_token_seconds_count",
             "minisgl_generation_tokens_total", "minisgl_request_slots_free",
             "minisgl_idle_integrity_verified"]  # fmt: skip
    values = server.metrics_when_idle()
    print("GET /metrics once every request has finished, some of its lines:")
    for name in shown:
        print(f"  {name:42s} {values[name]:g}")
    print()


async def ask_all(server: ServerProcess, name: str) -> List[Tuple[str, str, int, bool]]:
    """Every prompt at once, each as a plain and as a streamed request: (endpoint, text,
    completion tokens, the stream gave the same text and count)."""
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    common = dict(model=name, max_tokens=NEW_TOKENS, temperature=0)

    async def one(text: str, chat: bool, stream: bool) -> Tuple[str, int]:
        if chat:
            messages = [{"role": "user", "content": text}]
            if not stream:
                a = await client.chat.completions.create(messages=messages, **common)  # type: ignore[call-overload]
                return a.choices[0].message.content, a.usage.completion_tokens
            s = await client.chat.completions.create(messages=messages, stream=True,
                stream_options={"include_usage": True}, **common)  # type: ignore[call-overload]  # fmt: skip
            chunks = [c async for c in s]
            pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
            return "".join(pieces), chunks[-1].usage.completion_tokens
        if not stream:
            a = await client.completions.create(prompt=text, **common)  # type: ignore[call-overload]
            return a.choices[0].text, a.usage.completion_tokens
        s = await client.completions.create(prompt=text, stream=True,
            stream_options={"include_usage": True}, **common)  # type: ignore[call-overload]  # fmt: skip
        chunks = [c async for c in s]
        return "".join(c.choices[0].text for c in chunks if c.choices), chunks[
            -1
        ].usage.completion_tokens

    chats = [i == len(DEFAULT_TEXTS) - 1 for i in range(len(DEFAULT_TEXTS))]  # as build_prompts
    jobs = [
        one(t, chat, stream) for t, chat in zip(DEFAULT_TEXTS, chats) for stream in (False, True)
    ]
    answers = await asyncio.gather(*jobs)
    await client.close()
    rows = []
    for i, chat in enumerate(chats):
        (text, count), streamed = answers[2 * i], answers[2 * i + 1]
        rows.append(("chat" if chat else "completions", text, count, streamed == (text, count)))
    return rows


def parity(demo_rows: List[Tuple[str, str, int, bool]]) -> Summary:
    summary = Summary(models=len(PARITY_MODELS), prompts=len(DEFAULT_TEXTS))
    print("every prompt at once, plain and streamed, against transformers' greedy text:")
    print(f"{'model':14s} {'prompt':28s} {'endpoint':11s} {'tokens':>6s} {'text':>5s} "
          f"{'stream':>6s} {'margin':>7s}")  # fmt: skip
    for name in PARITY_MODELS:
        if name == DEMO_MODEL:
            rows = demo_rows
        else:
            with start(name) as server:
                rows = asyncio.run(ask_all(server, name))
        tok = load_tokenizer(name)
        refs = hf_references(name, build_prompts(name), NEW_TOKENS)
        for text, (endpoint, ours, count, same_stream), ref in zip(DEFAULT_TEXTS, rows, refs):
            expected = tok.decode(ref.tokens, skip_special_tokens=True)
            ok = ours == expected and count == len(ref.tokens)
            summary.total += len(ref.tokens)
            summary.matched += len(ref.tokens) if ok else 0
            summary.margin = min(summary.margin, *ref.margins)
            if not (ok and same_stream):
                summary.failures.append(f"{name} {text!r}")
            print(f"{name:14s} {text[:26]!r:28s} {endpoint:11s} {count:6d} "
                  f"{'yes' if ok else 'NO':>5s} {'same' if same_stream else 'DIFF':>6s} "
                  f"{min(ref.margins):7.4f}")  # fmt: skip
            if not ok:
                print(f"  ours         {ours!r} ({count} tokens)\n"
                      f"  transformers {expected!r} ({len(ref.tokens)} tokens)")  # fmt: skip
    print(summary.line())
    return summary


def main() -> int:
    os.environ.setdefault("LOG_LEVEL", "WARNING")  # the servers' logs go to their log files
    print(
        f"python -m minisgl --model <{DEMO_MODEL}> --port <a free port> {' '.join(SERVER_FLAGS)}\n"
    )
    with start(DEMO_MODEL) as server:
        show_one_answer(server)
        show_refusals(server)
        print()
        demo_rows = asyncio.run(ask_all(server, DEMO_MODEL))
        show_metrics(server)
    return 0 if parity(demo_rows).ok else 1


if __name__ == "__main__":
    sys.exit(main())
