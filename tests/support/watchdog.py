"""A test may not hang, and may not leave a process behind (used by tests/conftest.py).

* Each test runs under a `Watchdog`: after `TEST_TIMEOUT_S` it writes the stack of every
  thread to the real stderr (past pytest's capture), stops every child process, and
  interrupts the main thread; pytest then ends the session and reports where the test was.
  If the main thread does not react, the process exits.
* A process that a test started and did not stop is stopped, and the test errors, naming it.
* At the end of the session, any child still alive (a module fixture's worker, say) is
  stopped, so that pytest's exit never waits for it.
"""

from __future__ import annotations

import _thread
import faulthandler
import multiprocessing
import os
import threading

from tools.processes import describe, force_stop

TEST_TIMEOUT_S = float(os.environ.get("MINISGL_BOOK_TEST_TIMEOUT", "300"))
EXIT_AFTER_S = 20.0  # after the interrupt, if the main thread is still stuck


class Watchdog:
    """Fires once `timeout` seconds after it is started, unless cancelled first."""

    def __init__(self, test: str, timeout: float, stderr_fd: int) -> None:
        self.test, self.timeout, self.stderr_fd = test, timeout, stderr_fd
        self._cancelled = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-watchdog", daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        self._cancelled.set()

    def _say(self, text: str) -> None:
        os.write(self.stderr_fd, f"\n[watchdog] {text}\n".encode())

    def _run(self) -> None:
        if self._cancelled.wait(self.timeout):
            return
        self._say(f"{self.test} has run for {self.timeout:.0f} s; the stack of every thread:")
        faulthandler.dump_traceback(file=self.stderr_fd, all_threads=True)
        children = multiprocessing.active_children()
        if children:
            self._say(f"stopping {', '.join(map(describe, children))}")
            force_stop(children, grace=2.0)
        _thread.interrupt_main()  # a KeyboardInterrupt in the test: pytest ends the session
        if self._cancelled.wait(EXIT_AFTER_S):
            return
        self._say(f"the main thread did not react within {EXIT_AFTER_S:.0f} s: exiting")
        os._exit(3)


def leftovers(before: set) -> list:
    """Children started since `before` (a set of processes) and still alive, now stopped."""
    left = [p for p in multiprocessing.active_children() if p not in before]
    force_stop(left)
    return left


def stop_all_children() -> list:
    children = multiprocessing.active_children()
    force_stop(children)
    return children
