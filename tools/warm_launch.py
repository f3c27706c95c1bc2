"""`python -m minisgl ...` started in milliseconds, for the tests that start servers and shells.

Chapter 15's tests start two servers, two shells and one bad command line in each chapter from
15 on, and chapter 16's a server of two ranks: about fifty fresh interpreters in a check, each
of which imports torch, transformers and the web stack before it parses its first flag (1.5 to
2 s of one core). `install()`, which tests/conftest.py calls while pytest's process is still a
single thread and has not imported the package (and tools/preload.py in a main's run, before
the main's code), forks a copy of that process (the launcher) and leaves it waiting.
`popen(command, ...)` then asks the launcher for the command: the launcher forks again, and
the fork becomes the run, as tools/preload.py's runs do. It gets the
standard streams the caller gave, the environment and working folder of the call, a session of
its own (and the terminal as its controlling terminal, for the shell), a fresh interpreter's
sys.path and warning filters, the chapter's isolation guard, and runs the module as
`python -m` would. What differs from a fresh interpreter is only what it finds imported
already.

    process = popen([sys.executable, "-m", "minisgl", ...], stdout=log, stderr=STDOUT, env=env)
    process.wait(20)                                # like subprocess.Popen

The run is the launcher's child, not the caller's: the launcher reports its pid, then its exit
code, over a socket that belongs to that run. When the caller ends (or dies), the launcher kills
what is still running and exits. Where there is no launcher (a main that a reader runs by hand,
a process with threads), or for any other command, `popen` is subprocess.Popen with a session
of its own.
"""

from __future__ import annotations

import ast
import fcntl
import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import termios
import threading
import time
from typing import IO, Dict, List, Optional, Sequence, Tuple, Union

from tools import warm_forkserver

# imported by the launcher before its first run: the libraries a server or a shell imports
# at start-up, none of them the book's
WEB_STACK = ("fastapi", "uvicorn", "pydantic", "zmq", "transformers.models.auto.tokenization_auto")
PACKAGE = "minisgl"
ANSWER_TIMEOUT_S = 30.0  # the launcher forks at once: it is busy or gone after this long
KILL_WAIT_S = 5.0  # how long killed runs may take to end when the caller is gone
SETTLE_TIMEOUT_S = 10.0  # a fork takes milliseconds to call setsid: it is stuck after this long

File = Union[None, int, IO]
_channel: Optional[socket.socket] = None  # the caller's end of the way to the launcher
_launcher_pid: Optional[int] = None
_lock = threading.Lock()


def install() -> bool:
    """Fork the launcher; False where this process cannot (threads, a CUDA context, no
    descriptor passing)."""
    global _channel, _launcher_pid
    if _channel is not None:
        return True
    if not hasattr(socket, "send_fds") or threading.active_count() != 1:
        return False  # a copy made now could hold a lock that another thread has
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return False  # a fork could not use the GPU
    if any(name == PACKAGE or name.startswith(PACKAGE + ".") for name in sys.modules):
        return False  # each run imports the package itself, as a fresh interpreter does
    _launcher_pid, _channel = warm_forkserver.fork_copy(_serve)
    return True


def popen(
    command: Sequence[str],
    *,
    stdin: File = None,
    stdout: File = None,
    stderr: File = None,
    env: Optional[Dict[str, str]] = None,
    terminal: bool = False,
) -> Union[subprocess.Popen, "LaunchedProcess"]:
    """Start `command` in a session of its own; with `terminal`, its stdin (a pseudo-terminal)
    becomes its controlling terminal. Through the launcher when there is one and `command` is
    ``python -m MODULE ...``; else with subprocess.Popen."""
    global _channel
    environment = dict(os.environ if env is None else env)
    if _channel is not None and len(command) >= 3 and list(command[:2]) == [sys.executable, "-m"]:
        opened: List[int] = []  # /dev/null for DEVNULL: the run gets a copy of it
        fds = [_fd(stdin, 0, opened), _fd(stdout, 1, opened)]
        fds.append(fds[1] if stderr == subprocess.STDOUT else _fd(stderr, 2, opened))
        ours, theirs = socket.socketpair()
        request = repr((list(command[1:]), environment, os.getcwd(), terminal)).encode()
        try:
            with _lock:
                warm_forkserver.send_message(_channel, request, [*fds, theirs.fileno()])
            return LaunchedProcess(list(command), ours)
        except OSError:  # the launcher is gone (killed): from now on, fresh interpreters
            ours.close()
            _channel = None
        finally:
            theirs.close()
            for fd in opened:
                os.close(fd)
    return subprocess.Popen(list(command), stdin=stdin, stdout=stdout, stderr=stderr,
                            env=environment, start_new_session=not terminal,
                            preexec_fn=_own_terminal if terminal else None)  # fmt: skip


def run(command: Sequence[str], env: Dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """Like subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process.pid)
            process.wait(10)
            raise
        out.seek(0)
        err.seek(0)
        text = [f.read().decode(errors="replace") for f in (out, err)]
    return subprocess.CompletedProcess(list(command), code, text[0], text[1])


class LaunchedProcess:
    """A run that the launcher forked; waits like subprocess.Popen."""

    def __init__(self, args: List[str], report: socket.socket) -> None:
        self.args = args
        self.returncode: Optional[int] = None
        self._report = report
        self._buffer = b""
        line = self._line(ANSWER_TIMEOUT_S)
        if not line:
            report.close()
            raise RuntimeError(
                f"the launcher {'is gone' if line == b'' else 'did not answer'}: {args} not started"
            )
        self.pid = int(line)

    def _line(self, timeout: Optional[float]) -> Optional[bytes]:
        """The launcher's next line; None if none came within `timeout` s, b"" if the
        launcher is gone."""
        while b"\n" not in self._buffer:
            if not select.select([self._report], [], [], timeout)[0]:
                return None
            chunk = self._report.recv(64)
            if not chunk:
                return b""
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _ended(self, line: bytes) -> int:
        self.returncode = int(line) if line else -9  # no word from a launcher that was killed
        self._report.close()
        return self.returncode

    def poll(self) -> Optional[int]:
        if self.returncode is None and (line := self._line(0)) is not None:
            self._ended(line)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if self.returncode is None:
            line = self._line(timeout)
            if line is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._ended(line)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _fd(file: File, default: int, opened: List[int]) -> int:
    if file is None:
        return default
    if file == subprocess.DEVNULL:
        opened.append(os.open(os.devnull, os.O_RDWR))
        return opened[-1]
    return file if isinstance(file, int) else file.fileno()


def _own_terminal() -> None:
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ------------------------------------------------------------------ the launcher's side
def _serve(channel: socket.socket) -> None:
    """The launcher's life: fork a run for each request, report its pid and exit code; when
    the caller is gone, kill what still runs and exit."""
    gc.freeze()  # pytest's objects stay untouched: the runs share their pages
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the tests
    runs: Dict[int, socket.socket] = {}
    fresh: Optional[Tuple[List[str], List[list]]] = None
    try:
        while True:
            if select.select([channel], [], [], 0.1 if runs else None)[0]:
                request = _receive(channel)
                if request is None:
                    break
                (argv, environment, cwd, terminal), fds = request
                if fresh is None:
                    fresh = _fresh_interpreter(environment)
                    _import_web_stack()
                settled, settling = os.pipe()
                pid = os.fork()
                if pid == 0:
                    os.close(settled)
                    _become(channel, fds, argv, environment, cwd, terminal, fresh)
                os.close(settling)
                # the pid goes out once the run leads its session (it closes its end then):
                # a caller may stop it with killpg at once, as it may a Popen(start_new_session)
                select.select([settled], [], [], SETTLE_TIMEOUT_S)
                os.close(settled)
                for fd in fds[:3]:
                    os.close(fd)
                report = socket.socket(fileno=fds[3])
                report.sendall(f"{pid}\n".encode())
                runs[pid] = report
            _reap(runs)
    finally:
        for pid in runs:
            _kill_group(pid)
        deadline = time.monotonic() + KILL_WAIT_S
        while runs and time.monotonic() < deadline:  # reaped here, not left to the init process
            _reap(runs)
            time.sleep(0.05)
        os._exit(0)


def _receive(channel: socket.socket) -> Optional[Tuple[tuple, List[int]]]:
    try:
        message = warm_forkserver.receive_message(channel, 4)
    except OSError:
        return None
    if message is None or len(message[1]) != 4:
        return None
    return ast.literal_eval(message[0].decode()), message[1]


def _reap(runs: Dict[int, socket.socket]) -> None:
    for pid, code in warm_forkserver.ended_children() if runs else ():
        report = runs.pop(pid, None)
        if report is not None:
            try:
                report.sendall(f"{code}\n".encode())
            except OSError:
                pass  # the caller stopped waiting for it
            report.close()


# what a fresh interpreter has that pytest's process changed: its sys.path without PYTHONPATH
# (the standard library, site-packages and what their .pth files add, an editable install's
# folder) and its warning filters (pytest's settings ignore some categories)
FRESH = """
import json, sys, warnings
filters = [(action, message.pattern if message else "", category.__module__,
            category.__qualname__, getattr(module, "pattern", module) or "", lineno)
           for action, message, category, module, lineno in warnings.filters]
print(json.dumps([sys.path[1:], filters]))
"""


def _fresh_interpreter(environment: Dict[str, str]) -> Tuple[List[str], List[list]]:
    env = {k: v for k, v in environment.items() if k != "PYTHONPATH"}
    found = subprocess.run([sys.executable, "-c", FRESH], env=env, cwd="/", capture_output=True,
                           text=True, check=True, timeout=60)  # fmt: skip
    path, filters = json.loads(found.stdout)
    return path, filters


def _fresh_warnings(filters: List[list]) -> None:
    import importlib
    import warnings

    warnings.resetwarnings()
    for action, message, module_name, qualname, module, lineno in reversed(filters):
        category = importlib.import_module(module_name)
        for part in qualname.split("."):
            category = getattr(category, part)
        warnings.filterwarnings(action, message, category, module, lineno)


def _import_web_stack() -> None:
    for name in WEB_STACK:
        try:
            __import__(name)
        except ImportError:
            pass
    gc.freeze()


def _become(
    channel: socket.socket,
    fds: List[int],
    argv: List[str],
    environment: Dict[str, str],
    cwd: str,
    terminal: bool,
    fresh: Tuple[List[str], List[list]],
) -> None:
    """In the launcher's fork: become the run; never returns."""
    base_path, filters = fresh
    try:
        channel.close()
        os.setsid()
        if terminal:
            fcntl.ioctl(fds[0], termios.TIOCSCTTY, 0)
        # closes every other pipe and socket: the report socket, and the launcher's pipe, which
        # tells it that the run is settled in its session
        warm_forkserver._take(fds[:3], warm_forkserver.STDIO)
        warm_forkserver._become_fresh(environment, cwd)
        _fresh_warnings(filters)
        # pytest's import hook (it rewrites the asserts of test files) is not the run's
        hooks = [f for f in sys.meta_path if type(f).__module__.startswith("_pytest.")]
        sys.meta_path[:] = [f for f in sys.meta_path if f not in hooks]
        import multiprocessing.process

        multiprocessing.process.ORIGINAL_DIR = os.getcwd()
    except BaseException:  # noqa: BLE001 - the caller sees exit code 1
        os._exit(1)
    # its workers' fork server: a fork of the run once it has imported its modules
    warm_forkserver.run_command_line(argv, base_path, warm_forkserver.fork_on_demand)
