"""benchmark/offline/bench.py and benchmark/online/bench_simple.py, upstream's two benchmark
scripts on this package: each runs, at a small size, and reports what it measured."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from examples.helpers.server_process import ServerProcess

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> str:
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def test_the_offline_script_generates_every_token_it_asked_for(model_path) -> None:
    model_path("tiny-qwen3")
    out = run("benchmark/offline/bench.py", "--model", "tiny-qwen3", "--num-seqs", "6",
              "--max-input-len", "40", "--max-output-len", "9")  # fmt: skip
    from minisgl.benchmark.offline import make_offline_workload

    asked = make_offline_workload(6, 40, 9, min_input_len=40, min_output_len=9).output_tokens
    assert re.fullmatch(rf"Total: {asked}tok, Time: [\d.]+s, Throughput: [\d.]+tok/s\n", out)


def test_the_online_script_measures_a_running_server(model_path) -> None:
    with ServerProcess(model_path("tiny-qwen3"), "--num-pages", "1024") as server:
        port = server.url.rsplit(":", 1)[1]
        out = run("benchmark/online/bench_simple.py", "--port", port, "--num-requests", "4",
                  "--max-input", "64", "--max-output", "12")  # fmt: skip
    lines = out.splitlines()
    assert re.fullmatch(r"requests 4, generated tokens \d+", lines[0])
    assert [line.split()[0] for line in lines[1:]] == ["TTFT", "TPOT", "ITL", "E2E", "duration"]
