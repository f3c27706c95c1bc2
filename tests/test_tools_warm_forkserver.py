"""tools/warm_forkserver.py: the fork server is the waiting copy of the process that
made it, and a worker started from it sees what a fresh fork server's worker would see."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import os, sys


def probe(queue):
    print("a line from the worker", flush=True)
    queue.put({
        "pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(),
        "variable": os.environ.get("WARM_PROBE"), "inherited": "imported_first" in sys.modules,
        "main": sys.modules["__main__"].__name__,
    })
"""

# a worker started from the fork server: what it saw, and the fork server's pid
START_WORKER = """
ctx = mp.get_context("forkserver")
ctx.set_forkserver_preload(["probe"])
queue = ctx.Queue()
worker = ctx.Process(target=__import__("probe").probe, args=(queue,))
worker.start()
seen = queue.get(timeout=60)
worker.join(60)
from multiprocessing import forkserver
server = forkserver._forkserver._forkserver_pid
"""

SCRIPT = """
import json, multiprocessing as mp, os, sys
sys.path[:0] = [{root!r}, {folder!r}]
import imported_first  # what the copy has, and a fresh interpreter would not
from tools.warm_forkserver import install, zygote_pid
assert install()
copy = zygote_pid()
os.environ["WARM_PROBE"] = "set after the copy was made"
os.chdir({work!r})
"""
SCRIPT += START_WORKER + 'print(json.dumps({{"copy": copy, "server": server, **seen}}))'


def run(tmp_path: Path, script: str) -> subprocess.CompletedProcess:
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "imported_first.py").write_text("")
    (tmp_path / "work").mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )  # fmt: skip


def test_the_fork_server_is_the_copy_and_its_worker_sees_the_moment_it_started(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    proc = run(tmp_path, SCRIPT.format(root=str(ROOT), folder=str(tmp_path), work=str(work)))
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["server"] == seen["copy"] == seen["ppid"]  # forked from the copy
    assert seen["inherited"]  # it had what its parent had imported before the copy was made
    assert seen["variable"] == "set after the copy was made"  # the environment of the spawn
    assert seen["cwd"] == str(work)
    assert seen["main"] == "__main__"
    assert "a line from the worker" in proc.stdout  # the parent's stdout at the spawn


def test_the_copy_takes_descriptors_whose_numbers_collide_with_its_own(tmp_path: Path) -> None:
    """The parent closes its end of the copy's channel once the copy is made, so the fork
    server's first socket often gets that number; and the numbers the copy gives the received
    descriptors may be ones it is still holding others under. Started at once after the copy
    is made (nothing else takes the freed number first), the server still works."""
    script = SCRIPT.replace(
        "os.chdir({work!r})\n",
        "os.chdir({work!r})\nfrom multiprocessing import forkserver\nforkserver.ensure_running()\n",
    )
    script = script.format(root=str(ROOT), folder=str(tmp_path), work=str(tmp_path / "work"))
    for _ in range(3):
        proc = run(tmp_path, script)
        assert proc.returncode == 0, proc.stderr
        seen = json.loads(proc.stdout.strip().splitlines()[-1])
        assert seen["server"] == seen["copy"] == seen["ppid"]


def test_the_copy_gives_each_descriptor_its_number_even_where_they_cross(tmp_path: Path) -> None:
    """Three pipes received as 3 descriptors that must become numbers the renumbering itself
    would otherwise use: each read end lands where it was asked to."""
    script = f"""
import os, sys
sys.path.insert(0, {str(ROOT)!r})
from tools.warm_forkserver import _take
pipes = [os.pipe() for _ in range(3)]
for i, (_, w) in enumerate(pipes):
    os.write(w, bytes([65 + i]))
received = [os.dup(r) for r, _ in pipes]
free = sorted(r for r, _ in pipes)
for r, _ in pipes:
    os.close(r)
_take(received, [free[1], free[2], free[0]])  # a plain dup would take free[0], [1], [2]
print("".join(os.read(fd, 1).decode() for fd in (free[1], free[2], free[0])))
"""
    proc = run(tmp_path, script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ABC"


def test_an_unused_copy_ends_with_its_parent_and_threads_prevent_one(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys, threading, time
        sys.path.insert(0, {str(ROOT)!r})
        from tools import warm_forkserver
        busy = threading.Thread(target=time.sleep, args=(1,))
        busy.start()
        assert not warm_forkserver.install()  # a second thread: no copy
        busy.join()
        assert warm_forkserver.install()
        print(warm_forkserver.zygote_pid())
    """)
    proc = run(tmp_path, script)
    assert proc.returncode == 0, proc.stderr
    copy = int(proc.stdout.split()[-1])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{copy}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    state = (
        Path(f"/proc/{copy}/stat").read_text().split()[2] if Path(f"/proc/{copy}").exists() else ""
    )
    assert state in ("", "Z")  # gone (or a zombie waiting for init to reap it)


ON_DEMAND = """
import json, multiprocessing as mp, os, sys, threading, time
sys.path[:0] = [{root!r}, {folder!r}]
import imported_first  # a fork of this process has it, a fresh interpreter would not
from tools.warm_forkserver import fork_on_demand
fork_on_demand()
busy = threading.Thread(target=time.sleep, args=(3,))
if {busy!r}:
    busy.start()  # a second thread: no fork, the usual fresh interpreter
"""
ON_DEMAND += START_WORKER + 'print(json.dumps({{"server": server, **seen}}))'


def test_on_demand_the_fork_server_is_a_fork_made_at_its_spawn_unless_threads_run(
    tmp_path: Path,
) -> None:
    for busy in (False, True):
        script = ON_DEMAND.format(root=str(ROOT), folder=str(tmp_path), busy=busy)
        proc = run(tmp_path, script)
        assert proc.returncode == 0, proc.stderr
        seen = json.loads(proc.stdout.strip().splitlines()[-1])
        assert seen["ppid"] == seen["server"] and seen["main"] == "__main__"
        assert seen["inherited"] is not busy  # forked, or (a thread running) a fresh interpreter
        assert "a line from the worker" in proc.stdout
