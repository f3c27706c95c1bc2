"""The book's adaptive chunk: every step decodes every running request and fills what is left
of its token budget with prompt tokens, all in one forward pass."""

from __future__ import annotations

from minisgl.core import Batch
from minisgl.scheduler.decode import DecodeManager
from minisgl.scheduler.prefill import PrefillManager


def schedule_step(
    prefill_manager: PrefillManager, decode_manager: DecodeManager, max_step_tokens: int
) -> Batch | None:
    decoding = list(decode_manager.running_reqs)
    room = max_step_tokens - len(decoding)  # one new token per decoding request
    prompts = prefill_manager.schedule_next_batch(room) if room > 0 else None
    if prompts is None:
        return decode_manager.schedule_next_batch()
    # a decoding request is a prefill of one token after a cached prefix, so one batch of
    # phase "prefill" serves both: each request's logits come from its last new token
    return Batch(reqs=prompts.reqs + decoding, phase="prefill")
