"""The child processes of tools/bench_tp.py: how the parent starts and judges them, and the
child that measures one throughput configuration, with the scheduler ranks it starts.

The measuring child starts the ranks (examples/helpers/ranks.py), plays the tokenizer and the
detokenizer as chapter 14's main does, and

1. warms up: a few requests as long as the workload's first ones, with token ids above the
   workload's (so the prefix cache shares nothing with it), so that kernels load or compile
   before the clock starts;
2. times the workload: every request in one message to rank 0, the clock running from the
   send to the last token of the last request;
3. probes the decode step: `Probe.batch` requests of a short prompt, decoded together. In every
   rank, decode steps `skip + 1` to `skip + steps` of these requests run under torch.profiler
   (`DecodeWindow`), and the rank writes what its device spent on them, and on the
   collectives among them, to a file.

Which events are collectives: on GPUs NCCL's kernels (the profiler reads their times from
CUPTI, also inside a CUDA graph), on the CPU gloo's work records. A collective on one rank
lasts until every rank has reached it, so its time includes the wait for the slowest rank.

Nothing at this module's top imports more than the standard library: tools/bench_tp.py copies
it into each chapter's tree, whose processes import it too.
"""

from __future__ import annotations

import functools
import json
import multiprocessing as mp
import os
import platform
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Sequence, Set, Tuple

if TYPE_CHECKING:
    import torch

    from examples.helpers.ranks import Ranks
    from minisgl.message import UserMsg
    from minisgl.scheduler import SchedulerConfig

WARMUP_UID = 1 << 20  # the warm-up's requests are numbered from here, the probe's from PROBE_UID
PROBE_UID = 1 << 21
FIRST_FREE_ID = 10_001  # upstream's prompts use token ids 0..10,000
PROBE_PROMPT = 32  # tokens in each of the probe's prompts
WINDOW_TIMEOUT_S = 60.0  # the ranks write their windows' files within this, once it has ended
NO_MULTICAST = dict(  # the lent machines' rule: NVLink multicast can take the host's GPUs down
    NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1"
)


# ------------------------------------------------------------- starting and judging children
def set_environment(device: str) -> None:
    """For this process and every one it starts: no multicast, transformers' references in
    float32 on the CPU, and with `--device cpu` the engine on the CPU too."""
    os.environ.update(NO_MULTICAST, LOG_LEVEL="WARNING")
    os.environ.update(MINISGL_BOOK_DEVICE="cpu", MINISGL_BOOK_DTYPE="float32")
    if device == "cpu":
        os.environ["MINISGL_DEVICE"] = "cpu"


def gpu_ids(device: str) -> List[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them ([] on the CPU)."""
    if device != "cuda":
        return []
    import torch

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    return ids[: torch.cuda.device_count()]


def fitting(sizes: Sequence[int], device: str) -> List[int]:
    """The TP sizes this machine has GPUs for (all of them on the CPU)."""
    if device != "cuda":
        return list(sizes)
    gpus = len(gpu_ids(device))
    if too_large := [s for s in sizes if s > gpus]:
        print(f"{gpus} GPU(s) here: TP sizes {too_large} left out")
    return [s for s in sizes if s <= gpus]


def run_child(cmd: List[str], cwd: Path, env: Dict[str, str], timeout: float) -> Any:
    """`cmd` under tools/supervise.py (a time limit, nothing left behind): its Outcome."""
    from tools import supervise

    return supervise.run(cmd, cwd, env, timeout)


def problems_of(outcome: Any, what: str, timeout: float) -> List[str]:
    """Why a child failed or misbehaved (nothing if it ended well), with the end of what it
    printed."""
    problems = outcome.report(what, timeout)
    if outcome.returncode not in (0, None):
        problems.append(f"{what} exited with code {outcome.returncode}")
    if problems:
        tail = outcome.stdout[-2500:] + outcome.stderr[-2500:]
        problems.append(f"--- its output ends with ---\n{tail}")
    return problems


def time_left(deadline: float) -> float:
    return deadline - time.monotonic()


# ------------------------------------------------------------------------ in each rank
@dataclass(frozen=True)
class Probe:
    batch: int  # requests decoded together
    skip: int  # decode steps before the window (the batch and the kernels settle)
    steps: int  # decode steps inside the window
    folder: str  # where rank r writes rank{r}.json

    @property
    def max_tokens(self) -> int:
        return self.skip + self.steps + 2  # the window closes before any request finishes


def run_measured_scheduler(config: SchedulerConfig, ready: mp.Queue, probe: Probe) -> None:
    """A scheduler rank (examples/helpers/scheduler_process.py) whose engine profiles the
    probe's window."""
    from examples.helpers.scheduler_process import run_scheduler
    from minisgl.engine import Engine

    window = DecodeWindow(probe, config.tp_info.rank)
    Engine.forward_batch = window.wrap(Engine.forward_batch)  # type: ignore[method-assign]
    run_scheduler(config, ready)


class DecodeWindow:
    """Counts the decode steps of the probe's requests (their uids start at PROBE_UID) and
    profiles steps `skip + 1` to `skip + steps`, between two synchronisations of the device."""

    def __init__(self, probe: Probe, rank: int) -> None:
        self.probe, self.rank = probe, rank
        self.decodes = 0
        self.prefills = 0  # prefill batches of the probe inside the window (there should be none)
        self.sizes: Set[int] = set()  # of the decode batches inside the window
        self.profiler: Any = None
        self.began = 0.0

    def wrap(self, forward: Callable) -> Callable:
        @functools.wraps(forward)
        def forward_batch(engine: Any, batch: Any, args: Any) -> Any:
            if not batch.reqs or batch.reqs[0].uid < PROBE_UID:
                return forward(engine, batch, args)
            if batch.is_prefill:
                self.prefills += self.profiler is not None
                return forward(engine, batch, args)
            self.decodes += 1
            if self.decodes == self.probe.skip + 1:
                self._start(engine.device)
            if self.profiler is not None:
                self.sizes.add(batch.size)
            output = forward(engine, batch, args)
            if self.decodes == self.probe.skip + self.probe.steps:
                self._stop(engine.device)
            return output

        return forward_batch

    def _start(self, device: torch.device) -> None:
        from torch.profiler import ProfilerActivity, profile

        activity = ProfilerActivity.CUDA if device.type == "cuda" else ProfilerActivity.CPU
        _synchronize(device)
        self.profiler = profile(activities=[activity])
        self.profiler.start()
        self.began = time.perf_counter()

    def _stop(self, device: torch.device) -> None:
        _synchronize(device)
        wall = time.perf_counter() - self.began
        self.profiler.stop()
        seen = device_times(self.profiler.events(), device.type == "cuda")
        result = dict(rank=self.rank, steps=self.probe.steps, prefills=self.prefills,
                      batch_sizes=sorted(self.sizes), wall_s=wall)  # fmt: skip
        path = Path(self.probe.folder) / f"rank{self.rank}.json"
        path.with_suffix(".tmp").write_text(json.dumps({**result, **seen}))
        os.replace(path.with_suffix(".tmp"), path)  # the reader never sees half a file
        self.profiler = None


def _synchronize(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def is_collective(name: str) -> bool:
    """NCCL's kernels (ncclDevKernel_AllReduce_Sum_bf16_RING_LL, ...) or gloo's work records
    (gloo:all_reduce; c10d::allreduce_, which only hands the work to gloo, is not one)."""
    return name.lower().startswith(("nccl", "gloo:"))


def is_all_reduce(name: str) -> bool:
    return is_collective(name) and "allreduce" in name.lower().replace("_", "")


def device_times(events: Iterable[Any], cuda: bool) -> Dict[str, Any]:
    """From the profiler's events: the GPU time of all kernels (CUDA only), of the all-reduces
    and of each collective by name, in seconds."""
    from torch.autograd import DeviceType

    kind = DeviceType.CUDA if cuda else DeviceType.CPU
    busy, collectives = 0.0, {}
    for event in events:
        if event.device_type != kind:
            continue
        seconds = event.time_range.elapsed_us() / 1e6
        busy += seconds
        if is_collective(event.name):
            name = event.name.split("(")[0]  # NCCL's kernels carry their argument types
            collectives[name] = collectives.get(name, 0.0) + seconds
    return dict(
        device_s=busy if cuda else None,  # the CPU's events nest: their sum means nothing
        all_reduce_s=sum(s for name, s in collectives.items() if is_all_reduce(name)),
        collectives=collectives,
    )


# ------------------------------------------------------------------ in the measuring child
def measure(spec: Dict[str, Any]) -> Dict[str, Any]:
    """One configuration (tools/bench_tp_throughput.py's `child_spec` says what `spec` holds):
    the warm-up, the timed workload and the probe, on ranks started for it alone."""
    import torch

    from examples.helpers.ranks import Ranks
    from minisgl.distributed import DistributedInfo
    from minisgl.scheduler import SchedulerConfig

    prompts, new_tokens = workload(spec["workload"])
    config = SchedulerConfig(
        model_path=spec["model"], tp_info=DistributedInfo(0, spec["tp"]),
        dtype=getattr(torch, spec["dtype"]), use_dummy_weight=True,
        cuda_graph_max_bs=256 if spec["graphs"] else 0, **spec["engine"],
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="minisgl-tp-probe-") as folder:
        probe = Probe(folder=folder, **spec["probe"])
        target = functools.partial(run_measured_scheduler, probe=probe)
        with Ranks(config, target) as ranks:
            generate(ranks, warm_up_requests(prompts[: spec["warmup"]]))
            timed = requests(range(len(prompts)), prompts, new_tokens)
            began = time.perf_counter()
            counts = generate(ranks, timed)
            seconds = time.perf_counter() - began
            generate(ranks, probe_requests(probe))
            windows = read_windows(probe, spec["tp"], ranks.processes)
    tokens = sum(counts.values())
    assert tokens == sum(new_tokens), f"{tokens} tokens generated, {sum(new_tokens)} asked for"
    return dict(
        seconds=seconds, tokens=tokens, prompt_tokens=sum(map(len, prompts)),
        requests=len(prompts), windows=windows, machine=machine(spec["device"]),
    )  # fmt: skip


def workload(arguments: Dict[str, int] | None) -> Tuple[List[List[int]], List[int]]:
    """Upstream's 256 requests (tools/bench_gpu.py's), or make_offline_workload(**arguments)."""
    if arguments is None:
        from tools.bench_gpu import workload as upstream_workload

        return upstream_workload()
    from minisgl.benchmark.offline import make_offline_workload

    work = make_offline_workload(**arguments)
    return work.prompts, [p.max_tokens for p in work.sampling_params]


def requests(
    uids: Iterable[int], prompts: Sequence[List[int]], new_tokens: Sequence[int]
) -> List[UserMsg]:
    """As upstream's benchmark samples: temperature 0.6, EOS ignored, exactly n new tokens."""
    import torch

    from minisgl.core import SamplingParams
    from minisgl.message import UserMsg

    return [
        UserMsg(uid, torch.tensor(p, dtype=torch.int32),
                SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=n))
        for uid, p, n in zip(uids, prompts, new_tokens)
    ]  # fmt: skip


def warm_up_requests(prompts: Sequence[List[int]]) -> List[UserMsg]:
    shifted = [[FIRST_FREE_ID + token for token in p] for p in prompts]
    return requests(range(WARMUP_UID, WARMUP_UID + len(prompts)), shifted, [4] * len(prompts))


def probe_requests(probe: Probe) -> List[UserMsg]:
    """`probe.batch` prompts, each with a first token of its own (nothing shared)."""
    prompts = [[FIRST_FREE_ID + i + j for j in range(PROBE_PROMPT)] for i in range(probe.batch)]
    uids = range(PROBE_UID, PROBE_UID + probe.batch)
    return requests(uids, prompts, [probe.max_tokens] * probe.batch)


def generate(ranks: Ranks, msgs: List[UserMsg]) -> Dict[int, int]:
    """Send `msgs` to rank 0 in one message; the number of tokens each request got, once every
    one has finished."""
    from examples.helpers.ranks import REPLY_TIMEOUT_S
    from minisgl.message import BatchBackendMsg, BatchTokenizerMsg
    from tools.processes import receive

    ranks.requests.put(BatchBackendMsg(msgs))  # type: ignore[arg-type]
    counts = {msg.uid: 0 for msg in msgs}
    running = set(counts)
    while running:
        reply = receive(ranks.replies, ranks.processes, REPLY_TIMEOUT_S, "the tokens")
        for msg in reply.data if isinstance(reply, BatchTokenizerMsg) else [reply]:
            if msg.error:
                raise RuntimeError(f"request {msg.uid} was refused: {msg.error}")
            counts[msg.uid] += 1
            if msg.finished:
                running.discard(msg.uid)
    return counts


def read_windows(probe: Probe, size: int, processes: Sequence[BaseProcess]) -> List[Dict]:
    """What each rank saw in its window, by rank."""
    from tools.processes import PeerDied, describe

    paths = [Path(probe.folder) / f"rank{rank}.json" for rank in range(size)]
    deadline = time.monotonic() + WINDOW_TIMEOUT_S
    while not all(path.exists() for path in paths):
        if dead := [describe(p) for p in processes if not p.is_alive()]:
            raise PeerDied(f"{', '.join(dead)} exited before writing its probe's window")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no probe window from every rank after {WINDOW_TIMEOUT_S} s")
        time.sleep(0.1)
    return [json.loads(path.read_text()) for path in paths]


def machine(device: str) -> Dict[str, Any]:
    """What the table says the numbers were measured with (called once the ranks are gone:
    CUDA's start here would take memory on rank 0's GPU)."""
    import importlib.metadata

    import torch

    info: Dict[str, Any] = dict(torch=torch.__version__, python=platform.python_version())
    if device != "cuda":
        return {**info, "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()}
    try:
        flashinfer = importlib.metadata.version("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        flashinfer = None
    nccl = torch.cuda.nccl.version()
    return {
        **info,
        "gpu": torch.cuda.get_device_name(0),
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
        "flashinfer": flashinfer,
    }
