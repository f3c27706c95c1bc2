"""multiprocessing's fork server, started in milliseconds in a test process.

The workers of the book's engine come from a fork server (`minisgl.utils.worker_context`).
multiprocessing starts that server as a fresh interpreter, which imports torch and
transformers' auto classes before the workers' own modules: about 4 s of one core, once in
every process that starts a worker, and `tools/steps.py check` runs some 45 such processes.

`install()`, which tests/conftest.py calls while pytest's process is still a single thread,
forks a copy of that process (it has imported torch and transformers already) and leaves it
waiting. When multiprocessing later spawns its fork server, the copy becomes that server
instead: it receives the file descriptors the command was to get, and the standard streams,
environment and working folder of that moment; it closes the pipes and sockets it inherited;
and it runs the very command the fresh interpreter would have run
(`from multiprocessing.forkserver import main; main(...)`), which imports the workers' modules
as before. Only what the server finds imported already differs.

Anything else that multiprocessing spawns (its resource tracker), a second fork server, and
every process with more than one thread start the usual way. The copy ends with the process
that made it, if no fork server was needed.

`fork_on_demand()` is the same idea without a copy made in advance: when multiprocessing
spawns its fork server in a process that has one thread at that moment (and no CUDA), the
process forks then, and the child becomes the fork server the same way. The isolation guard
of `tools/steps.py` (tools/guard/sitecustomize.py) turns it on in every process of a chapter's
run: `python -m minisgl` imports torch and transformers before it starts its workers, so its
fork server need not import them again.
"""

from __future__ import annotations

import ast
import fcntl
import gc
import os
import signal
import socket
import stat
import sys
import threading
import types
from typing import Callable, Dict, Iterator, List, NoReturn, Optional, Sequence, Tuple

FORKSERVER_COMMAND = "from multiprocessing.forkserver import main"
STDIO = [0, 1, 2]
MAX_FDS = 16  # the descriptors one request carries: the standard streams and the server's 2-3

_zygote: Optional[Tuple[int, socket.socket]] = None  # the copy's pid, and the way to reach it


def install() -> bool:
    """Make the copy and send multiprocessing's fork server to it; False where it cannot."""
    global _zygote
    import multiprocessing.util as mp_util

    if _zygote is not None or getattr(mp_util.spawnv_passfds, "warm", False):
        return True  # made already (by this module, or by another copy of it: tools/preload.py)
    if not hasattr(socket, "send_fds") or threading.active_count() != 1:
        return False  # a copy made now could hold a lock that another thread has

    _zygote = fork_copy(_wait)
    spawn: Callable[[str, List[str], Sequence[int]], int] = mp_util.spawnv_passfds

    def spawnv_passfds(path: str, args: List[str], passfds: Sequence[int]) -> int:
        global _zygote
        command = args[-1] if len(args) >= 2 and args[-2] == "-c" else ""
        if _zygote is None or not command.startswith(FORKSERVER_COMMAND):
            return spawn(path, args, passfds)
        (pid, channel), _zygote = _zygote, None  # one fork server per process
        request = repr((command, list(passfds), dict(os.environ), os.getcwd())).encode()
        send_message(channel, request, [*STDIO, *passfds])
        channel.close()
        return pid

    spawnv_passfds.warm = True  # type: ignore[attr-defined]
    mp_util.spawnv_passfds = spawnv_passfds  # forkserver.py calls util.spawnv_passfds(...)
    return True


def fork_copy(life: Callable[[socket.socket], None]) -> Tuple[int, socket.socket]:
    """Fork a copy of this process that spends its `life` on its end of a new socket pair
    and exits; return the copy's pid and this process's end."""
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ours.close()
        life(theirs)
        os._exit(0)
    theirs.close()
    return pid, ours


def send_message(channel: socket.socket, body: bytes, fds: Sequence[int]) -> None:
    """`body` after its length, with copies of the descriptors `fds` (SCM_RIGHTS)."""
    socket.send_fds(channel, [len(body).to_bytes(8, "big"), body], list(fds))


def receive_message(channel: socket.socket, max_fds: int) -> Optional[Tuple[bytes, List[int]]]:
    """What `send_message` sent, and its descriptors; None if the channel closed before a
    message came, ConnectionError if it closed in the middle of one."""
    header, fds, _, _ = socket.recv_fds(channel, 8, max_fds)
    if not header:
        return None
    size, body = int.from_bytes(header, "big"), b""
    while len(body) < size:
        part = channel.recv(size - len(body))
        if not part:
            raise ConnectionError("the channel closed in the middle of a message")
        body += part
    return body, fds


def ended_children() -> Iterator[Tuple[int, int]]:
    """(pid, exit code) of each child of this process that has ended, without waiting."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, os.waitstatus_to_exitcode(status)


def fork_on_demand() -> None:
    """Make multiprocessing's fork server a fork of this process, made at the moment it is
    spawned, where this process then has one thread and has not initialised CUDA; otherwise
    (and for anything else multiprocessing spawns) the usual fresh interpreter."""
    import multiprocessing.util as mp_util

    spawn: Callable[[str, List[str], Sequence[int]], int] = mp_util.spawnv_passfds
    if getattr(spawn, "on_demand", False):
        return

    def spawnv_passfds(path: str, args: List[str], passfds: Sequence[int]) -> int:
        command = args[-1] if len(args) >= 2 and args[-2] == "-c" else ""
        if not command.startswith(FORKSERVER_COMMAND) or not _forkable():
            return spawn(path, args, passfds)
        pid = os.fork()
        if pid == 0:

            def prepare() -> None:
                _close_inherited([*STDIO, *passfds])
                _become_fresh(dict(os.environ), os.getcwd())

            _run(command, prepare)  # never returns
        return pid

    spawnv_passfds.on_demand = True  # type: ignore[attr-defined]
    mp_util.spawnv_passfds = spawnv_passfds


def _forkable() -> bool:
    """One thread (Python's count misses threads that C libraries start: ask the kernel),
    and no CUDA context, which a forked child could not use."""
    if threading.active_count() != 1 or len(os.listdir("/proc/self/task")) != 1:
        return False
    torch = sys.modules.get("torch")
    return torch is None or not torch.cuda.is_initialized()


def run_command_line(
    argv: List[str], base_path: List[str], ready_fork_server: Callable[[], object]
) -> NoReturn:
    """In a copy of a warm process whose environment, working folder and standard streams are
    the run's already: run `python SCRIPT ...` or `python -m MODULE ...` (`argv` without the
    interpreter) as a fresh interpreter would, and exit with its code. `base_path` is the
    interpreter's own sys.path (the standard library, site-packages); `ready_fork_server`
    readies the run's fork server (`install` or `fork_on_demand`)."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
        extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if argv[0] == "-m":
            first, module, args = os.getcwd(), argv[1], argv[2:]
        else:
            first, module, args = os.path.dirname(os.path.realpath(argv[0])), None, argv[1:]
        sys.path[:] = [first, *extra, *base_path]
        sys.argv = [module, *args] if module is not None else [argv[0], *args]
        _load_sitecustomize(extra)
        threads = os.environ.get("OMP_NUM_THREADS")
        if threads and "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(int(threads))
        ready_fork_server()
        import runpy

        if module is not None:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(os.path.abspath(argv[0]), run_name="__main__")  # as python does
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - reported as a fresh interpreter would
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            threading._shutdown()  # type: ignore[attr-defined]  # wait for non-daemon threads
            import atexit

            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _load_sitecustomize(path: List[str]) -> None:
    """Run the sitecustomize.py that the run's PYTHONPATH holds (a chapter's isolation guard,
    tools/guard/), as a fresh interpreter would; not again if this process has run it."""
    found = next((os.path.join(p, "sitecustomize.py") for p in path
                  if os.path.exists(os.path.join(p, "sitecustomize.py"))), None)  # fmt: skip
    if found is None:
        return
    loaded = getattr(sys.modules.get("sitecustomize"), "__file__", None)
    if loaded is not None and os.path.realpath(loaded) == os.path.realpath(found):
        return  # the same guard, with the same environment: it is in place
    sys.modules.pop("sitecustomize", None)
    import sitecustomize  # noqa: F401


def zygote_pid() -> Optional[int]:
    """The waiting copy's pid (None once it became the fork server, or if there is none)."""
    return _zygote[0] if _zygote is not None else None


# ------------------------------------------------------------------ the copy's side
def _wait(channel: socket.socket) -> None:
    """The copy's life: wait for the command, become it (`_run`), exit."""
    gc.freeze()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the tests, not for this
    try:
        message = receive_message(channel, MAX_FDS)
    except BaseException:  # noqa: BLE001 - the parent is gone or sent nothing usable
        os._exit(1)
    if message is None:  # the parent ended without a fork server
        os._exit(0)
    body, fds = message
    command, targets, environment, cwd = ast.literal_eval(body.decode())

    def prepare() -> None:
        # first: the parent may have given the channel's number to one of the command's files
        channel.close()
        _take(fds, [*STDIO, *targets])
        _become_fresh(environment, cwd)

    _run(command, prepare)


def _run(command: str, prepare: Callable[[], None]) -> None:
    """In a copy: `prepare` it, run `command` as `python -c` would, and exit with its code.
    The parent's objects stay untouched (frozen, out of the garbage collector's sight):
    finalising one could close a descriptor whose number the command's files have taken."""
    gc.freeze()
    code = 1
    try:
        prepare()
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(command, "<string>", "exec"), main.__dict__)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    except BaseException:  # noqa: BLE001 - reported as the fresh interpreter would
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _take(received: List[int], targets: List[int]) -> None:
    """Give each received descriptor the number it had in the parent, and close every pipe
    and socket the copy inherited (a fresh interpreter would have none of them)."""
    _close_inherited([*received, *STDIO])
    # out of the way of the numbers being filled: above all of them, or filling one target
    # could overwrite a descriptor that another target still has to receive
    floor = max([*received, *targets]) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, floor) for fd in received]
    for fd in received:
        os.close(fd)
    for fd, target in zip(moved, targets):
        os.dup2(fd, target)
        os.close(fd)


def _close_inherited(keep: Sequence[int]) -> None:
    """Close every pipe and socket but those in `keep`: a fresh interpreter has none."""
    for fd in _open_fds():
        if fd not in keep and _is_pipe_or_socket(fd):
            os.close(fd)


def _open_fds() -> List[int]:
    return [int(name) for name in os.listdir("/proc/self/fd")]


def _is_pipe_or_socket(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _become_fresh(environment: Dict[str, str], cwd: str) -> None:
    """What a fresh `python -c` would have, that the copy of pytest's process has not."""
    import faulthandler

    os.environ.clear()
    os.environ.update(environment)
    os.chdir(cwd)
    sys.argv = ["-c"]
    faulthandler.disable()  # pytest's writes to a descriptor of its own
    for fd in STDIO:
        name = ("stdin", "stdout", "stderr")[fd]
        stream = open(fd, "w" if fd else "r", closefd=False, errors="backslashreplace")
        if fd:
            stream.reconfigure(line_buffering=True, write_through=True)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    torch = sys.modules.get("torch")
    if torch is not None:  # its default generator as a fresh import leaves it
        torch.manual_seed(torch.initial_seed())
