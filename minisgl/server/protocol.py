"""The shapes of the HTTP API: OpenAI's chat and text completions, upstream's /generate, and
the errors. A request that cannot be served is refused with a 400 and a message that names
the field, in OpenAI's error shape, which the official client raises as BadRequestError."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Literal

from pydantic import BaseModel, ConfigDict, Field

from minisgl.core import SamplingParams


class RequestError(Exception):
    """A request that cannot be served: answered with `status` and OpenAI's error body."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.status = message, param, status

    def body(self) -> Dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": None}}


class Message(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str


class StreamOptions(BaseModel):
    include_usage: bool = False


# fields of OpenAI's API that this server does not implement: a request that sets one to
# anything but its neutral value is refused, rather than silently served without it
UNSUPPORTED = {
    "n": 1,
    "seed": None,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "logprobs": None,
    "top_logprobs": None,
    "logit_bias": None,
    "best_of": None,
    "echo": False,
    "suffix": None,
    "tools": None,
    "tool_choice": None,
    "response_format": None,
}
IGNORED = {"user", "stream_options", "parallel_tool_calls", "metadata", "store"}  # harmless


class CompletionParams(BaseModel):
    """What chat and text completions share."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None  # the newer name of max_tokens
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: str | List[str] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None

    def check_fields(self) -> None:
        for name, value in (self.model_extra or {}).items():
            if name in UNSUPPORTED and value != UNSUPPORTED[name]:
                raise RequestError(f"'{name}' is not supported by this server", param=name)
            if name not in UNSUPPORTED and name not in IGNORED:
                raise RequestError(f"unknown field '{name}'", param=name)

    def stop_strings(self) -> List[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not s for s in stops):
            raise RequestError("a stop string may not be empty", param="stop")
        return stops

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        """The scheduler's SamplingParams; a value out of range is refused with its field."""
        max_tokens = self.max_completion_tokens or self.max_tokens
        try:
            return SamplingParams(
                temperature=self.temperature,
                top_k=self.top_k,
                top_p=self.top_p,
                ignore_eos=self.ignore_eos,
                max_tokens=default_max_tokens if max_tokens is None else max_tokens,
            )
        except ValueError as error:
            param = str(error).split(" ", 1)[0]
            raise RequestError(str(error), param=param) from None


class ChatCompletionRequest(CompletionParams):
    messages: List[Message]


class CompletionRequest(CompletionParams):
    prompt: str


class GenerateRequest(BaseModel):
    """Upstream's /generate: a prompt, plain text back as server-sent events."""

    prompt: str
    max_tokens: int
    ignore_eos: bool = False


# --------------------------------------------------------------------------------- answers
def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> Dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chat_answer(rid: str, model: str, text: str, finish: str, counts: Dict[str, int]) -> Dict:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": now(),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
                "logprobs": None,
            }
        ],
        "usage": counts,
    }


def chat_chunk(rid: str, model: str, delta: Dict[str, str], finish: str | None) -> Dict:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": now(),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }


def text_answer(rid: str, model: str, text: str, finish: str | None, counts: Dict | None) -> Dict:
    answer: Dict[str, Any] = {
        "id": rid,
        "object": "text_completion",
        "created": now(),
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
    }
    if counts is not None:
        answer["usage"] = counts
    return answer


def usage_chunk(rid: str, model: str, kind: str, counts: Dict[str, int]) -> Dict:
    """The last chunk of a stream that asked for usage: no choices, only the counts."""
    return {
        "id": rid,
        "object": kind,
        "created": now(),
        "model": model,
        "choices": [],
        "usage": counts,
    }


class ModelCard(BaseModel):
    id: str
    object: str = "model"
    created: int = Field(default_factory=now)
    owned_by: str = "mini-sglang"
    root: str
