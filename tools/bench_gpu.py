"""Upstream's offline benchmark on an NVIDIA GPU: our engine with each attention backend, and
transformers' batched generate as the floor.

    python tools/bench_gpu.py                      # on a machine with a GPU
    python tools/bench_gpu.py --only torch,fi      # some configurations

It writes docs/data/ch17-gpu-bench.md (or --out; chapter 18's table is made with
`--only fi,fi-graphs,transformers --out docs/data/ch18-gpu-bench.md`). The workload is upstream's
benchmark/offline/bench.py: 256 requests made with random.seed(0), each a prompt of 100..1024
random token ids below 10,000 and 100..1024 new tokens, temperature 0.6, EOS ignored; the
model has Qwen3-0.6B's shape (28 layers, 16 query and 8 key/value heads of 128, vocabulary
151,936) with random weights, in bfloat16; page size 256, prefill batches of at most 16,384
tokens. Random weights do the same work as real ones: every request generates exactly its
number of tokens.

Each configuration runs in a process of its own: it builds the engine, generates one short
warm-up request (FlashInfer compiles or loads its kernels then), and times `LLM.generate` of
the 256 requests. transformers runs a smaller job, the floor: 64 prompts of 256 tokens, 256
new tokens each, in one batch.

**The official engine.** `--official DIR` names a folder that holds upstream's `minisgl`
package (its `python/` folder at the pinned commit; never part of this repository), and
`--official-site DIR` an optional folder of packages put first on its path (upstream pins
transformers <= 4.57.3). Its child runs what upstream's benchmark/offline/bench.py runs, with
three changes that leave the work the same: the model folder above with random weights
(upstream's `use_dummy_weight`), FlashInfer attention (upstream's default on this GPU is
FlashAttention-3 from sgl_kernel, which is not installed), and the requests handed over in a
file, drawn by this engine's `make_offline_workload` (the same numbers as bench.py's).

**Profiles.** A child run with `--profile host` times the scheduler's own functions
(`HOST_PARTS`, named as upstream and this engine both name them) during the timed
`generate`: every call's wall time, nested calls included in their caller's; the GPU works
meanwhile, and what the host waits for it shows as `Event.synchronize`. With `--profile
kernels` it records the GPU time of every kernel instead (torch.profiler).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.models import cache_dir, ensure_model  # noqa: E402

OUT = ROOT / "docs" / "data" / "ch17-gpu-bench.md"
RESULT = "RESULT "  # the prefix of the line a measuring child prints its result on
RUN_TIMEOUT_S = 540  # one configuration; the whole call on the lent GPU has 600 s
QWEN3_0_6B = dict(
    architectures=["Qwen3ForCausalLM"],
    model_type="qwen3",
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=151936,
    tie_word_embeddings=True,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=40960,
    attention_bias=False,
    hidden_act="silu",
    torch_dtype="bfloat16",
    bos_token_id=151643,
    eos_token_id=151645,
)
# the settings upstream's benchmark/offline/bench.py gives its engine, less the two that
# CONFIGURATIONS vary: both engines run the workload with these
WORKLOAD_SETTINGS = dict(page_size=256, max_seq_len_override=4096, max_extend_tokens=16384)
OFFICIAL_SETTINGS = dict(attention_backend="fi", cuda_graph_max_bs=256, **WORKLOAD_SETTINGS)
# name -> (what the row says, the engine's settings)
CONFIGURATIONS: Dict[str, Tuple[str, Dict]] = {
    "torch": (
        "torch backend (chapter 05), overlap on",
        dict(attention_backend="torch", cuda_graph_max_bs=0),
    ),
    "fi": (
        "FlashInfer (chapter 17), overlap on",
        dict(attention_backend="fi", cuda_graph_max_bs=0),
    ),
    "fi-graphs": (
        "FlashInfer + CUDA graphs up to batch 256, overlap on",
        # as upstream's bench.py asks; the default is 160 where 80 GiB or less are free (H100)
        dict(attention_backend="fi", cuda_graph_max_bs=256),
    ),
}


# the host's work of one scheduler turn: (module, class or None, function), in the order of a
# turn; upstream's code and this engine's have these names in common
HOST_PARTS: List[Tuple[str, str | None, str]] = [
    ("minisgl.scheduler.scheduler", "Scheduler", "overlap_loop"),
    ("minisgl.llm.llm", "LLM", "offline_receive_msg"),
    ("minisgl.scheduler.scheduler", "Scheduler", "_schedule_next_batch"),
    ("minisgl.scheduler.prefill", "PrefillManager", "schedule_next_batch"),
    ("minisgl.scheduler.decode", "DecodeManager", "schedule_next_batch"),
    ("minisgl.scheduler.scheduler", "Scheduler", "_prepare_batch"),
    ("minisgl.engine.graph", "GraphRunner", "pad_batch"),
    ("minisgl.scheduler.cache", "CacheManager", "allocate_paged"),
    ("minisgl.scheduler.scheduler", None, "_make_positions"),
    ("minisgl.scheduler.scheduler", None, "_make_input_tuple"),
    ("minisgl.scheduler.scheduler", None, "_make_write_tuple"),
    ("minisgl.attention.fi", "FlashInferBackend", "prepare_metadata"),
    ("minisgl.engine.sample", "Sampler", "prepare"),
    ("minisgl.scheduler.scheduler", "Scheduler", "_forward"),
    ("minisgl.engine.engine", "Engine", "forward_batch"),
    ("minisgl.engine.graph", "GraphRunner", "replay"),
    ("minisgl.engine.graph", "GraphCaptureBuffer", "copy_from"),
    ("minisgl.attention.fi", "FlashInferBackend", "prepare_for_replay"),
    ("flashinfer.decode", "BatchDecodeWithPagedKVCacheWrapper", "plan"),
    ("torch.cuda", "CUDAGraph", "replay"),
    ("minisgl.engine.sample", "Sampler", "sample"),
    ("minisgl.scheduler.decode", "DecodeManager", "filter_reqs"),
    ("minisgl.scheduler.scheduler", "Scheduler", "_process_last_data"),
    ("minisgl.core", "Req", "append_host"),
    ("minisgl.scheduler.cache", "CacheManager", "cache_req"),
    ("minisgl.llm.llm", "LLM", "offline_send_result"),
    ("torch.cuda", "Event", "synchronize"),
]


class HostTimers:
    """Wall time and calls of each of HOST_PARTS that exists in the loaded code. Installed
    before the engine is built (upstream binds some methods at construction)."""

    def __init__(self) -> None:
        self.seconds: Dict[str, float] = {}
        self.calls: Dict[str, int] = {}
        for module_name, class_name, function_name in HOST_PARTS:
            try:
                owner: Any = importlib.import_module(module_name)
            except ImportError:  # flashinfer on a machine without it
                continue
            if class_name is not None:
                owner = getattr(owner, class_name, None)
            function = getattr(owner, function_name, None) if owner is not None else None
            if function is None:
                continue
            name = f"{class_name}.{function_name}" if class_name else function_name
            setattr(owner, function_name, self._timed(name, function))
            self.seconds[name], self.calls[name] = 0.0, 0

    def _timed(self, name: str, function: Callable) -> Callable:
        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - start
                self.calls[name] += 1

        return timed

    def reset(self) -> None:
        self.seconds = dict.fromkeys(self.seconds, 0.0)
        self.calls = dict.fromkeys(self.calls, 0)

    def result(self) -> Dict[str, Dict[str, float]]:
        return {
            name: dict(seconds=self.seconds[name], calls=self.calls[name]) for name in self.seconds
        }


class StepCounter:
    """The forward steps of a run, prefill and decode apart: `Engine.forward_batch`, which
    upstream's engine and this one both have, counted by its batch's phase."""

    def __init__(self) -> None:
        from minisgl.engine.engine import Engine

        self.prefill = self.decode = 0
        original = Engine.forward_batch
        counter = self

        @functools.wraps(original)
        def counted(engine: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
            if batch.is_decode:
                counter.decode += 1
            else:
                counter.prefill += 1
            return original(engine, batch, *args, **kwargs)

        Engine.forward_batch = counted  # type: ignore[method-assign]


OTHER_ROWS = {
    "official": "the official mini-sglang (FlashInfer, CUDA graphs, overlap on)",
    "transformers": "transformers `generate`, batch 64, prompts of 256, 256 new tokens (the floor)",
}


def model_folder(name: str = "qwen3-0.6b-shape", config: Dict | None = None) -> Path:
    """Qwen3-0.6B's config (or `config`) with a small tokenizer (the prompts are token ids; the
    engine only reads its EOS id), no weights: the engine makes random ones (use_dummy_weight)."""
    folder = cache_dir() / "models" / name
    folder.mkdir(parents=True, exist_ok=True)
    tiny = ensure_model("tiny-qwen3")
    for file in ("tokenizer.json", "tokenizer_config.json"):
        (folder / file).write_bytes((tiny / file).read_bytes())
    (folder / "config.json").write_text(json.dumps(config or QWEN3_0_6B, indent=1))
    return folder


def official_model_folder() -> Path:
    """The same model folder for upstream's engine: its tokenizer config names the class that
    upstream's transformers (4.57) knows; the tokenizer itself is the same file."""
    folder = cache_dir() / "models" / "qwen3-0.6b-shape-official"
    folder.mkdir(parents=True, exist_ok=True)
    ours = model_folder()
    for name in ("tokenizer.json", "config.json"):
        (folder / name).write_bytes((ours / name).read_bytes())
    tokenizer_config = json.loads((ours / "tokenizer_config.json").read_text())
    tokenizer_config.pop("backend", None)
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))
    return folder


def workload() -> Tuple[List[List[int]], List[int]]:
    """Upstream's requests, drawn in upstream's order from random.seed(0)."""
    from minisgl.benchmark.offline import make_offline_workload

    work = make_offline_workload()
    return work.prompts, [p.max_tokens for p in work.sampling_params]


def build_engine(name: str):
    """Our engine in configuration `name`, after one short warm-up request (FlashInfer
    compiles or loads its kernels then)."""
    import torch

    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    llm = LLM(
        str(model_folder()), dtype=torch.bfloat16, use_dummy_weight=True,
        **WORKLOAD_SETTINGS, **CONFIGURATIONS[name][1],
    )  # fmt: skip
    try:
        llm.generate([[1, 2, 3, 4]], SamplingParams(temperature=0.1, max_tokens=8))
    except BaseException:
        llm.shutdown()
        raise
    return llm


def run_ours(name: str, profile: str | None = None, jobs_file: Path | None = None) -> Any:
    if jobs_file is not None:
        return timed_jobs(build_engine(name), json.loads(jobs_file.read_text()))
    prompts, new_tokens = workload()
    timers = HostTimers() if profile == "host" else None
    kernels: Dict[str, float] | None = {} if profile == "kernels" else None
    return timed_generate(build_engine(name), prompts, new_tokens, timers, kernels)


def timed_jobs(llm: Any, jobs: List[Dict[str, List]]) -> List[Dict]:
    """Time one `generate` of each job ({"prompts": ..., "new_tokens": ...}) in turn on a
    warmed-up engine (ours or upstream's), then shut it down."""
    from minisgl.core import SamplingParams

    results = []
    try:
        for job in jobs:
            params = [
                SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=n)
                for n in job["new_tokens"]
            ]
            start = time.perf_counter()
            llm.generate(job["prompts"], params)
            seconds = time.perf_counter() - start
            results.append(dict(batch=len(params), seconds=seconds, tokens=sum(job["new_tokens"])))
    finally:
        llm.shutdown()
    return results


def timed_generate(
    llm: Any,
    prompts: List[List[int]],
    new_tokens: List[int],
    timers: HostTimers | None,
    kernels: Dict[str, float] | None = None,
    count_exact: bool = True,
) -> Dict:
    """Time one `generate` of the workload on a warmed-up engine (ours or upstream's: the
    same API), then shut it down."""
    from minisgl.core import SamplingParams

    steps = StepCounter()
    try:
        params = [
            SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=n) for n in new_tokens
        ]
        if timers is not None:
            timers.reset()
        with kernel_profile(kernels):
            start = time.perf_counter()
            outputs = llm.generate(prompts, params)
            seconds = time.perf_counter() - start
    finally:
        llm.shutdown()
    generated = sum(len(o["token_ids"]) for o in outputs)
    # upstream's generate drops a last token that happens to be EOS even when EOS is ignored;
    # its bench.py counts max_tokens, as this does, and this engine returns every token
    assert generated == sum(new_tokens) or not count_exact, (generated, sum(new_tokens))
    result = dict(seconds=seconds, tokens=sum(new_tokens), prompt_tokens=sum(map(len, prompts)),
                  prefill_steps=steps.prefill, decode_steps=steps.decode)  # fmt: skip
    if timers is not None:
        result["host"] = timers.result()
    if kernels is not None:
        result["kernels"] = kernels
    return result


@contextlib.contextmanager
def kernel_profile(kernels: Dict[str, float] | None) -> Iterator[None]:
    """With a dict: the GPU time of every kernel (and copy) launched inside, in seconds by
    name, from torch.profiler's CUDA activity."""
    if kernels is None:
        yield
        return
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        yield
        torch.cuda.synchronize()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            name = event.name[:160]
            kernels[name] = kernels.get(name, 0.0) + event.time_range.elapsed_us() / 1e6


def run_official(source: Path, site: Path | None, work_file: Path, profile: str | None) -> Dict:
    """Upstream's engine from `source` (the folder holding its `minisgl` package), as its
    benchmark/offline/bench.py runs it, on the requests and the model folder in `work_file`."""
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT]
    sys.path[:0] = [str(source)] + ([str(site)] if site else [])
    import torch

    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    # upstream's minisgl has no __init__.py (a namespace package): check where it was found
    found = [Path(folder).resolve() for folder in sys.modules["minisgl"].__path__]
    assert found == [source.resolve() / "minisgl"], f"upstream's minisgl not found: {found}"
    work = json.loads(work_file.read_text())
    llm = LLM(work["model"], dtype=torch.bfloat16, use_dummy_weight=True, **OFFICIAL_SETTINGS)
    llm.generate(["Benchmark: "], SamplingParams(temperature=0.1))  # bench.py's warm-up
    # timers only now: upstream's engine refuses to start once CUDA is initialised (importing
    # FlashInfer does that); its offline LLM bound these two methods when it was built
    llm.receive_msg, llm.send_result = llm.offline_receive_msg, llm.offline_send_result
    if "jobs" in work:
        return timed_jobs(llm, work["jobs"])
    timers = HostTimers() if profile == "host" else None
    kernels: Dict[str, float] | None = {} if profile == "kernels" else None
    return timed_generate(
        llm, work["prompts"], work["new_tokens"], timers, kernels, count_exact=False
    )


def run_transformers() -> Dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(model_folder())
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    batch, length, new = 64, 256, 256
    ids = torch.randint(0, 10000, (batch, length), device="cuda")

    def generate(n: int) -> None:
        model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=0.6,
            max_new_tokens=n, min_new_tokens=n, pad_token_id=0,
        )  # fmt: skip

    generate(4)  # warm-up
    torch.cuda.synchronize()
    start = time.perf_counter()
    generate(new)
    torch.cuda.synchronize()
    return dict(
        seconds=time.perf_counter() - start, tokens=batch * new, prompt_tokens=batch * length
    )


def run_for_result(args: List[str], timeout: float, env: Dict[str, str] | None = None) -> Any:
    """Run `python *args` in a fresh process (LOG_LEVEL=WARNING, `env` on top) and return the
    JSON of the last line it prints as `print_result` does. If it fails, the tail of its
    output goes to stderr and the run stops, naming the command."""
    env = {**os.environ, "LOG_LEVEL": "WARNING", **(env or {})}
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"{args}: exit code {done.returncode}")
    return json.loads(lines[-1].removeprefix(RESULT))


def print_result(result: Any) -> None:
    """What a child of `run_for_result` prints last: its result, as one line of JSON."""
    print(RESULT + json.dumps(result), flush=True)


def run_in_child(
    name: str,
    profile: str | None = None,
    env: Dict[str, str] | None = None,
    jobs: List[Dict] | None = None,
) -> Any:
    """Configuration `name` of this engine in a fresh process (with `env` added to its
    environment); `profile` "host" or "kernels" adds the scheduler's timers or the GPU's
    kernel times to the result. Given `jobs`, it times those instead of the workload (a result
    per job, as `timed_jobs` gives them)."""
    args = [__file__, "--child", name, *(["--profile", profile] if profile else [])]
    with tempfile.TemporaryDirectory() as folder:
        if jobs:
            jobs_file = Path(folder) / "jobs.json"
            jobs_file.write_text(json.dumps(jobs))
            args += ["--jobs", str(jobs_file)]
        return run_for_result(args, RUN_TIMEOUT_S, env)


def run_official_in_child(
    source: Path, site: Path | None, profile: str | None = None, jobs: List[Dict] | None = None
) -> Any:
    """The official engine in a fresh process, on this engine's copy of the workload, or on
    `jobs` (then: a result per job, as `timed_jobs` gives them)."""
    prompts, new_tokens = workload()
    with tempfile.TemporaryDirectory() as folder:
        work_file = Path(folder) / "workload.json"
        model = str(official_model_folder())  # made here: upstream's transformers is older
        work = dict(prompts=prompts, new_tokens=new_tokens, model=model)
        work_file.write_text(json.dumps({**work, **({"jobs": jobs} if jobs else {})}))
        args = [__file__, "--child", "official", "--official", str(source)]
        args += ["--work", str(work_file)] + (["--official-site", str(site)] if site else [])
        args += ["--profile", profile] if profile else []
        return run_for_result(args, RUN_TIMEOUT_S)


def table(results: Dict[str, Dict]) -> str:
    import torch

    rows = [
        "| engine | output tokens | seconds | output tokens/s |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, result in results.items():
        what = CONFIGURATIONS[name][0] if name in CONFIGURATIONS else OTHER_ROWS[name]
        rate = result["tokens"] / result["seconds"]
        rows.append(f"| {what} | {result['tokens']:,} | {result['seconds']:.1f} | {rate:,.0f} |")
    gpu = torch.cuda.get_device_name()
    return "\n".join(rows) + f"\n\nMeasured on one {gpu}, torch {torch.__version__}.\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join([*CONFIGURATIONS, "transformers"]))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--official", type=Path, help="a folder holding upstream's minisgl")
    parser.add_argument("--official-site", type=Path, help="packages first on upstream's path")
    parser.add_argument("--profile", choices=["host", "kernels"], help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--jobs", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "official":
        print_result(run_official(args.official, args.official_site, args.work, args.profile))
        return
    if args.child:
        result = (
            run_transformers()
            if args.child == "transformers"
            else run_ours(args.child, args.profile, args.jobs)
        )
        print_result(result)
        return
    results = {}
    for name in args.only.split(","):
        if name == "official":
            results[name] = run_official_in_child(args.official, args.official_site)
        else:
            results[name] = run_in_child(name)
        print(name, results[name], flush=True)
    args.out.write_text(table(results))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
