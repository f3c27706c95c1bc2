"""`python -m minisgl`: the scheduler, the detokenizer and the tokenizer workers, each a process
of its own, then the API server (or the shell) in this one.

    API server --TokenizeMsg/AbortMsg--> tokenizer(s) --UserMsg/AbortBackendMsg--> scheduler
        ^                                                                            |
        +---------------- UserReply ---------------- detokenizer <---DetokenizeMsg---+

With --num-tokenizer 0 (the default) one worker both tokenizes and detokenizes.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import multiprocessing as mp
import os
import queue
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Dict, List

from minisgl.distributed import DistributedInfo
from minisgl.utils import init_logger, make_stoppable, worker_context

from .args import ServerArgs, parse_args

if TYPE_CHECKING:
    from minisgl.scheduler import SchedulerConfig

logger = init_logger(__name__, "launcher")
START_TIMEOUT_S = 1800.0  # loading a large model from the Hub can take a while
STOP_TIMEOUT_S = 10.0


def _stoppable(for_shell: bool) -> None:
    make_stoppable()
    if for_shell:
        # the terminal sends Ctrl-C to its whole foreground process group; in the shell it
        # stops an answer, so the workers leave the group (they still stop with the launcher)
        os.setpgrp()


def _run_scheduler(args: ServerArgs, ack_queue: mp.Queue, for_shell: bool) -> None:
    import torch

    from minisgl.scheduler import Scheduler

    from . import metrics

    _stoppable(for_shell)
    with torch.inference_mode():
        began = time.perf_counter()
        scheduler = Scheduler(args)  # the model's weights, the KV cache, the engine
        logger.info(
            f"rank {args.tp_info.rank}: the model is loaded ({time.perf_counter() - began:.1f} s)"
        )
        receive = scheduler.receive_msg

        def receive_and_count(blocking: bool = False) -> list:
            metrics.observe_scheduler(scheduler)  # once per turn, before it may wait
            return receive(blocking=blocking)

        scheduler.receive_msg = receive_and_count  # type: ignore[method-assign]
        check_idle = scheduler.run_when_idle

        def check_idle_and_say_so() -> None:
            check_idle()  # the cache's integrity check: it raises if a page is lost
            metrics.verify_idle(
                scheduler, args.max_running_req
            )  # and no slot is held; /metrics shows it passed

        scheduler.run_when_idle = check_idle_and_say_so  # type: ignore[method-assign]
        try:
            scheduler.sync_all_ranks()
            if args.tp_info.is_primary():
                ack_queue.put(
                    ("scheduler", {"max_seq_len": scheduler.engine.max_seq_len, "pid": os.getpid()})
                )
            if args.silent_output:
                logging.disable(logging.INFO)
            scheduler.run_forever()
        except KeyboardInterrupt:  # an ExitMsg, Ctrl-C, terminate() or the launcher's death
            pass
        finally:
            scheduler.shutdown()


def _run_tokenizer(ack_queue: mp.Queue, name: str, for_shell: bool, **kwargs: object) -> None:
    from minisgl.tokenizer import tokenize_worker

    _stoppable(for_shell)
    ready: mp.Queue = _Relay(ack_queue, name)  # type: ignore[assignment]
    tokenize_worker(ack_queue=ready, **kwargs)  # type: ignore[arg-type]


class _Relay:
    """What tokenize_worker's ack_queue needs (a put), tagged with the worker's name."""

    def __init__(self, ack_queue: mp.Queue, name: str) -> None:
        self.ack_queue, self.name = ack_queue, name

    def put(self, message: str) -> None:
        self.ack_queue.put((self.name, {"message": message, "pid": os.getpid()}))


def remove_leftover_files(args: SchedulerConfig) -> None:
    """Delete what the server's processes leave in the temporary folder when they are killed
    before they close it: their Unix sockets and the file where the ranks met."""
    prefix = args._ipc_addr("").removeprefix("ipc://")
    for path in glob.glob(glob.escape(prefix) + "*"):
        with contextlib.suppress(OSError):
            os.unlink(path)


@dataclass
class Backend:
    """The worker processes of one server."""

    processes: List[BaseProcess]
    max_seq_len: int  # the longest sequence the engine takes (prompt and output)
    args: ServerArgs

    def dead(self) -> List[str]:
        return [f"{p.name} (exit code {p.exitcode})" for p in self.processes if not p.is_alive()]

    def stop(self) -> None:
        """Stop every worker: SIGTERM, then SIGKILL for any still alive after a while."""
        for p in self.processes:
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for p in self.processes:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(5.0)
        remove_leftover_files(self.args)


def start_backend(args: ServerArgs, for_shell: bool = False) -> Backend:
    """Start every worker and wait until all say they are ready (or one dies: then stop them
    all and raise, naming it)."""
    ctx = worker_context()
    ack_queue: mp.Queue = ctx.Queue()
    processes: List[BaseProcess] = []
    for rank in range(args.tp_info.size):
        rank_args = replace(args, tp_info=DistributedInfo(rank, args.tp_info.size))
        processes.append(
            ctx.Process(
                target=_run_scheduler,
                args=(rank_args, ack_queue, for_shell),
                name=f"minisgl-TP{rank}-scheduler",
            )
        )
    worker = dict(
        tokenizer_path=args.model_path,
        backend_addr=args.zmq_backend_addr,
        frontend_addr=args.zmq_frontend_addr,
        local_bs=8,
        create=True,
    )
    processes.append(
        ctx.Process(
            target=_run_tokenizer,
            name="minisgl-detokenizer",
            args=(ack_queue, "detokenizer", for_shell),
            kwargs=dict(worker, addr=args.zmq_detokenizer_addr, tokenizer_id=args.num_tokenizer),
        )
    )
    for i in range(args.num_tokenizer):
        processes.append(
            ctx.Process(
                target=_run_tokenizer,
                name=f"minisgl-tokenizer-{i}",
                args=(ack_queue, f"tokenizer {i}", for_shell),
                kwargs=dict(worker, addr=args.zmq_tokenizer_addr_of(i), tokenizer_id=i),
            )
        )
    backend = Backend(processes, max_seq_len=0, args=args)
    for p in processes:
        p.start()
    logger.info(f"loading {args.model_path} in the scheduler; starting the tokenizer workers")
    expected = 1 + 1 + args.num_tokenizer  # the scheduler's rank 0, the detokenizer, tokenizers
    acks: Dict[str, Dict] = {}
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while len(acks) < expected:
            if dead := backend.dead():
                raise RuntimeError(f"{', '.join(dead)} exited while the server was starting")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the workers were not ready after {START_TIMEOUT_S:.0f} s")
            try:
                name, info = ack_queue.get(timeout=0.5)
            except queue.Empty:
                continue
            acks[name] = info
            logger.info(f"{name} is ready (pid {info['pid']})")
    except BaseException:
        backend.stop()
        raise
    backend.max_seq_len = acks["scheduler"]["max_seq_len"]
    return backend


def launch_server(run_shell: bool = False) -> None:
    args, run_shell = parse_args(sys.argv[1:], run_shell)
    with tempfile.TemporaryDirectory(prefix="minisgl-metrics-") as metrics_dir:
        # every process of the server writes its numbers here (before prometheus_client loads)
        os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", metrics_dir)
        from .api_server import run_api_server

        run_api_server(args, lambda: start_backend(args, run_shell), run_shell=run_shell)
