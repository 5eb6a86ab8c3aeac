"""Issue 11 review, M3: the row bitmaps (RowSet) grew to the largest index a peer sent, a byte per row: one index
of 2^33 took 8 GB. Every update now names its bound, and the coordinator refuses indices beyond it (its
[limits] psi_max_ids: no session aligns more rows) with INVALID_ARGUMENT, before anything is computed or stored."""

from __future__ import annotations

import numpy as np
import pytest

from vflsec.services.crypto import ring_mask
from vflsec.services.defenses.release import ParamReleaseChain, ScoreReleaseChain
from vflsec.services.engines.coordinator import Coordinator
from vflsec.services.engines.sessions import RowSet
from vflsec.services.errors import InvalidArgument

HUGE = 2**33
N = 8  # rows per batch: 2 x the widest block
WIDTHS = {"active": 3, "passive-1": 2}


def test_a_row_set_refuses_an_index_beyond_its_bound_and_does_not_grow() -> None:
    rows = RowSet()
    rows.update([3, 7], limit=10)
    size = rows.packed().size
    with pytest.raises(ValueError, match="beyond the 10 rows"):
        rows.update([1, HUGE], limit=10)
    assert rows.array().tolist() == [3, 7] and rows.packed().size == size  # nothing added, nothing grown
    rows.update([9], limit=10)
    assert rows.array().tolist() == [3, 7, 9] and rows.packed().size <= 2  # doubling stops at the bound


class _Peer:
    def __init__(self, k: int) -> None:
        self.k = k

    def weights(self, session_id: str) -> np.ndarray:
        return np.zeros((self.k, 2))

    def disclose(self, session_id: str, specs: list[str]) -> list:
        return []

    def trained_rows(self, session_id: str) -> np.ndarray:
        return np.array([0, HUGE])

    def aligned_rows(self, session_id: str) -> int:
        return 1000


def _coordinator(max_rows: int = 1000) -> Coordinator:
    peers: dict[str, _Peer] = {}
    c = Coordinator(
        ScoreReleaseChain.from_specs(()), ParamReleaseChain.from_specs(()), peers, allowed_backends=("plain",),
        max_rows=max_rows,
    )
    c.open_session("s", "plain", 2, ["passive-1"], owner="active")
    peers["passive-1"] = _Peer(c.sessions["s"].trainer.share_width)
    return c


def test_a_training_index_beyond_the_bound_is_invalid_argument_and_nothing_is_recorded() -> None:
    c = _coordinator()
    share = ring_mask.to_bytes(ring_mask.encode(np.zeros((N, 1))))
    index = np.array([*range(N - 1), HUGE])
    with pytest.raises(InvalidArgument, match="sample_index: row index 8589934592 is beyond the 1000 rows"):
        c.training_scores("s", 1, share, 1, index, WIDTHS)
    with pytest.raises(InvalidArgument, match="sample_index: row index 8589934592 is beyond the 1000 rows"):
        c.family_call("s", "passive-1", "submit_training_share", step=1, sample_index=index, share=share)
    s = c.sessions["s"]
    assert s.last_step == 0 and len(s.trained_index) == 0 and s.trained_index.packed().size == 0
    c.family_call("s", "passive-1", "submit_training_share", step=1, sample_index=np.arange(N), share=share)
    c.training_scores("s", 1, share, 1, np.arange(N), WIDTHS)  # the session goes on
    assert s.last_step == 1 and s.trained_index.array().tolist() == list(range(N))


def test_a_passive_partys_trained_rows_beyond_the_bound_are_refused_at_finish_training() -> None:
    c = _coordinator()
    with pytest.raises(InvalidArgument, match="passive-1's trained rows: row index 8589934592 is beyond the 1000"):
        c.finish_training("s")
    assert len(c.sessions["s"].passive_trained) == 0 and c.sessions["s"].passive_trained.packed().size == 0
