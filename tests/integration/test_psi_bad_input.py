"""Alignment's bad input through the live services (real gRPC, mTLS): an empty side, an empty intersection and a
refused exchange each give an error naming the party and the problem; nothing is left half-aligned, and a
session whose exchange failed before any reply aligns again. (Duplicate and non-string IDs, bad points and
mismatched salts are pinned on the PSI functions in tests/unit/test_psi*.py; party data files refuse duplicate
IDs when loaded.)"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from tests.integration.conftest import Federation, federation


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    with federation(tmp_path_factory.mktemp("psi-bad"), n_passive=2, allow_plain=True) as running:
        yield running


@contextlib.contextmanager
def _ids(fed: Federation, party: str, ids: np.ndarray) -> Iterator[None]:
    """A party's IDs replaced for the duration (its features are not read by alignment)."""
    data = fed.parties[party].engine.data
    original, data.ids = data.ids, ids
    try:
        yield
    finally:
        data.ids = original


def _refused(fed: Federation, session_id: str) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        fed.operator.align(session_id)
    return err.value.code(), err.value.details()


def _session(fed: Federation, seed: int) -> str:
    return fed.operator.create_session("plain", seed=seed).session_id


def _engine(fed: Federation, party: str):
    return fed.parties[party].engine


def test_empty_active_side_is_refused_before_anything_is_sent_and_the_session_stays_usable(fed) -> None:
    session_id = _session(fed, 1)
    with _ids(fed, "active", np.array([], dtype=str)):
        code, details = _refused(fed, session_id)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "PSI: active holds no sample IDs" in details
    assert len(fed.operator.align(session_id)) > 0


def test_empty_passive_side_names_the_party(fed) -> None:
    session_id = _session(fed, 2)
    with _ids(fed, "passive-2", np.array([], dtype=str)):
        code, details = _refused(fed, session_id)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "PSI: passive-2 holds no sample IDs" in details
    assert _engine(fed, "active").session(session_id).rows is None  # nothing half-aligned
    assert all(_engine(fed, p).session(session_id).rows is None for p in ("passive-1", "passive-2"))


def test_empty_intersection_names_every_party_and_its_size(fed) -> None:
    session_id = _session(fed, 3)
    renamed = np.array([f"other-{i}" for i in _engine(fed, "passive-1").data.ids])
    with _ids(fed, "passive-1", renamed):
        code, details = _refused(fed, session_id)
    n_active = len(_engine(fed, "active").data.ids)
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"PSI: no sample ID is common to all of active ({n_active} IDs), passive-1 ({len(renamed)} IDs)" in details
    assert _engine(fed, "active").session(session_id).rows is None
    # The passive parties answered, so they hold this session's exchange: a new session aligns.
    code, details = _refused(fed, session_id)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "open a new session" in details
    assert len(fed.operator.align(_session(fed, 4))) > 0


def test_exchange_every_passive_party_refused_can_be_retried_on_the_same_session(fed) -> None:
    # A passive party that answered keeps its one exchange for the session (it cannot tell a lost reply from a
    # second attempt), so a retry on the same session needs every one of them to have refused.
    session_id = _session(fed, 5)
    engines = [_engine(fed, p) for p in ("passive-1", "passive-2")]
    cap = engines[0].psi_max_ids
    for engine in engines:
        engine.psi_max_ids = 10
    try:
        code, details = _refused(fed, session_id)
    finally:
        for engine in engines:
            engine.psi_max_ids = cap
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "call to passive-1 failed" in details and "over this party's cap of 10" in details
    assert len(fed.operator.align(session_id)) > 0


def test_exchange_refused_by_one_of_two_passive_parties_needs_a_new_session(fed) -> None:
    session_id = _session(fed, 6)
    engine = _engine(fed, "passive-2")
    cap, engine.psi_max_ids = engine.psi_max_ids, 10
    try:
        code, details = _refused(fed, session_id)
    finally:
        engine.psi_max_ids = cap
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "call to passive-2 failed" in details
    code, details = _refused(fed, session_id)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "passive-1" in details and "open a new session" in details
    assert len(fed.operator.align(_session(fed, 7))) > 0
