"""The scheduler as a process of its own, driven only by messages (chapter 14; chapter 15's
launcher starts it the same way)."""

from __future__ import annotations

import multiprocessing as mp

from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.utils import make_stoppable


def run_scheduler(config: SchedulerConfig, ready: mp.Queue) -> None:
    """Build the scheduler, wait for every rank, say so on `ready`, and serve until an ExitMsg
    (or a signal, or the parent's death: make_stoppable)."""
    make_stoppable()
    scheduler = Scheduler(config)
    try:
        scheduler.sync_all_ranks()
        ready.put(f"scheduler rank {config.tp_info.rank} is ready")
        scheduler.run_forever()
    except KeyboardInterrupt:  # what an ExitMsg raises, or a stop signal
        pass
    finally:
        scheduler.shutdown()
