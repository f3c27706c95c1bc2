"""Waiting for and stopping the worker processes that a main or a test starts.

Two rules keep a run from hanging:

* never wait on a socket without a bound: `receive` gives up when a peer process has died
  (saying which one, with its exit code: its traceback is on stderr, which it shares with us)
  or when the time is up;
* never leave a worker behind: inside `stopped_on_exit(...)`, whatever happens, every process
  named is gone when the block ends. `finish` is the polite end of a run: the workers were
  told to stop (an `ExitMsg`, `terminate()`), and it waits for them, checks their exit codes,
  and ends by force any that does not stop in time.

Nothing here imports minisgl: a queue is anything with ``get(timeout=...)`` that raises
``TimeoutError`` (a ZMQ queue of chapter 12) or ``queue.Empty`` (a multiprocessing queue).
"""

from __future__ import annotations

import contextlib
import time
from multiprocessing.process import BaseProcess
from queue import Empty
from typing import Iterator, Protocol, Sequence, TypeVar

T = TypeVar("T", covariant=True)
LOOK_EVERY_S = 0.2  # how often `receive` checks that its peers are alive


class Queue(Protocol[T]):
    def get(self, timeout: float | None = None) -> T: ...


class PeerDied(RuntimeError):
    """A process we were waiting for exited."""


def describe(process: BaseProcess) -> str:
    return f"{process.name} (pid {process.pid})"


def receive(queue: Queue[T], peers: Sequence[BaseProcess], timeout: float, what: str) -> T:
    """The next message from `queue`, while every process in `peers` is alive; `what` names
    the awaited message in the errors."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return queue.get(timeout=LOOK_EVERY_S)
        except (TimeoutError, Empty):  # a ZMQ queue's and a multiprocessing queue's way to say so
            pass
        for peer in peers:
            if not peer.is_alive():
                raise PeerDied(
                    f"{describe(peer)} exited with code {peer.exitcode} while we waited for "
                    f"{what} (its traceback, if any, is on stderr)"
                )
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"no {what} within {timeout} s; {', '.join(map(describe, peers))} alive"
            )


def force_stop(processes: Sequence[BaseProcess], grace: float = 5.0) -> None:
    """SIGTERM to every process still alive, then SIGKILL to those alive `grace` s later."""
    alive = [p for p in processes if p.pid is not None and p.is_alive()]
    for p in alive:
        p.terminate()
    deadline = time.monotonic() + grace
    for p in alive:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(5.0)


def finish(processes: Sequence[BaseProcess], timeout: float = 30.0) -> None:
    """Wait for processes that were told to stop; raise if one needed force or failed."""
    deadline = time.monotonic() + timeout
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
    late = [p for p in processes if p.is_alive()]
    force_stop(late)
    problems = [f"{describe(p)} did not stop within {timeout} s" for p in late]
    problems += [
        f"{describe(p)} exited with code {p.exitcode}"
        for p in processes
        if p not in late and p.exitcode != 0
    ]
    if problems:
        raise RuntimeError("; ".join(problems))


@contextlib.contextmanager
def stopped_on_exit(*processes: BaseProcess) -> Iterator[None]:
    """No process in `processes` outlives the block, whether it ends well or not."""
    try:
        yield
    finally:
        force_stop(processes)
