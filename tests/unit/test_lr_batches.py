"""An epoch's mini-batches: only a last slice below the coordinator's minimum batch is merged."""

from __future__ import annotations

import numpy as np

from vflsec.services.models import lr


def test_a_short_last_batch_above_the_bound_stays_a_step() -> None:
    sizes = [b.size for b in lr.batches(np.arange(110), 64, min_size=26)]
    assert sizes == [64, 46]


def test_a_last_batch_below_the_bound_joins_the_one_before() -> None:
    parts = lr.batches(np.arange(110), 64, min_size=50)
    assert [b.size for b in parts] == [110]
    assert np.array_equal(np.concatenate(parts), np.arange(110))
    assert [b.size for b in lr.batches(np.arange(100), 22)] == [22, 22, 22, 34]  # default floor: batch_size
