from __future__ import annotations

import itertools
import os
import secrets
import tempfile
from dataclasses import dataclass, field

from minisgl.engine import EngineConfig

_COUNTER = itertools.count()


def _unique_suffix() -> str:
    """Different for every config made, in this process and in any other on the machine, now or
    later: the pid, a count within the process, and random digits (a pid comes back once the
    system has used the others, and a killed server leaves its files behind). Copies made with
    dataclasses.replace keep it, so the ranks of one server share their addresses."""
    return f"{os.getpid()}-{next(_COUNTER)}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class SchedulerConfig(EngineConfig):
    max_extend_tokens: int = 8192  # the most prompt tokens one prefill batch may compute
    cache_type: str = "radix"  # the prefix cache: "radix" or "naive"
    offline_mode: bool = False  # requests come from LLM.generate, not from sockets
    _unique_suffix: str = field(default_factory=_unique_suffix)

    @property
    def max_forward_len(self) -> int:
        return self.max_extend_tokens

    def _ipc_addr(self, name: str) -> str:
        # a Unix socket in the temporary folder: short enough (at most 104 bytes on macOS)
        return f"ipc://{tempfile.gettempdir()}/minisgl-{self._unique_suffix}-{name}"

    @property
    def zmq_backend_addr(self) -> str:
        """Where the scheduler (rank 0) receives requests and aborts."""
        return self._ipc_addr("backend")

    @property
    def zmq_detokenizer_addr(self) -> str:
        """Where the scheduler (rank 0) sends its tokens."""
        return self._ipc_addr("detokenizer")

    @property
    def zmq_scheduler_broadcast_addr(self) -> str:
        """Where rank 0 publishes the messages to the other ranks."""
        return self._ipc_addr("broadcast")

    @property
    def distributed_addr(self) -> str:
        """Where the ranks meet to start their process group (chapter 16): a file that
        torch.distributed creates and deletes, named like the sockets."""
        return f"file://{tempfile.gettempdir()}/minisgl-{self._unique_suffix}-ranks"

    @property
    def backend_create_detokenizer_link(self) -> bool:
        """Whether the scheduler binds the detokenizer address (it does, unless the server of
        chapter 15 says otherwise)."""
        return True
