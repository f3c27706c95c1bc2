"""A Python process that imports torch, transformers and pytest once, then forks a child for
each run that the check asks for.

A chapter's main or test run starts by importing the same heavy libraries: 3 to 4 seconds of
one core, before any of the book's code runs. `tools/steps.py check` starts ~50 such runs, and
`tools/exercise.py verify` ~50 more. Forked from this process, a run starts in a fraction of a
second. Nothing of the book is imported here (not `minisgl`, not `tools`, not `tests`): each
child sets up its own environment, path and isolation guard (tools/guard/sitecustomize.py)
exactly as a fresh interpreter would, then runs its script or module.

    server = Preloader.start()                       # in the check
    proc = server.spawn([sys.executable, "examples/ch06_engine.py"], cwd, env, out, err)
    proc.wait(timeout=600)                           # like subprocess.Popen

The child is the leader of a session of its own, so `tools/supervise.py` watches, dumps and
kills its process group as it does for a process started with Popen. If the run starts workers,
their fork server is a copy of it too (tools/warm_forkserver.py). Only the commands
``python SCRIPT ...`` and ``python -m MODULE ...`` go through here; anything else is started
the usual way.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
import threading
import types
from pathlib import Path
from typing import Dict, List, Optional, Sequence

PRELOADED = ("torch", "transformers", "safetensors", "tokenizers", "numpy", "pytest", "zmq")
# transformers imports its model code when a model is first made (about 3.5 s of one core for
# the loading machinery, modeling_utils): that, and the reference models' families
TRANSFORMERS_MODULES = (
    "transformers.modeling_utils",
    "transformers.generation",
    *(
        f"transformers.models.{family}.{part}_{family}"
        for family in ("llama", "qwen2", "qwen3", "mistral")
        for part in ("configuration", "modeling")
    ),
)
HERE = str(Path(__file__).resolve().parent)
PRELOADER_MARK = "preload.py serve"  # in the command line of the server and of its children


# ------------------------------------------------------------------ the server's side
def _warm_forkserver() -> types.ModuleType:
    """tools/warm_forkserver.py, loaded by its path (this folder is not on the runs' path)."""
    module = sys.modules.get("book_warm_forkserver")
    if module is None:
        spec = importlib.util.spec_from_file_location(
            "book_warm_forkserver", Path(HERE) / "warm_forkserver.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["book_warm_forkserver"] = module
        spec.loader.exec_module(module)
    return module


def _child(request: Dict, base_path: List[str]) -> None:
    """Become the run that `request` describes; never returns."""
    try:
        os.setsid()
        os.chdir(request["cwd"])
        import multiprocessing.process

        multiprocessing.process.ORIGINAL_DIR = os.getcwd()  # taken when it was imported here
        os.environ.clear()
        os.environ.update(request["env"])
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        for fd, target in ((null, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=True, write_through=True)  # type: ignore[attr-defined]
    except BaseException:  # noqa: BLE001 - reported on the run's stderr, if it got that far
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    forkserver = _warm_forkserver()

    def ready() -> None:
        # the servers a main starts (chapters 15 and 21): forks of a copy of this process, as
        # the tests' are (tools/warm_launch.py in the run's tree); made first, so that it holds
        # nothing of the fork server's copy
        try:
            from tools import warm_launch
        except ImportError:
            pass
        else:
            warm_launch.install()
        # the run's fork server: a copy of this process (torch imported, nothing of the book)
        forkserver.install()

    forkserver.run_command_line(request["argv"][1:], base_path, ready)


def serve() -> None:
    """Read requests (one JSON object per line) on stdin; answer each with the pid of its
    child, and report each child's exit code when it ends. Stops when stdin closes."""
    import torch

    if not torch.cuda.is_available():
        # Triton runs on a CPU only in its interpreter, which it chooses when triton.language
        # is first imported (transformers' model code imports it): choose before that, as the
        # book's mains and tests do
        os.environ.setdefault("TRITON_INTERPRET", "1")
    for name in (*PRELOADED, *TRANSFORMERS_MODULES):
        try:
            __import__(name)
        except ImportError:
            pass
    _warm_forkserver()
    import transformers  # noqa: F401  (its lazy submodules the runs use)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    # the libraries live as long as the runs: frozen, they are out of the garbage collector's
    # sight (a full collection in a run walks only what the run made) and the children share
    # their pages instead of copying them when a collection would have touched them
    gc.collect()
    gc.freeze()
    base_path = [p for p in sys.path if p and os.path.realpath(p) != HERE]
    children: Dict[int, bool] = {}
    reply = sys.stdout
    sys.stdout = sys.stderr  # nothing a library prints may reach the reply channel
    buffer = b""
    open_input = True
    while open_input or children:
        ready, _, _ = select.select([0] if open_input else [], [], [], 0.05)
        if ready:
            chunk = os.read(0, 65536)
            if not chunk:
                open_input = False
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                request = json.loads(line)
                reply.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    sys.stdout = reply
                    _child(request, base_path)
                children[pid] = True
                reply.write(json.dumps({"id": request["id"], "pid": pid}) + "\n")
                reply.flush()
        for pid, code in _warm_forkserver().ended_children() if children else ():
            children.pop(pid, None)
            reply.write(json.dumps({"exit": pid, "code": code}) + "\n")
            reply.flush()
    gc.unfreeze()  # frozen objects are never freed: extension modules would report them leaked


# ------------------------------------------------------------------ the check's side
class PreloadedProcess:
    """A run forked by the preloader; waits like subprocess.Popen."""

    def __init__(self, pid: int, args: Sequence[str]) -> None:
        self.pid = pid
        self.args = list(args)
        self.returncode: Optional[int] = None
        self._ended = threading.Event()

    def _end(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    def poll(self) -> Optional[int]:
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode


class Preloader:
    """The check's handle on the preloading server."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self._lock = threading.Lock()
        self._answers: Dict[int, threading.Event] = {}
        self._pids: Dict[int, int] = {}
        self._running: Dict[int, PreloadedProcess] = {}
        self._early: Dict[int, int] = {}  # exit codes of runs not registered yet
        self._next = 0
        self._reader = threading.Thread(target=self._read, name="preloader", daemon=True)
        self._reader.start()

    @classmethod
    def start(cls, env: Optional[Dict[str, str]] = None) -> "Preloader":
        env = {k: v for k, v in (env or os.environ).items() if k != "PYTHONPATH"}
        proc = subprocess.Popen(
            [sys.executable, __file__, "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        return cls(proc)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            message = json.loads(line)
            with self._lock:
                if "pid" in message:
                    self._pids[message["id"]] = message["pid"]
                    self._answers[message["id"]].set()
                else:
                    run = self._running.pop(message["exit"], None)
                    if run is None:
                        self._early[message["exit"]] = message["code"]
                    else:
                        run._end(message["code"])
        with self._lock:  # the server is gone: nothing more will end by itself
            for run in self._running.values():
                run._end(-9)
            self._running.clear()

    @staticmethod
    def handles(cmd: Sequence[str]) -> bool:
        return len(cmd) >= 2 and cmd[0] == sys.executable and (cmd[1] == "-m" or cmd[1][0] != "-")

    def spawn(
        self, cmd: Sequence[str], cwd: Path, env: Dict[str, str], stdout: Path, stderr: Path
    ) -> PreloadedProcess:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the preloader exited with {self.proc.returncode}")
        with self._lock:
            self._next += 1
            key = self._next
            self._answers[key] = threading.Event()
            request = {
                "id": key,
                "argv": list(cmd),
                "cwd": str(cwd),
                "env": env,
                "stdout": str(stdout),
                "stderr": str(stderr),
            }
            assert self.proc.stdin is not None
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        if not self._answers[key].wait(30):
            raise RuntimeError("the preloader did not start the run within 30 s")
        with self._lock:
            pid = self._pids.pop(key)
            del self._answers[key]
            run = PreloadedProcess(pid, cmd)
            if pid in self._early:
                run._end(self._early.pop(pid))
            else:
                self._running[pid] = run
        return run

    def stop(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


if __name__ == "__main__" and sys.argv[1:] == ["serve"]:
    serve()
