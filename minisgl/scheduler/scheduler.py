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

With overlap scheduling (the default), the loop launches batch N+1 on the device before it
processes batch N's results, so the CPU's work of a turn runs while the device computes. The
price is that batch N+1 was chosen without knowing N's results: a request that finished in N
may still be in N+1. The processing below handles that case (see "the four fixes" in
chapter 11): results of requests that are already done are dropped, and what such a request
holds is released only when no launched batch uses it any more.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, List, NamedTuple, Set, Tuple, TypeAlias

import torch

from minisgl.core import Batch, Req
from minisgl.env import ENV
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
from .guard import SchedulerGuardMixin
from .io import SchedulerIOMixin
from .prefill import ChunkedReq, PrefillManager
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


class Scheduler(SchedulerIOMixin, SchedulerGuardMixin):
    def __init__(self, config: SchedulerConfig) -> None:
        from minisgl.engine import Engine

        self.engine = Engine(config)
        self.device = self.engine.device
        # the scheduler prepares batches on its own stream; the engine computes on its stream
        self.stream = dev.Stream(self.device)
        dev.set_stream(self.stream)
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
        self._chunk_in_last_batch = False
        # requests that are done (finished or aborted) but were in a batch still in flight:
        # their results are dropped, and their slot and pages released, once that batch is
        # processed
        self.finished_reqs: Set[Req] = set()
        self._in_flight: Set[Req] = set()  # the requests of the launched, unprocessed batch
        # where messages come from and where replies go: a subclass's offline methods, or
        # sockets; with several ranks, rank 0 forwards every message over the engine's CPU
        # process group
        super().__init__(config, tp_cpu_group=self.engine.tp_cpu_group)

    def run_when_idle(self) -> None:
        """Called when nothing is runnable, before waiting for the next message: a good time
        to prove that every page is free or cached."""
        logger.info_rank0("scheduler idle, waiting for requests")
        self.cache_manager.check_integrity()

    def overlap_loop(self, last_data: ForwardData | None) -> ForwardData | None:
        """One turn: launch the next batch, then process the last one while it runs."""
        blocking = not (
            last_data is not None  # the last batch's results are still to be processed
            or self.prefill_manager.runnable
            or self.decode_manager.runnable
        )
        for msg in self.receive_msg(blocking=blocking):
            self._process_one_msg(msg)
        forward_input = self._schedule_next_batch()
        ongoing_data = None
        if forward_input is not None:
            with dev.use_stream(self.engine.stream):
                # the batch's inputs were prepared on the scheduler's stream
                self.engine.stream.wait_stream(self.stream)
                ongoing_data = self._forward_or_fail(forward_input)
        elif last_data is None:
            self._refuse_what_cannot_start()
        self._in_flight = set(ongoing_data[0].batch.reqs) if ongoing_data else set()
        self._process_last_data(last_data)
        return ongoing_data

    def normal_loop(self) -> None:
        """One turn without overlap: launch a batch, wait for it, process it."""
        blocking = not (self.prefill_manager.runnable or self.decode_manager.runnable)
        for msg in self.receive_msg(blocking=blocking):
            self._process_one_msg(msg)
        forward_input = self._schedule_next_batch()
        ongoing_data = None
        if forward_input is not None:
            ongoing_data = self._forward_or_fail(forward_input)
        else:
            self._refuse_what_cannot_start()
        self._in_flight = set()
        self._process_last_data(ongoing_data)

    @torch.inference_mode()
    def run_forever(self) -> None:
        if ENV.DISABLE_OVERLAP_SCHEDULING:
            with dev.use_stream(self.engine.stream):
                self.engine.stream.wait_stream(self.stream)
                while True:
                    self.normal_loop()
        else:
            data = None
            while True:
                data = self.overlap_loop(data)

    def shutdown(self) -> None:
        dev.synchronize(self.device)
        self.stop_io()
        self.engine.shutdown()

    def _process_last_data(self, last_data: ForwardData | None) -> None:
        if last_data is None:
            return
        batch, (_, next_tokens_cpu, copy_done) = last_data[0].batch, last_data[1]
        copy_done.synchronize()  # the sampled tokens are on the host
        reply: List[DetokenizeMsg] = []
        tokens: List[int] = next_tokens_cpu.tolist()  # one call, not one .item() per request
        with self.cache_manager.lazy_free_region():
            for i, req in enumerate(batch.reqs):
                if req in self.finished_reqs:
                    # done (finished or aborted) while this batch was in flight: its output
                    # here is stale (fix 2), and what it holds is released now that no
                    # launched batch uses it (fixes 3 and 4)
                    self._release_deferred(req)
                    continue
                if isinstance(req, ChunkedReq):  # its prompt is not done: nothing sampled
                    continue
                token = tokens[i]
                req.append_host(token)  # an int: no tensor per request (see Req)
                # counted on the host, where the token just arrived: the device-side lengths
                # may already include the next batch (fix 1)
                finished = req.host_len >= req.max_device_len
                if not req.sampling_params.ignore_eos:
                    finished |= token == self.eos_token_id
                reply.append(DetokenizeMsg(uid=req.uid, next_token=token, finished=finished))
                if finished:
                    self._finish_req(req)
                elif batch.is_prefill:  # the prompt's K/V go into the prefix cache
                    self.cache_manager.cache_req(req, finished=False)
        self.send_result(reply)

    def _finish_req(self, req: Req) -> None:
        """A request is done: it leaves the running set; its slot and pages are released now,
        or, if the batch in flight uses them, when that batch is processed."""
        self.decode_manager.remove_req(req)
        if req in self._in_flight:
            self.finished_reqs.add(req)
        else:
            self._free_req_resources(req)

    def _release_deferred(self, req: Req) -> None:
        # it left the running set before the batch now in flight was scheduled
        assert req not in self._in_flight, "a done request was scheduled again"
        self.finished_reqs.discard(req)
        self._free_req_resources(req)

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
                self._finish_req(req)  # maybe deferred: its last batch may be in flight
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
        self.engine.graph_runner.pad_batch(batch)  # a decode batch: up to a graph's size
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
        # prefill first, so that new requests start as soon as they can; but while a long
        # prompt is prefilled in chunks, chunks and decode steps take turns, so that the
        # running requests are not held up for the whole prompt
        batch = None
        if not (self._chunk_in_last_batch and self.decode_manager.runnable):
            batch = self.prefill_manager.schedule_next_batch(self.prefill_budget)
        batch = batch or self.decode_manager.schedule_next_batch()
        self._chunk_in_last_batch = batch is not None and any(
            isinstance(r, ChunkedReq) for r in batch.reqs
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
    """Positions of the batch's new tokens: cached_len .. device_len-1 of every request. Built
    as one Python list and copied once: a small tensor per request costs the host more than
    the numbers themselves (a decode batch of 256 is 256 integers)."""
    positions: List[int] = []
    for r in batch.padded_reqs:
        positions.extend(range(r.cached_len, r.device_len))
    return dev.to_device(dev.host_tensor(positions, torch.int32, device), device)


def _make_input_tuple(batch: Batch, device: torch.device) -> Indice2D:
    """(slot, position) of every new token: token_pool[...] gives the input ids and
    page_table[...] the KV slots to write."""
    slots: List[int] = []
    for r in batch.padded_reqs:
        slots.extend([r.table_idx] * r.extend_len)
    slot_index = dev.to_device(dev.host_tensor(slots, torch.int64, device), device)
    return slot_index, batch.positions.to(torch.int64)


def _make_write_tuple(batch: Batch, device: torch.device) -> Indice2D:
    """(slot, position) where each request's sampled token is stored in the token pool."""
    slots = dev.host_tensor([r.table_idx for r in batch.reqs], torch.int64, device)
    positions = dev.host_tensor(
        [r.device_len if r.can_decode else -1 for r in batch.reqs], torch.int64, device
    )
    return dev.to_device(slots, device), dev.to_device(positions, device)
