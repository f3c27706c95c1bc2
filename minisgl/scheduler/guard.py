"""What the scheduler does when a request cannot be served: the loop goes on.

* A batch whose forward pass or sampling raises ends its requests with the error, and
  everything they hold is released; the requests of the other batches, and the engine, go on.
* A request that can never start (nothing runs, nothing is in flight, and it still does not
  fit) is refused instead of waiting for ever.

A request refused at arrival (a prompt that does not fit, a token outside the vocabulary) never
gets this far: see Scheduler.check_request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, List, Set

from minisgl.core import Batch, Req
from minisgl.message import DetokenizeMsg
from minisgl.utils import init_logger

if TYPE_CHECKING:
    from minisgl.engine import ForwardOutput

    from .cache import CacheManager
    from .decode import DecodeManager
    from .prefill import PrefillManager
    from .scheduler import ForwardData, ForwardInput

logger = init_logger(__name__)


class SchedulerGuardMixin:
    # what the Scheduler provides
    decode_manager: DecodeManager
    prefill_manager: PrefillManager
    cache_manager: CacheManager
    finished_reqs: Set[Req]
    _in_flight: Set[Req]
    send_result: Callable[[List[DetokenizeMsg]], None]
    _forward: Callable[[ForwardInput], ForwardOutput]
    _free_req_resources: Callable[[Req], None]

    def _forward_or_fail(self, forward_input: ForwardInput) -> ForwardData | None:
        """Run the batch; if the forward pass or the sampling raises, its requests end with an
        error instead of the scheduler (see _fail_batch)."""
        lengths = [req.device_len for req in forward_input.batch.reqs]
        try:
            return forward_input, self._forward(forward_input)
        except Exception as error:
            computed = [req.device_len != n for req, n in zip(forward_input.batch.reqs, lengths)]
            self._fail_batch(forward_input.batch, error, computed)
            return None

    def _fail_batch(self, batch: Batch, error: Exception, computed: List[bool]) -> None:
        """End every request of a batch that could not run with the error, and release what
        they hold: now, or when the batch in flight that also holds them is processed. A
        request whose forward pass did not complete gives back the pages it took for it
        (their keys and values were never written, so they must not go into the cache)."""
        logger.error(f"a {batch.phase} batch of {batch.size} failed: {error!r}", exc_info=error)
        reason = f"the engine failed on this request's batch ({type(error).__name__}: {error})"
        for req, done in zip(batch.reqs, computed):
            self.decode_manager.remove_req(req)
            self.prefill_manager.forget(req.uid)
            if not done:
                self.cache_manager.free_uncomputed(req)
            if req in self._in_flight:
                self.finished_reqs.add(req)
            else:
                self._free_req_resources(req)
        self.send_result(
            [DetokenizeMsg(r.uid, -1, finished=True, error=reason) for r in batch.reqs]
        )

    def _refuse_what_cannot_start(self) -> None:
        """Nothing runs and nothing is in flight, yet a request waits: nothing will ever free
        room for it, so it is refused instead of waiting for ever. (Admission control makes
        this unreachable; it is the loop's guarantee of progress.)"""
        if self.decode_manager.runnable or not self.prefill_manager.pending_list:
            return
        stuck = self.prefill_manager.pending_list[0]
        if stuck.chunked_req is not None:  # half prefilled: it holds a slot and pages
            self._free_req_resources(stuck.chunked_req)
        self.prefill_manager.forget(stuck.uid)
        reason = (
            f"the request cannot be admitted: it needs {stuck.input_len + stuck.output_len} "
            f"token slots, {self.cache_manager.available_size} are available and nothing "
            f"running will free more"
        )
        logger.error(f"request {stuck.uid} refused: {reason}")
        self.send_result([DetokenizeMsg(stuck.uid, -1, finished=True, error=reason)])
