"""What the server counts, for GET /metrics in Prometheus' text format (prometheus_client).

The API server measures the requests (time to the first token, between tokens, end to end)
and counts tokens; the scheduler process sets what only it knows (requests running and
waiting, KV pages used and cached). The launcher gives every process one folder
(PROMETHEUS_MULTIPROC_DIR, prometheus_client's multiprocess mode), and /metrics adds up what
the processes wrote there.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Tuple

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

if TYPE_CHECKING:
    from minisgl.scheduler import Scheduler

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

REQUESTS = Counter("minisgl_requests", "requests received by the API server")
TOKENS_IN = Counter("minisgl_prompt_tokens", "prompt tokens of the requests served")
TOKENS_OUT = Counter("minisgl_generation_tokens", "tokens generated")
TIME_TO_FIRST_TOKEN = Histogram(
    "minisgl_time_to_first_token_seconds",
    "from a request's arrival to its first token",
    buckets=_LATENCY,
)
TIME_BETWEEN_TOKENS = Histogram(
    "minisgl_time_between_tokens_seconds", "between two tokens of one request", buckets=_LATENCY
)
END_TO_END = Histogram(
    "minisgl_e2e_request_latency_seconds", "from a request's arrival to its end", buckets=_LATENCY
)
# set by the scheduler process; in multiprocess mode a gauge needs to say how to combine
RUNNING = Gauge("minisgl_requests_running", "requests decoding", multiprocess_mode="livesum")
WAITING = Gauge(
    "minisgl_requests_waiting", "requests waiting to start", multiprocess_mode="livesum"
)
PAGES_USED = Gauge(
    "minisgl_kv_pages_used", "KV pages that running requests own", multiprocess_mode="livesum"
)
PAGES_CACHED = Gauge(
    "minisgl_kv_pages_cached", "KV pages held by the prefix cache", multiprocess_mode="livesum"
)
PAGES_TOTAL = Gauge("minisgl_kv_pages", "KV pages in all", multiprocess_mode="livesum")
SLOTS_FREE = Gauge(
    "minisgl_request_slots_free",
    "rows of the page table no request holds",
    multiprocess_mode="livesum",
)
VERIFIED = Gauge(
    "minisgl_idle_integrity_verified",
    "1 while the scheduler is idle and has proved that every page and slot is free or cached",
    multiprocess_mode="livesum",
)


def observe_scheduler(scheduler: Scheduler) -> None:
    """Set the scheduler's gauges (called once per turn of its loop)."""
    cache = scheduler.cache_manager
    cached = cache.prefix_cache.size_info.total_size // cache.page_size
    free = len(cache.free_slots)
    RUNNING.set(len(scheduler.decode_manager.running_reqs))
    WAITING.set(len(scheduler.prefill_manager.pending_list))
    PAGES_TOTAL.set(cache.num_pages)
    PAGES_CACHED.set(cached)
    PAGES_USED.set(cache.num_pages - free - cached)
    SLOTS_FREE.set(scheduler.table_manager.available_size)
    VERIFIED.set(0)


def verify_idle(scheduler: Scheduler, num_slots: int) -> None:
    """Called once the scheduler's own idle check (the cache's integrity) has passed: also no
    page-table row may be held. Raises, so that the scheduler process stops, if one is."""
    slots = scheduler.table_manager
    if slots.available_size != num_slots:
        raise RuntimeError(
            f"integrity check failed: {num_slots - slots.available_size} "
            "request slots are held while no request runs"
        )
    SLOTS_FREE.set(slots.available_size)
    VERIFIED.set(1)


def render() -> Tuple[bytes, str]:
    """The text of /metrics: every process's numbers, added up."""
    if os.environ.get(MULTIPROC_ENV):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
