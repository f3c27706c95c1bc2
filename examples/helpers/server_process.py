"""`python -m minisgl` as a child process on a free port, for chapter 15's main and tests: it
waits until /health answers (or the server dies, or the time is up), and it stops the server
and every worker it started when the block ends, however it ends."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, List, Tuple

from tools.warm_launch import LaunchedProcess, popen

START_TIMEOUT_S = 180.0  # loading a model and starting three processes; a slow CI machine
STOP_TIMEOUT_S = 20.0
ROOT = Path(__file__).resolve().parents[2]


def child_env(**variables: str) -> Dict[str, str]:
    """This process's environment for a child that runs the repository's `minisgl`: the
    repository first on PYTHONPATH, what was there kept (under `tools/steps.py check`, the
    isolation guard that records what the child runs), `variables` on top."""
    path = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
    return dict(os.environ, PYTHONPATH=path, **variables)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """with ServerProcess(model_folder, "--num-pages", "512") as server: server.url ..."""

    def __init__(self, model: str | Path, *flags: str) -> None:
        self.port = free_port()
        self.command = [sys.executable, "-m", "minisgl", "--model", str(model),
                        "--port", str(self.port), *flags]  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="minisgl-server-", suffix=".log")
        self.process: subprocess.Popen | LaunchedProcess | None = None

    def __enter__(self) -> ServerProcess:
        # the log at INFO whatever this process has: it goes to a file, and tests read it
        env = child_env(PYTHONUNBUFFERED="1", LOG_LEVEL="INFO")
        # a session of its own: the server and its workers are one process group to stop.
        # A fresh interpreter; under the tests, a fork of a warm one (tools/warm_launch.py)
        self.process = popen(self.command, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type: type | None, *_: object) -> None:
        if exc_type is not None and self.process is not None:  # what the server said, too
            print(f"the server's log ends with:\n{self.output()[-6000:]}", file=sys.stderr)
        self.stop()

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the server exited with code {self.process.returncode} while starting:\n"
                    f"{self.output()[-4000:]}"
                )
            try:
                status, _ = self.get("/health", timeout=2.0)
                if status == 200:
                    return
            except OSError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer on {self.url}/health after {START_TIMEOUT_S} s")
            time.sleep(0.2)

    def stop(self) -> int | None:
        """SIGTERM (uvicorn stops, then the launcher stops its workers); SIGKILL to the whole
        group if that takes too long. Returns the server's exit code."""
        if self.process is None:
            return None
        code = self.process.poll()
        if code is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                code = self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                code = None
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # any worker left behind
        except ProcessLookupError:
            pass
        if code is None:
            code = self.process.wait(5.0)
        self.log.close()
        self.process = None
        return code

    # a tiny HTTP client (the standard library's), for what the openai package cannot send
    def get(self, path: str, timeout: float = 30.0) -> Tuple[int, str]:
        return self._request(urllib.request.Request(self.url + path), timeout)

    def post(self, path: str, body: Dict | str | bytes, timeout: float = 60.0) -> Tuple[int, str]:
        data = body if isinstance(body, bytes) else (
            body if isinstance(body, str) else json.dumps(body)).encode()  # fmt: skip
        request = urllib.request.Request(self.url + path, data=data, method="POST",
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        return self._request(request, timeout)

    @staticmethod
    def _request(request: urllib.request.Request, timeout: float) -> Tuple[int, str]:
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def metrics(self) -> Dict[str, float]:
        """GET /metrics as {name: value}, for the lines without labels."""
        status, text = self.get("/metrics")
        assert status == 200, text
        values: Dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#") and "{" not in line:
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def metrics_when_idle(self, timeout: float = 30.0) -> Dict[str, float]:
        """/metrics once the scheduler is idle and has passed its integrity check (every KV
        page free or cached, every request slot free): it runs the check when it runs out of
        work, a moment after the last reply, and shows it passed as
        minisgl_idle_integrity_verified = 1. A failed check stops the scheduler."""
        deadline = time.monotonic() + timeout
        while (values := self.metrics()).get(VERIFIED) != 1:
            if time.monotonic() > deadline:
                shown = {name: values.get(name) for name in (VERIFIED, *BUSY)}
                raise TimeoutError(f"the server is not idle after {timeout} s: {shown}")
            time.sleep(0.1)
        assert all(values[name] == 0 for name in BUSY), values
        return values


VERIFIED = "minisgl_idle_integrity_verified"
BUSY = ("minisgl_requests_running", "minisgl_requests_waiting", "minisgl_kv_pages_used")


def sse_events(text: str) -> List[str]:
    """The data of each event of a server-sent-events body (an event's lines joined with
    newlines, as the standard says)."""
    events = []
    for block in text.split("\n\n"):
        lines = [line[len("data: ") :] for line in block.split("\n") if line.startswith("data: ")]
        if lines:
            events.append("\n".join(lines))
    return events


def sse_data(text: str) -> List[Dict]:
    """The JSON events of a server-sent-events body, without the closing [DONE]."""
    events = sse_events(text)
    assert events and events[-1] == "[DONE]", f"the stream did not end with [DONE]: {text[-200:]}"
    return [json.loads(e) for e in events[:-1]]
