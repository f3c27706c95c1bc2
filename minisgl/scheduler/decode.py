"""The requests that are decoding: all of them go into every decode batch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable

from minisgl.core import Batch, Req


@dataclass
class DecodeManager:
    page_size: int
    # insertion-ordered, so that a decode batch lists its requests in a reproducible order
    running_reqs: Dict[Req, None] = field(default_factory=dict)

    def filter_reqs(self, reqs: Iterable[Req]) -> None:
        """Add a batch's requests, then keep only those that may still decode."""
        merged = {**self.running_reqs, **dict.fromkeys(reqs)}
        self.running_reqs = {req: None for req in merged if req.can_decode}

    def remove_req(self, req: Req) -> None:
        self.running_reqs.pop(req, None)

    def abort_req(self, uid: int) -> Req | None:
        for req in self.running_reqs:
            if req.uid == uid:
                del self.running_reqs[req]
                return req
        return None

    @property
    def inflight_tokens(self) -> int:
        """Tokens the running requests may still need (their remaining output, plus one page
        each that a new page may leave partly unused)."""
        reserved = (self.page_size - 1) * len(self.running_reqs)
        return sum(req.remain_len for req in self.running_reqs) + reserved

    def schedule_next_batch(self) -> Batch | None:
        if not self.runnable:
            return None
        return Batch(reqs=list(self.running_reqs), phase="decode")

    @property
    def runnable(self) -> bool:
        return len(self.running_reqs) > 0
