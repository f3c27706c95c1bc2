"""Tensor parallelism on several GPUs (chapter 16): token parity of every chapter from 16 on,
the server, and throughput at TP=1, 2 and 4.

    python tools/bench_tp.py parity       # every chapter from 16 on, TP=2 and TP=4
    python tools/bench_tp.py serve        # python -m minisgl --tp-size 2, the openai client
    python tools/bench_tp.py throughput   # docs/data/ch16-tp-gpu.md (and .json)
    python tools/bench_tp.py all --out DIR   # the three in order; the table and JSON in DIR

Each takes `--device cpu` to run the same code with gloo, one process per rank, at small
sizes (how it is tested on a machine without GPUs); `--device cuda`, the default, puts rank r
on GPU r, with NCCL. NVLink multicast stays off in every process (NCCL_NVLS_ENABLE=0).

**parity.** Each chapter's tree is built as `tools/steps.py build` builds it, and a child
process runs in it alone (tools/isolation.py: only that tree's `minisgl` is importable; this
file is copied into its tools/ to run there). For tiny Qwen3 (4 query and 2 key/value heads)
and tiny Mistral (1 key/value head: every rank keeps a copy) at each TP size, scheduler ranks
(examples/helpers/ranks.py) generate 32 greedy tokens for 3 prompts in float32, compared
token by token with transformers' on the CPU in float32 (tools/parity.py). Chapters run side
by side (`--jobs`).

**serve.** `python -m minisgl --tp-size 2` (this checkout's package) answers one chat request
from the `openai` client; the answer must be transformers' greedy one, with exact usage.

**throughput.** Upstream's offline workload (tools/bench_gpu.py's `workload`) on Qwen3-0.6B's
shape and on Qwen3-8B's (random weights, bfloat16, FlashInfer, page size 256, overlap on), at
each TP size the GPUs allow, with CUDA graphs and without. Every configuration is a fresh
child process (tools/bench_tp_child.py says what it does: warm-up, timed run, then a profiled
window of decode steps for the all-reduce's share); configurations that need fewer GPUs than
the machine has run side by side on disjoint GPUs (tools/bench_tp_throughput.py;
`--one-at-a-time` runs them alone). Each result is printed, and the table and JSON rewritten,
as it arrives: a run that fails later loses nothing. `--from-json FILE` makes the table again
from a saved JSON.

Every child has a time limit and is stopped, with everything it started, pass or fail
(tools/supervise.py). Expected on 4 H200s (estimated from the one-GPU runs of bench_gpu.py;
each part prints its time): parity 1-2 min (8 chapters side by side, 4 sets of ranks each),
serve about 30 s, throughput about 5 min (12 configurations of 20-30 s start-up and 5-40 s
timed each, up to four at once). `all` starts no configuration with less than a minute left
of its `--budget` (500 s: the lent machine's command limit is 600 s, set-up included).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.bench_tp_child import (  # noqa: E402
    fitting,
    problems_of,
    run_child,
    set_environment,
    time_left,
)

OUT_DIR = ROOT / "docs" / "data"
FIRST_CHAPTER = 16
PARITY_MODELS = ["tiny-qwen3", "tiny-mistral"]  # 4 heads split 4 ways; 1 key/value head copied
NEW_TOKENS = 32  # chapter 16's main generates as many: transformers' answers are cached
SERVE_MODEL, SERVE_TOKENS = "tiny-qwen3", 12
QUESTION = "What is the capital of France?"
PARITY_TIMEOUT_S, SERVE_TIMEOUT_S = 300, 240


# ----------------------------------------------------------------------------- parity
def parity(
    device: str, chapters: List[int], models: List[str], sizes: List[int], jobs: int,
    deadline: float,
) -> bool:  # fmt: skip
    """Every chapter's tree, each in a child of its own; prints each chapter's comparisons as
    it ends, then one line per chapter. True if every token matched."""
    from tools.book import Book, label_of
    from tools.steps import parse_parity

    book = Book(ROOT)
    numbers = chapters or [m.number for m in book.chapters if m.number >= FIRST_CHAPTER]
    sizes = fitting(sizes, device)
    if not sizes:
        return False
    print(f"parity on {device}: chapters {', '.join(map(label_of, numbers))}; "
          f"{', '.join(models)} at TP {', '.join(map(str, sizes))}", flush=True)  # fmt: skip
    rows: Dict[int, Tuple[Any, float]] = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {
            pool.submit(chapter_parity, book, n, device, models, sizes, deadline): n
            for n in numbers
        }
        for future in as_completed(futures):
            name = book.chapter(futures[future]).name
            outcome, timeout = future.result()
            found = parse_parity(outcome.stdout) if outcome.returncode == 0 else None
            rows[futures[future]] = (found, outcome.seconds)
            print(f"\n{name} ({outcome.seconds:.0f} s):")
            print("".join(f"  {line}\n" for line in outcome.stdout.splitlines()), end="")
            print("".join(f"{p}\n" for p in problems_of(outcome, f"{name}'s child", timeout)),
                  end="", flush=True)  # fmt: skip
    return show_parity_summary(rows, label_of)


def chapter_parity(
    book: Any, number: int, device: str, models: List[str], sizes: List[int], deadline: float
) -> Tuple[Any, float]:
    """Build chapter `number`'s tree, copy this tool in, and run its parity child there alone;
    (its Outcome, its time limit)."""
    from tools.book import folder_of
    from tools.isolation import isolated_env

    work = Path(tempfile.mkdtemp(prefix=f"minisgl-tp-{folder_of(number)}-"))
    try:
        tree = book.build(number, work / "tree")
        for name in ("bench_tp.py", "bench_tp_child.py"):
            shutil.copy2(ROOT / "tools" / name, tree / "tools" / name)
        env = isolated_env(book.package, number, tree)
        cmd = [sys.executable, str(tree / "tools" / "bench_tp.py"), "--child", "parity",
               device, ",".join(models), ",".join(map(str, sizes))]  # fmt: skip
        timeout = max(1.0, min(PARITY_TIMEOUT_S, time_left(deadline)))
        return run_child(cmd, tree, env, timeout), timeout
    finally:
        shutil.rmtree(work, ignore_errors=True)


def show_parity_summary(rows: Dict[int, Tuple[Any, float]], label_of: Callable) -> bool:
    print(f"\n{'chapter':8s} {'tokens':>7s} {'matched':>7s} {'min margin':>10s} {'seconds':>7s}")
    matched = total = 0
    margin = float("inf")
    for number in sorted(rows):
        found, seconds = rows[number]
        if found is None:
            print(f"{label_of(number):8s} {'failed':>7s} {'':>7s} {'':>10s} {seconds:7.0f}")
            continue
        matched, total = matched + found.matched, total + found.total
        margin = min(margin, found.margin)
        print(f"{label_of(number):8s} {found.total:7d} {found.matched:7d} {found.margin:10.4f} "
              f"{seconds:7.0f}")  # fmt: skip
    ok = total > 0 and matched == total and all(found for found, _ in rows.values())
    print(f"parity TP: chapters={len(rows)} tokens={matched}/{total} min_margin={margin:.4f} "
          f"{'OK' if ok else 'FAILED'}", flush=True)  # fmt: skip
    return ok


def child_parity(device: str, models: List[str], sizes: List[int]) -> int:
    """In a chapter's tree: every model at every TP size, against transformers."""
    import torch

    from examples.helpers.ranks import Ranks
    from minisgl.distributed import DistributedInfo
    from minisgl.scheduler import SchedulerConfig
    from tools.models import ensure_model
    from tools.parity import Case, build_prompts, run_parity_cases

    def cases_for(name: str) -> List[Case]:
        return [Case(f"prompt {i}", p, NEW_TOKENS) for i, p in enumerate(build_prompts(name))]

    def generate(name: str, cases: List[Case], run: int) -> List[List[int]]:
        config = SchedulerConfig(
            model_path=str(ensure_model(name)), tp_info=DistributedInfo(0, sizes[run]),
            dtype=torch.float32, max_running_req=8, page_size=4, num_page_override=256,
        )  # fmt: skip
        with Ranks(config) as ranks:
            return ranks.generate([c.prompt for c in cases], NEW_TOKENS)

    where = "GPUs (NCCL)" if device == "cuda" else "the CPU (gloo)"
    print(f"each rank a process on {where}, float32; transformers on the CPU, float32")
    summary = run_parity_cases(
        generate, cases_for, models, runs=lambda name: len(sizes),
        run_label=("ranks", lambda name, run: str(sizes[run])),
    )  # fmt: skip
    return 0 if summary.ok else 1


# ------------------------------------------------------------------------------ serve
def serve(device: str, deadline: float) -> bool:
    if not fitting([2], device):
        return False
    timeout = max(1.0, min(SERVE_TIMEOUT_S, time_left(deadline)))
    outcome = run_child([sys.executable, __file__, "--child", "serve", device], ROOT,
                        dict(os.environ), timeout)  # fmt: skip
    print(f"\nserve ({outcome.seconds:.0f} s):\n{outcome.stdout}", end="")
    problems = problems_of(outcome, "the server's child", timeout)
    print("".join(f"{p}\n" for p in problems), end="", flush=True)
    return not problems


def child_serve(device: str) -> int:
    """`python -m minisgl --tp-size 2` and one chat request from the openai client."""
    import openai
    import torch

    from examples.helpers.server_process import ServerProcess
    from tools.models import ensure_model
    from tools.parity import hf_references, load_tokenizer

    tok = load_tokenizer(SERVE_MODEL)
    messages = [{"role": "user", "content": QUESTION}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt = tok(text, add_special_tokens=False).input_ids  # as the tokenizer worker does
    ref = hf_references(SERVE_MODEL, [prompt], SERVE_TOKENS, "cpu", torch.float32)[0]
    expected = tok.decode(ref.tokens).removesuffix(tok.eos_token or "")
    flags = ["--tp-size", "2", "--dtype", "float32", "--num-pages", "256"]
    print(f"python -m minisgl --model {SERVE_MODEL} {' '.join(flags)}, on {device}")
    with ServerProcess(ensure_model(SERVE_MODEL), *flags) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
        answer = client.chat.completions.create(
            model=SERVE_MODEL, messages=messages, max_tokens=SERVE_TOKENS, temperature=0,
            timeout=120,
        )  # fmt: skip
    got = answer.choices[0].message.content
    usage = (answer.usage.prompt_tokens, answer.usage.completion_tokens)
    ok = got == expected and usage == (len(prompt), len(ref.tokens))
    print(f"  asked {QUESTION!r} (chat), {SERVE_TOKENS} tokens at temperature 0")
    print(f"  answer       {got!r}\n  transformers {expected!r}")
    print(f"  usage {usage[0]} + {usage[1]} tokens, transformers {len(prompt)} + {len(ref.tokens)}")
    print(f"serve: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


# ------------------------------------------------------------------------ command line
def child_main(argv: List[str]) -> int:
    """`--child parity DEVICE MODELS SIZES`, `--child serve DEVICE`, `--child throughput SPEC`."""
    what, rest = argv[0], argv[1:]
    if what == "parity":
        return child_parity(rest[0], rest[1].split(","), [int(s) for s in rest[2].split(",")])
    if what == "serve":
        return child_serve(rest[0])
    from tools.bench_gpu import print_result
    from tools.bench_tp_child import measure

    print_result(measure(json.loads(rest[0])))
    return 0


def parse_args(argv: List[str]) -> argparse.Namespace:
    from tools.book import parse_chapter

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("part", choices=["parity", "serve", "throughput", "all"])
    add("--device", choices=["cuda", "cpu"], default="cuda")
    add("--out", type=Path, default=OUT_DIR, help="throughput: where the table and JSON go")
    add("--budget", type=float, default=500.0, help="seconds for all parts together")
    add("--chapters", type=lambda t: [parse_chapter(c) for c in t.split(",")], default=[],
        help="parity: these chapters (default: 16 on)")  # fmt: skip
    add("--models", type=lambda t: t.split(","), default=PARITY_MODELS, help="parity")
    add("--sizes", type=lambda t: [int(s) for s in t.split(",")],
        help="TP sizes (default: parity 2,4; throughput 1,2,4)")  # fmt: skip
    add("--jobs", type=int, help="chapters side by side (parity; default 8, on the CPU 1), "
        "configurations side by side on the CPU (throughput; default 1)")  # fmt: skip
    add("--shapes", type=lambda t: t.split(","), help="throughput: 0.6b,8b (CPU: tiny)")
    add("--graphs", type=lambda t: [g == "on" for g in t.split(",")], help="throughput: on,off")
    add("--one-at-a-time", action="store_true", help="throughput: one configuration at a time")
    add("--from-json", type=Path, help="throughput: the table again, from its saved JSON")
    return parser.parse_args(argv)


def main(argv: List[str]) -> int:
    if argv[:1] == ["--child"]:
        return child_main(argv[1:])
    args = parse_args(argv)
    from tools.bench_tp_throughput import SETTINGS, chosen_runs, throughput, write_outputs

    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        write_outputs(args.out, saved["device"], saved["results"], saved["gpus"],
                      saved.get("side_by_side", True))  # fmt: skip
        return 0
    set_environment(args.device)
    began = time.monotonic()
    deadline = began + args.budget
    ok = True
    if args.part in ("parity", "all"):
        jobs = args.jobs or (8 if args.device == "cuda" else 1)
        sizes = args.sizes or [2, 4]
        ok &= parity(args.device, args.chapters, args.models, sizes, jobs, deadline)
    if args.part in ("serve", "all"):
        ok &= serve(args.device, deadline)
    if args.part in ("throughput", "all"):
        settings = SETTINGS[args.device]
        runs = chosen_runs(
            args.device, args.shapes or list(settings.shapes),
            args.sizes or list(settings.sizes), args.graphs or list(settings.graphs),
        )  # fmt: skip
        ok &= throughput(args.device, runs, args.out, deadline, args.one_at_a_time, args.jobs or 1)
    print(f"\n{args.part}: {'OK' if ok else 'FAILED'} in {time.monotonic() - began:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
