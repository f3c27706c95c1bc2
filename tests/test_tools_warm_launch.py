"""tools/warm_launch.py: a run that the launcher forks is the run a fresh interpreter would be
(its path, arguments, working folder, environment, streams, session, terminal), and it is
waited for, reported and stopped like one."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tools import warm_launch

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import json, os, sys, time, warnings

what = sys.argv[1]
if what == "sleep":
    print("asleep", flush=True)
    time.sleep(600)
if what == "terminal":  # the terminal on its stdin is its own, and it leads the foreground
    print(json.dumps([os.isatty(0), os.tcgetpgrp(0) == os.getpgrp() == os.getpid()]))
    sys.exit(0)
print(json.dumps({
    "argv": sys.argv, "cwd": os.getcwd(), "path": sys.path, "variable": os.environ.get("PROBE"),
    "leads_its_session": os.getsid(0) == os.getpid(),
    "package": [m for m in sys.modules if m.split(".")[0] == "minisgl"],
    "main": sys.modules["__main__"].__file__,
    "warnings": [(action, getattr(message, "pattern", message) or "", category.__name__,
                  getattr(module, "pattern", module) or "", lineno)
                 for action, message, category, module, lineno in warnings.filters],
    "finders": [type(finder).__module__ for finder in sys.meta_path],
}))
sys.stderr.write("to stderr\\n")
sys.exit(int(what))
"""


@pytest.fixture
def probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "probe.py").write_text(PROBE)
    monkeypatch.chdir(tmp_path)  # `python -m probe` finds it in the working folder
    return tmp_path


def _env(**variables: str) -> dict:
    return dict(os.environ, **variables)


def test_the_tests_have_a_launcher() -> None:
    assert warm_launch._channel is not None, "tests/conftest.py did not install the launcher"


def test_a_launched_run_sees_what_a_fresh_interpreter_sees(probe: Path) -> None:
    command = [sys.executable, "-m", "probe", "3"]
    env = _env(PROBE="a value")
    fresh = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env,
                           start_new_session=True)  # fmt: skip
    warm = warm_launch.run(command, env=env, timeout=60)
    assert (warm.returncode, warm.stderr) == (fresh.returncode, fresh.stderr) == (3, "to stderr\n")
    seen, expected = json.loads(warm.stdout), json.loads(fresh.stdout)
    # import hooks: those of the libraries imported already (transformers has one), not pytest's
    finders = seen.pop("finders")
    assert not any(module.startswith("_pytest") for module in finders)
    assert set(expected.pop("finders")) <= set(finders)
    assert seen == expected
    assert seen["cwd"] == str(probe) and seen["variable"] == "a value" and seen["package"] == []
    assert seen["leads_its_session"] and seen["path"][0] == str(probe)
    assert seen["argv"] == [str(probe / "probe.py"), "3"]


def test_a_run_is_waited_for_with_a_bound_and_stopped_by_a_signal(probe: Path) -> None:
    out = probe / "out.txt"
    with out.open("wb") as log:
        process = warm_launch.popen([sys.executable, "-m", "probe", "sleep"], stdout=log,
                                    stderr=subprocess.STDOUT)  # fmt: skip
    assert isinstance(process, warm_launch.LaunchedProcess)
    try:
        deadline = time.monotonic() + 30
        while "asleep" not in out.read_text():
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.05)
        assert os.getpgid(process.pid) == process.pid  # its own group: killpg stops it all
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(0.2)
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == -signal.SIGTERM and process.poll() == -signal.SIGTERM
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def test_a_run_on_a_terminal_has_it_as_its_controlling_terminal(probe: Path) -> None:
    master, slave = pty.openpty()
    try:
        process = warm_launch.popen([sys.executable, "-m", "probe", "terminal"], stdin=slave,
                                    stdout=slave, stderr=slave, terminal=True)  # fmt: skip
        os.close(slave)
        assert process.wait(30) == 0
        text = b""
        while select.select([master], [], [], 1.0)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the terminal closed with its last holder
                break
            if not chunk:
                break
            text += chunk
        assert json.loads(text.decode().strip().splitlines()[-1]) == [True, True]
    finally:
        os.close(master)


def test_other_commands_start_as_usual() -> None:
    process = warm_launch.popen([sys.executable, "-c", "pass"])
    assert isinstance(process, subprocess.Popen) and process.wait(30) == 0


def test_the_launcher_stops_what_its_caller_left_running(probe: Path) -> None:
    """A caller that dies without stopping its run: the launcher kills the run and exits."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from tools import warm_launch
        assert warm_launch.install()
        process = warm_launch.popen([sys.executable, "-m", "probe", "sleep"],
                                    stdout=open("left.txt", "wb"))
        print(process.pid, flush=True)
    """)  # and it exits without waiting for its run
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=_env(PYTHONPATH=str(ROOT)))  # fmt: skip
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout)
    deadline = time.monotonic() + 20
    while _alive(pid):
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            pytest.fail(f"the run {pid} outlived its caller by 20 s")
        time.sleep(0.1)


def test_without_its_launcher_a_caller_starts_fresh_interpreters(probe: Path) -> None:
    code = textwrap.dedent(f"""
        import os, signal, subprocess, sys
        sys.path.insert(0, {str(ROOT)!r})
        from tools import warm_launch
        assert warm_launch.install()
        os.kill(warm_launch._launcher_pid, signal.SIGKILL)
        os.waitpid(warm_launch._launcher_pid, 0)
        done = warm_launch.run([sys.executable, "-m", "probe", "5"], env=dict(os.environ),
                               timeout=60)
        assert warm_launch._channel is None and done.returncode == 5, done
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=_env(PYTHONPATH=str(ROOT)))  # fmt: skip
    assert done.returncode == 0, done.stderr


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"
