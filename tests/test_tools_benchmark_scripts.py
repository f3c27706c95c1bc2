"""benchmark/offline/bench.py and benchmark/online/bench_simple.py, upstream's two benchmark
scripts on this package: each runs, at a small size, and reports what it measured; and the CPU
modes of tools/bench_tp.py, the multi-GPU script of chapter 16."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import List

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


def test_the_tp_script_compares_tokens_and_tables_throughput_on_the_cpu(
    model_path, tmp_path
) -> None:
    """tools/bench_tp.py's CPU modes, small, the two at once: chapter 16's tree at TP=2
    against transformers, and the throughput table at TP=1 and 2 (issue 15's GPU run is the
    same code with NCCL)."""
    model_path("tiny-qwen3")
    cpu = ["tools/bench_tp.py", "--device", "cpu", "--budget", "200"]
    parity = ["parity", "--chapters", "16", "--models", "tiny-qwen3", "--sizes", "2"]
    throughput = ["throughput", "--sizes", "1,2", "--jobs", "2", "--out", str(tmp_path)]
    compared, measured = run_together([*cpu, *parity], [*cpu, *throughput])
    assert re.search(r"^  tiny-qwen3 +2 +3 +96 +96 +0\.\d{4}$", compared, re.MULTILINE), compared
    assert "parity TP: chapters=1 tokens=96/96 " in compared
    rows = [line.split(" | ") for line in (tmp_path / "ch16-tp-cpu.md").read_text().splitlines()]
    tp = {row[2]: row for row in rows if row[0] == "| tiny Qwen3 shape"}
    assert sorted(tp) == ["1", "2"], rows
    assert tp["1"][3] == tp["2"][3] != "0"  # the same output tokens at both sizes
    assert tp["1"][8:] == ["-", "- |"]  # one rank: no all-reduce
    assert float(tp["2"][8].replace(",", "")) > 0, tp["2"]  # gloo's all-reduce was timed
    assert "throughput: OK" in measured


def run_together(*commands: List[str]) -> List[str]:
    """`python *command` for each command, all at once; what each printed."""
    # each in a session of its own: on a failure, its whole group (ranks, servers) is stopped
    procs = [subprocess.Popen([sys.executable, *c], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
             for c in commands]  # fmt: skip
    try:
        outputs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # what is left of it; nothing if it finished
            except ProcessLookupError:
                pass
            p.wait()
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, out[-2000:] + err[-2000:]
    return [out for out, _ in outputs]
