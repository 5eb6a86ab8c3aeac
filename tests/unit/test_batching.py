"""The Batcher behind the active party's batched Predicts: concurrent submissions run as one batch, each submitter gets
its own item's outcome (a refusal only its own), the batching limits are read from [limits], and every query's
repeated-rows check refuses alike on its two paths. Nothing is timed: a batch is made to close by filling up, its window
being far longer than the test, and how long a batch gathers is read on a fake clock."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from vflsec.services.common import require_distinct_rows
from vflsec.services.config import ACTIVE_WORKERS, PREDICT_BATCH_ROWS, PREDICT_WINDOW_MS, ConfigError, parse_config
from vflsec.services.engines import batching
from vflsec.services.engines.batching import Batcher
from vflsec.services.errors import InvalidArgument, ResourceExhausted


def _submit_all(batcher: Batcher, items: list[int]) -> list[object]:
    def one(item: int) -> object:
        try:
            return batcher.submit(item, rows=1)
        except Exception as exc:  # the submitter's own outcome
            return exc

    with ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(one, items))


def test_concurrent_submissions_run_as_one_batch_and_a_refusal_stays_with_its_item() -> None:
    batches: list[list[int]] = []
    lock = threading.Lock()

    def run(items: list[int]) -> list[object]:
        with lock:
            batches.append(sorted(items))
        return [ResourceExhausted(f"item {i} refused") if i == 3 else i * 10 for i in items]

    outcomes = _submit_all(Batcher(run, window=60.0, max_rows=100, max_items=5), [1, 2, 3, 4, 5])
    assert batches == [[1, 2, 3, 4, 5]]  # one batch, closed because it was full
    assert outcomes[:2] + outcomes[3:] == [10, 20, 40, 50]
    assert isinstance(outcomes[2], ResourceExhausted) and str(outcomes[2]) == "item 3 refused"


def test_batches_respect_the_row_and_item_caps() -> None:
    sizes: list[int] = []
    lock = threading.Lock()

    def run(items: list[int]) -> list[int]:
        with lock:
            sizes.append(len(items))
        return items

    assert _submit_all(Batcher(run, window=60.0, max_rows=3, max_items=10), list(range(6))) == list(range(6))
    assert sorted(sizes) == [3, 3]  # three rows a batch
    sizes.clear()
    assert _submit_all(Batcher(run, window=60.0, max_rows=100, max_items=2), list(range(4))) == list(range(4))
    assert sorted(sizes) == [2, 2]


def test_a_batch_that_fails_whole_tells_every_submitter() -> None:
    def run(items: list[int]) -> list[int]:
        raise ConnectionError("peer down")

    outcomes = _submit_all(Batcher(run, window=60.0, max_rows=100, max_items=3), [1, 2, 3])
    assert all(isinstance(o, ConnectionError) and str(o) == "peer down" for o in outcomes)


class _Waiting:
    """A batch's ``ready`` lock on a fake clock: a wait lets its timeout pass, while submitters join at ``joins``."""

    def __init__(self, clock: list[float], batch: batching._Batch, joins: list[float]) -> None:
        self.clock, self.batch, self.joins = clock, batch, joins

    def acquire(self, timeout: float) -> bool:
        self.clock[0] += timeout
        while self.joins and self.joins[0] <= self.clock[0]:
            self.batch.joined = self.joins.pop(0)
        return False  # never full here


@pytest.mark.parametrize(
    ("joins", "closes_at"),
    [
        ([], 1.0),  # nobody joins: one window, as before
        ([0.5, 1.4, 2.2], 3.2),  # each within a window of the last: gathers on until one window passes without a join
        ([0.5, 2.0], 1.5),  # a join after a window without one opens the next batch
        ([0.9 * k for k in range(1, 20)], 5.0),  # joining without pause: closed after `windows` windows
    ],
)
def test_a_batch_gathers_while_submitters_keep_joining_for_at_most_its_windows(
    monkeypatch, joins: list[float], closes_at: float
) -> None:
    clock = [0.0]
    monkeypatch.setattr(batching.time, "monotonic", lambda: clock[0])
    batcher = Batcher(lambda items: items, window=1.0, max_rows=100, max_items=100, windows=5)
    batch = batching._Batch(joined=0.0)
    batch.ready = _Waiting(clock, batch, joins)  # type: ignore[assignment]
    batcher._gather(batch)
    assert clock[0] == pytest.approx(closes_at)


_ACTIVE = {
    "role": "active",
    "party_id": "active",
    "listen": "127.0.0.1:0",
    "tls": {"ca": "ca.pem", "cert": "cert.pem", "key": "key.pem"},
    "data": {"path": "data.csv"},
}


def test_limits_set_the_batching_and_bad_values_name_the_field(tmp_path: Path) -> None:
    config = parse_config(_ACTIVE, base=tmp_path)
    assert (config.predict_window_ms, config.predict_batch_rows) == (PREDICT_WINDOW_MS, PREDICT_BATCH_ROWS)
    assert config.workers == ACTIVE_WORKERS  # its Predicts wait in rounds: more server threads than other roles
    limits = {"predict_window_ms": 0, "predict_batch_rows": 16, "workers": 8}
    config = parse_config({**_ACTIVE, "limits": limits}, base=tmp_path)
    assert (config.predict_window_ms, config.predict_batch_rows, config.workers) == (0, 16, 8)
    with pytest.raises(ConfigError, match=r"\[limits\] predict_window_ms must be in \[0, 1000\]"):
        parse_config({**_ACTIVE, "limits": {"predict_window_ms": -1}}, base=tmp_path)
    with pytest.raises(ConfigError, match=r"\[limits\] predict_batch_rows must be >= 1, got 0"):
        parse_config({**_ACTIVE, "limits": {"predict_batch_rows": 0}}, base=tmp_path)


@pytest.mark.parametrize("n", [4, 1024, 1025, 5000])  # the set for a serving query's few rows, np.unique past 1,024
def test_repeated_rows_are_refused_on_both_paths_and_distinct_ones_pass(n: int) -> None:
    rows = np.arange(n, dtype=np.int64)[::-1].copy()
    require_distinct_rows(rows)
    rows[-1] = rows[0]
    with pytest.raises(InvalidArgument, match=rf"sample_index repeats rows \({n} entries, {n - 1} distinct\)"):
        require_distinct_rows(rows)
