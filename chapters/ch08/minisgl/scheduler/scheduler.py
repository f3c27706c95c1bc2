"""The scheduler: decides what runs next, prepares it, runs it on the engine, handles results.

One turn of the loop:

    receive messages      new requests join the waiting list, aborts are carried out
    schedule a batch      a prefill batch of waiting requests if any can be admitted,
                          else a decode batch of every running request
    prepare it            pages for the new tokens, positions, where inputs come from and
                          where outputs go, the attention metadata, the sampling arguments
    run it                the engine's forward pass and sampling
    process the results   append each new token, reply, free what finished requests held

Requests join and leave between any two steps (continuous batching).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, List, NamedTuple, Tuple, TypeAlias

import torch

from minisgl.core import Batch, Req
from minisgl.message import (
    AbortBackendMsg,
    BaseBackendMsg,
    BatchBackendMsg,
    DetokenizeMsg,
    ExitMsg,
    UserMsg,
)
from minisgl.utils import device as dev
from minisgl.utils import init_logger, load_tokenizer

from .cache import CacheManager
from .config import SchedulerConfig
from .decode import DecodeManager
from .prefill import PrefillManager
from .table import TableManager

if TYPE_CHECKING:
    from minisgl.engine import BatchSamplingArgs, ForwardOutput

logger = init_logger(__name__)

Indice2D: TypeAlias = Tuple[torch.Tensor, torch.Tensor]


class ForwardInput(NamedTuple):
    batch: Batch
    sample_args: BatchSamplingArgs
    input_tuple: Indice2D  # (request slots, positions): where the input ids are read
    write_tuple: Indice2D  # (request slots, positions or -1): where the new tokens go


ForwardData: TypeAlias = "Tuple[ForwardInput, ForwardOutput]"


class Scheduler:
    def __init__(self, config: SchedulerConfig) -> None:
        from minisgl.engine import Engine

        self.engine = Engine(config)
        self.device = self.engine.device
        self.table_manager = TableManager(config.max_running_req, self.engine.page_table)
        self.cache_manager = CacheManager(
            self.engine.num_pages, config.page_size, self.engine.page_table, config.cache_type
        )
        self.decode_manager = DecodeManager(config.page_size)
        self.prefill_manager = PrefillManager(
            self.cache_manager, self.table_manager, self.decode_manager
        )
        self.tokenizer = load_tokenizer(config.model_path)
        self.eos_token_id = self.tokenizer.eos_token_id
        self.vocab_size = config.model_config.vocab_size
        self.token_pool = self.table_manager.token_pool
        self.prefill_budget = config.max_extend_tokens
        # where messages come from and where replies go: a subclass's offline methods here
        # (chapter 14 adds sockets)
        self.receive_msg = self.offline_receive_msg
        self.send_result = self.offline_send_result

    def offline_receive_msg(self, blocking: bool = False) -> List[BaseBackendMsg]:
        raise NotImplementedError("a driver of the scheduler provides its messages")

    def offline_send_result(self, reply: List[DetokenizeMsg]) -> None:
        raise NotImplementedError("a driver of the scheduler takes its results")

    def run_when_idle(self) -> None:
        """Called when nothing is runnable, before waiting for the next message: a good time
        to prove that every page is free or cached."""
        logger.info_rank0("scheduler idle, waiting for requests")
        self.cache_manager.check_integrity()

    def normal_loop(self) -> None:
        blocking = not (self.prefill_manager.runnable or self.decode_manager.runnable)
        for msg in self.receive_msg(blocking=blocking):
            self._process_one_msg(msg)
        forward_input = self._schedule_next_batch()
        ongoing_data = None
        if forward_input is not None:
            ongoing_data = (forward_input, self._forward(forward_input))
        self._process_last_data(ongoing_data)

    @torch.inference_mode()
    def run_forever(self) -> None:
        while True:
            self.normal_loop()

    def shutdown(self) -> None:
        dev.synchronize(self.device)
        self.engine.shutdown()

    def _process_last_data(self, last_data: ForwardData | None) -> None:
        if last_data is None:
            return
        batch, (_, next_tokens_cpu, copy_done) = last_data[0].batch, last_data[1]
        copy_done.synchronize()  # the sampled tokens are on the host
        reply: List[DetokenizeMsg] = []
        with self.cache_manager.lazy_free_region():
            for i, req in enumerate(batch.reqs):
                next_token = next_tokens_cpu[i]
                req.append_host(next_token.unsqueeze(0))
                token = int(next_token.item())
                finished = not req.can_decode
                if not req.sampling_params.ignore_eos:
                    finished |= token == self.eos_token_id
                reply.append(DetokenizeMsg(uid=req.uid, next_token=token, finished=finished))
                if finished:
                    self.decode_manager.remove_req(req)
                    self._free_req_resources(req)
                elif batch.is_prefill:  # the prompt's K/V go into the prefix cache
                    self.cache_manager.cache_req(req, finished=False)
        self.send_result(reply)

    def _process_one_msg(self, msg: BaseBackendMsg) -> None:
        if isinstance(msg, BatchBackendMsg):
            for one in msg.data:
                self._process_one_msg(one)
        elif isinstance(msg, ExitMsg):
            raise KeyboardInterrupt
        elif isinstance(msg, UserMsg):
            reason = self.check_request(msg.input_ids)
            if reason is not None:
                logger.warning_rank0(f"request {msg.uid} refused: {reason}")
                self.send_result([DetokenizeMsg(msg.uid, -1, finished=True, error=reason)])
                return
            if msg.sampling_params.max_tokens == 0:  # nothing to generate: done at once
                self.send_result([DetokenizeMsg(msg.uid, -1, finished=True)])
                return
            max_seq_len = self.engine.max_seq_len
            if msg.sampling_params.max_tokens > max_seq_len - len(msg.input_ids):
                # the sequence must fit the engine: the output is capped, not refused (on a
                # copy: one SamplingParams object may be shared by many requests)
                capped = replace(msg.sampling_params, max_tokens=max_seq_len - len(msg.input_ids))
                msg = replace(msg, sampling_params=capped)
            self.prefill_manager.add_one_req(msg)
        elif isinstance(msg, AbortBackendMsg):
            req = self.prefill_manager.abort_req(msg.uid) or self.decode_manager.abort_req(msg.uid)
            if req is not None:
                self._free_req_resources(req)
        else:
            raise TypeError(f"unknown message type {type(msg).__name__}")

    def check_request(self, input_ids: torch.Tensor) -> str | None:
        """Why this engine cannot serve a prompt, or None. (Sampling parameters out of range
        were refused when the SamplingParams was made.)"""
        input_len, max_seq_len = len(input_ids), self.engine.max_seq_len
        if input_len == 0 or input_len >= max_seq_len:
            return (
                f"the prompt has {input_len} tokens; this engine takes 1 to "
                f"{max_seq_len - 1} (its longest sequence is {max_seq_len} tokens)"
            )
        outside = ((input_ids < 0) | (input_ids >= self.vocab_size)).nonzero()
        if len(outside) > 0:
            at = int(outside[0])
            return (
                f"token id {int(input_ids[at])} at position {at} is outside the vocabulary "
                f"(ids 0 to {self.vocab_size - 1})"
            )
        return None

    def _free_req_resources(self, req: Req) -> None:
        self.table_manager.free(req.table_idx)
        self.cache_manager.cache_req(req, finished=True)

    def _prepare_batch(self, batch: Batch) -> ForwardInput:
        batch.padded_reqs = batch.reqs  # chapter 18 pads decode batches to a graph's size
        self.cache_manager.allocate_paged(batch.reqs)
        batch.positions = _make_positions(batch, self.device)
        input_mapping = _make_input_tuple(batch, self.device)
        write_mapping = _make_write_tuple(batch, self.device)
        batch.out_loc = self.engine.page_table[input_mapping]
        self.engine.attn_backend.prepare_metadata(batch)
        return ForwardInput(
            batch=batch,
            sample_args=self.engine.sampler.prepare(batch),
            input_tuple=input_mapping,
            write_tuple=write_mapping,
        )

    def _schedule_next_batch(self) -> ForwardInput | None:
        # prefill first: new requests start as soon as they can
        batch = (
            self.prefill_manager.schedule_next_batch(self.prefill_budget)
            or self.decode_manager.schedule_next_batch()
        )
        return self._prepare_batch(batch) if batch else None

    def _forward(self, forward_input: ForwardInput) -> ForwardOutput:
        batch, sample_args, input_mapping, output_mapping = forward_input
        batch.input_ids = self.token_pool[input_mapping]
        forward_output = self.engine.forward_batch(batch, sample_args)
        self.token_pool[output_mapping] = forward_output.next_tokens_gpu
        self.decode_manager.filter_reqs(batch.reqs)
        return forward_output


def _make_positions(batch: Batch, device: torch.device) -> torch.Tensor:
    """Positions of the batch's new tokens: cached_len .. device_len-1 of every request."""
    positions = [
        torch.arange(r.cached_len, r.device_len, dtype=torch.int32) for r in batch.padded_reqs
    ]
    return dev.to_device(_pinned(torch.cat(positions), device), device)


def _make_input_tuple(batch: Batch, device: torch.device) -> Indice2D:
    """(slot, position) of every new token: token_pool[...] gives the input ids and
    page_table[...] the KV slots to write."""
    slots = [torch.full((r.extend_len,), r.table_idx, dtype=torch.int64) for r in batch.padded_reqs]
    slot_index = dev.to_device(_pinned(torch.cat(slots), device), device)
    return slot_index, batch.positions.to(torch.int64)


def _make_write_tuple(batch: Batch, device: torch.device) -> Indice2D:
    """(slot, position) where each request's sampled token is stored in the token pool."""
    slots = dev.host_tensor([r.table_idx for r in batch.reqs], torch.int64, device)
    positions = dev.host_tensor(
        [r.device_len if r.can_decode else -1 for r in batch.reqs], torch.int64, device
    )
    return dev.to_device(slots, device), dev.to_device(positions, device)


def _pinned(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    return tensor.pin_memory() if dev.pin_memory(device) else tensor
