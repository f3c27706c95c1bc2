"""LLM: the engine as a Python object. `generate` takes prompts, runs the scheduler until every
one of them is done, and returns their texts and token ids."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import torch

from minisgl.core import SamplingParams
from minisgl.distributed import DistributedInfo
from minisgl.message import BaseBackendMsg, DetokenizeMsg, UserMsg
from minisgl.scheduler import Scheduler, SchedulerConfig


class RequestAllFinished(Exception):
    """Raised from inside the scheduler's loop to leave it: nothing is left to do."""


@dataclass
class RequestStatus:
    uid: int
    input_ids: List[int]
    output_ids: List[int] = field(default_factory=list)
    finished: bool = False
    error: str | None = None  # why the engine could not finish it
    ignore_eos: bool = False  # an EOS is then a token like any other, kept in the output


class LLM(Scheduler):
    """The engine in this process. It holds the process's global engine state until
    `shutdown()`: use it as `with LLM(...) as llm:`, or call shutdown() before making another."""

    def __init__(self, model_path: str, dtype: torch.dtype = torch.bfloat16, **kwargs) -> None:
        config = SchedulerConfig(
            model_path=model_path,
            tp_info=DistributedInfo(0, 1),
            dtype=dtype,
            offline_mode=True,
            **kwargs,
        )
        super().__init__(config)
        self.pending_requests: List[Tuple[List[int] | str, SamplingParams]] = []
        self.status_map: Dict[int, RequestStatus] = {}
        self.counter = 0

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _tokenize_one(self, prompt: List[int] | str) -> torch.Tensor:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, return_tensors="pt").view(-1).to(torch.int32)
        return torch.tensor(prompt, dtype=torch.int32, device="cpu")

    def offline_receive_msg(self, blocking: bool = False) -> List[BaseBackendMsg]:
        """Hand the scheduler the next pending prompts, about one prefill budget's worth."""
        if blocking and not self.pending_requests:
            raise RequestAllFinished()
        messages: List[BaseBackendMsg] = []
        taken, tokens = 0, 0
        for prompt, sampling_params in self.pending_requests:
            if tokens >= self.prefill_budget:
                break
            input_ids = self._tokenize_one(prompt)
            tokens += len(input_ids)
            uid = self.counter + taken
            taken += 1
            messages.append(UserMsg(uid=uid, input_ids=input_ids, sampling_params=sampling_params))
            self.status_map[uid] = RequestStatus(
                uid=uid, input_ids=input_ids.tolist(), ignore_eos=sampling_params.ignore_eos
            )
        self.counter += taken
        self.pending_requests = self.pending_requests[taken:]
        return messages

    def offline_send_result(self, reply: List[DetokenizeMsg]) -> None:
        for msg in reply:
            status = self.status_map[msg.uid]
            assert not status.finished, f"request {msg.uid} got a token after it finished"
            status.error = msg.error
            # a reply of -1 carries no token (a refusal, max_tokens=0). A final EOS is not
            # output, unless the request ignores EOS: its last token may be an EOS by chance
            # (chapter 21's benchmark counted 1535 of 1536 tokens before this was fixed)
            stopped_by_eos = msg.finished and msg.next_token == self.eos_token_id
            if msg.next_token >= 0 and not (stopped_by_eos and not status.ignore_eos):
                status.output_ids.append(msg.next_token)
            status.finished = msg.finished

    def generate(
        self,
        prompts: List[str] | List[List[int]],
        sampling_params: List[SamplingParams] | SamplingParams,
    ) -> List[Dict[str, str | List[int] | None]]:
        """One result per prompt, in order: {"text": ..., "token_ids": [...], "error": None}.

        A prompt this engine cannot serve raises ValueError before anything runs, naming
        every such prompt and why. A request that the engine fails on while running (see
        SchedulerGuardMixin) comes back with its error in "error" and what it had generated."""
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(sampling_params)} sampling params")
        refusals = []
        for i, (prompt, params) in enumerate(zip(prompts, sampling_params)):
            if not isinstance(params, SamplingParams):
                refusals.append(f"prompt {i}: its sampling params are a {type(params).__name__}")
            elif (reason := self.check_request(self._tokenize_one(prompt))) is not None:
                refusals.append(f"prompt {i}: {reason}")
        if refusals:
            raise ValueError("; ".join(refusals))
        self.pending_requests = list(zip(prompts, sampling_params))
        self.status_map = {}
        self.counter = 0
        try:
            self.run_forever()
        except RequestAllFinished:
            pass
        results: List[Dict[str, str | List[int] | None]] = []
        for uid in range(len(prompts)):
            status = self.status_map[uid]
            assert status.finished, f"request {uid} did not finish"
            text = self.tokenizer.decode(status.output_ids)
            results.append({"text": text, "token_ids": status.output_ids, "error": status.error})
        return results
