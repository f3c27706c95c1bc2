"""tools/bench_online.py: the statistics of its table, on timings made up for the test (the
measurement itself is a script a reader runs, not a test)."""

from __future__ import annotations

import pytest

from tools.bench_online import NEW_TOKENS, Timing, percentiles, summarize, workload


def test_percentiles_are_nearest_rank() -> None:
    values = list(range(1, 101))  # 1 .. 100
    assert percentiles(values) == [51, 91, 100]
    assert percentiles([7.0]) == [7.0, 7.0, 7.0]


def test_a_row_from_two_requests() -> None:
    # request A: sent at 0, first chunk at 0.5 s, then one chunk every 0.1 s
    a = Timing(sent=0.0, chunks=[0.5 + 0.1 * i for i in range(NEW_TOKENS)], tokens=NEW_TOKENS)
    # request B: sent at 1 s, first chunk at 1.25 s, then every 0.2 s
    b = Timing(sent=1.0, chunks=[1.25 + 0.2 * i for i in range(NEW_TOKENS)], tokens=NEW_TOKENS)
    cells = [c.strip() for c in summarize("test", [a, b]).strip("|").split("|")]
    assert cells[0] == "test"
    assert cells[1:4] == ["500", "500", "500"]  # TTFT p50, p90, p99 in ms: nearest rank of 2
    assert cells[4] == "200" and cells[7] == "150"  # between tokens: p50 of 63 x 100 + 63 x 200
    end_b = 1.25 + 0.2 * (NEW_TOKENS - 1)
    assert float(cells[11]) == pytest.approx(end_b, abs=0.05)  # seconds, first send to last
    assert float(cells[12]) == pytest.approx(2 * NEW_TOKENS / end_b, abs=0.1)


def test_a_request_with_too_few_tokens_spoils_the_run() -> None:
    short = Timing(sent=0.0, chunks=[0.1, 0.2], tokens=2)
    with pytest.raises(RuntimeError, match="got 2 tokens"):
        summarize("test", [short])


def test_the_workload_is_the_same_every_time_and_shares_no_prefix() -> None:
    assert workload(8, seed=0) == workload(8, seed=0) != workload(8, seed=1)
    first_words = {q.split(":")[0] for q in workload(8, seed=0)}
    assert len(first_words) == 8  # "Request 0", "Request 1", ...
