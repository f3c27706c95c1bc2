"""Run a command so that it can neither hang its caller nor leave a process behind.

The command starts in a session (and process group) of its own, with its output going to
files rather than pipes (a grandchild that keeps a pipe open cannot block the reading of it).

* If it runs past its time, every Python process of the group is asked for its stacks
  (SIGUSR1: ``tools/guard/sitecustomize.py`` registers faulthandler for it, writing each
  process's stacks to a file of its own), then the whole group is killed. The outcome says
  which processes were still running, and where each one was.
* If it ends while processes it started are still alive a little later, they are killed,
  and the outcome lists them: something did not stop what it started.

Linux and macOS (``ps`` lists the group).
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set, Tuple, Union

from tools.preload import PRELOADER_MARK, PreloadedProcess, Preloader

STACKS_ENV = "MINISGL_BOOK_STACKS"  # the folder where each process writes its stacks on SIGUSR1
SETTLE_S = 3.0  # how long the group may take to wind down after its leader exited
DUMP_WAIT_S = 2.0  # how long the stacks may take to be written
KILL_WAIT_S = 5.0  # how long killed processes may take to disappear
# pytest as the tools run it: in one process. The repository's settings (pyproject.toml's
# addopts) spread a plain `pytest` over several worker processes; a tool that records what
# each test ran, or reads the tests' output in order, replaces them with these.
PYTEST_ONE_PROCESS = ["-p", "no:xdist", "-o", "addopts=-p no:anyio --strict-markers"]

_RUNNING: Set[int] = set()  # the process groups of the commands running now
_RUNNING_LOCK = threading.Lock()
_STOPPING = threading.Event()  # set once the caller was interrupted: start nothing more


def stop_everything() -> None:
    """Kill every command still running, with all it started, and start no other: the caller
    was interrupted (the groups are sessions of their own, so a Ctrl-C in the terminal does
    not reach them)."""
    _STOPPING.set()
    with _RUNNING_LOCK:
        groups = list(_RUNNING)
    for pgid in groups:
        _signal_group(pgid, signal.SIGKILL)


@dataclass
class Outcome:
    returncode: Optional[int]  # None: killed for running too long
    stdout: str
    stderr: str
    seconds: float
    stuck: List[str] = field(default_factory=list)  # on a timeout: who ran, and where
    left_behind: List[str] = field(default_factory=list)  # alive after the command ended

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def report(self, what: str, timeout: float) -> List[str]:
        """The problems, as sentences (empty when the command ended well or just failed)."""
        problems = []
        if self.timed_out:
            problems.append(
                f"{what} ran past its {timeout:.0f} s and was killed with every process it "
                f"started; still running were:\n" + "\n".join(self.stuck)
            )
        if self.left_behind:
            problems.append(
                f"{what} left {len(self.left_behind)} process(es) running after it ended "
                f"(now killed):\n" + "\n".join(self.left_behind)
            )
        return problems


def group_members(pgid: int) -> Dict[int, str]:
    """pid -> command line of every live process in the process group `pgid`."""
    listing = subprocess.run(
        ["ps", "-A", "-ww", "-o", "pid=,pgid=,stat=,args="],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    members = {}
    for line in listing.splitlines():
        parts = line.split(None, 3)
        if len(parts) >= 3 and parts[1] == str(pgid) and not parts[2].startswith("Z"):
            members[int(parts[0])] = parts[3] if len(parts) > 3 else ""
    return members


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _settle(pgid: int, seconds: float) -> Dict[int, str]:
    deadline = time.monotonic() + seconds
    members = group_members(pgid)
    while members and time.monotonic() < deadline:
        time.sleep(0.1)
        members = group_members(pgid)
    return members


def _describe(pid: int, args: str, stacks: Path) -> str:
    dump = stacks / f"{pid}.txt"
    lines = dump.read_text(errors="replace").splitlines() if dump.exists() else []
    if lines and PRELOADER_MARK in args:  # forked by tools/preload.py: its own argv says more
        args = lines[0]
    text = f"  pid {pid}: {args[:160]}"
    stack = [line for line in lines[1:] if line.strip()]
    return text + "".join(f"\n      {line.strip()}" for line in stack[:40])


_PRELOADER: Optional[Preloader] = None


def use_preloader(preloader: Optional[Preloader]) -> None:
    """Start Python commands from `preloader` (tools/preload.py) from now on; None: fresh."""
    global _PRELOADER
    _PRELOADER = preloader


def _start(
    cmd: Sequence[str], cwd: Path, env: Dict[str, str], out_path: Path, err_path: Path
) -> Union[subprocess.Popen, PreloadedProcess]:
    if _PRELOADER is not None and _PRELOADER.handles(cmd):
        return _PRELOADER.spawn(cmd, cwd, env, out_path, err_path)
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        return subprocess.Popen(
            list(cmd), cwd=cwd, env=env, stdout=out, stderr=err, start_new_session=True
        )


def run(
    cmd: Sequence[str], cwd: Path, env: Dict[str, str], timeout: float, nice: int = 0
) -> Outcome:
    """Run `cmd` in a process group of its own; `nice` > 0 lowers its priority (set before it
    starts threads or processes, which inherit it)."""
    if _STOPPING.is_set():
        raise KeyboardInterrupt("interrupted: no new command is started")
    begin = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="minisgl-supervise-") as work:
        stacks = Path(work) / "stacks"
        stacks.mkdir()
        env = {**env, STACKS_ENV: str(stacks)}
        out_path, err_path = Path(work) / "stdout", Path(work) / "stderr"
        proc = _start(cmd, cwd, env, out_path, err_path)
        with _RUNNING_LOCK:
            _RUNNING.add(proc.pid)
        try:
            if nice > 0:
                _lower_priority(proc.pid, nice)
            returncode, stuck, left = _watch(proc, timeout, stacks)
        except BaseException:  # Ctrl-C or SIGTERM while it ran: nothing may outlive us
            _signal_group(proc.pid, signal.SIGKILL)
            raise
        finally:
            with _RUNNING_LOCK:
                _RUNNING.discard(proc.pid)
        stdout = out_path.read_text(errors="replace")
        stderr = err_path.read_text(errors="replace")
    return Outcome(returncode, stdout, stderr, time.perf_counter() - begin, stuck, left)


def _lower_priority(pid: int, nice: int) -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    except OSError:  # gone already, or a system that refuses: it runs at the usual priority
        pass


def _watch(
    proc: Union[subprocess.Popen, PreloadedProcess], timeout: float, stacks: Path
) -> Tuple[Optional[int], List[str], List[str]]:
    """Wait for the command; (its exit code or None if it ran too long, who was stuck and
    where, who was left behind). Its group is empty afterwards."""
    stuck: List[str] = []
    left: List[str] = []
    try:
        returncode: Optional[int] = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        returncode = None
        members = group_members(proc.pid)
        _signal_group(proc.pid, signal.SIGUSR1)
        time.sleep(DUMP_WAIT_S)
        stuck = [_describe(pid, args, stacks) for pid, args in sorted(members.items())]
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
    remaining = _settle(proc.pid, SETTLE_S if returncode is not None else 1.0)
    if remaining:
        if returncode is not None:
            left = [f"  pid {pid}: {args[:160]}" for pid, args in sorted(remaining.items())]
        _signal_group(proc.pid, signal.SIGKILL)
        _settle(proc.pid, KILL_WAIT_S)  # a SIGKILL takes effect a moment later, not at once
    return returncode, stuck, left
