"""Alignment's bad input through the live services (real gRPC, mTLS): an empty side, an empty intersection,
duplicate or non-string IDs, mismatched salts, a list over the relative cap, and a chunk stream out of order,
with a chunk repeated, missing or beyond the announced count, or cut mid-way (by either side) each give an error
naming the party and the problem; nothing is left half-aligned, and a session whose exchange failed before any
passive party sent its own list aligns again. The active party runs ECDH here ([psi] protocol = "ecdh"), whose
PsiExchangeStream these chunk rules guard; the OPRF exchange's bad input is tests/integration/test_psi_oprf.py's.
(Bad points are pinned in tests/security/test_psi.py and the PSI functions in tests/unit/test_psi*.py; party data
files refuse duplicate IDs when loaded.)"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
from collections.abc import Iterable, Iterator

import grpc
import numpy as np
import pytest

from tests.integration.conftest import Federation, federation
from vflsec.services.crypto import psi
from vflsec.services.transport import psi_stream
from vflsec.v1 import passive_pb2, passive_pb2_grpc


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    with federation(tmp_path_factory.mktemp("psi-bad"), n_passive=2, allow_plain=True, psi_protocol="ecdh") as running:
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
    # Nothing was aligned: the same session aligns once the IDs are fixed (a fresh exchange under new keys).
    assert len(fed.operator.align(session_id)) > 0


def test_exchange_every_passive_party_refused_can_be_retried_on_the_same_session(fed) -> None:
    session_id = _session(fed, 5)
    engines = [_engine(fed, p) for p in ("passive-1", "passive-2")]
    caps = engines[0].psi_caps
    for engine in engines:
        engine.psi_caps = dataclasses.replace(caps, max_ids=10)
    try:
        code, details = _refused(fed, session_id)
    finally:
        for engine in engines:
            engine.psi_caps = caps
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "call to passive-1 failed" in details and "over this party's cap of 10" in details
    assert len(fed.operator.align(session_id)) > 0


def test_exchange_refused_by_one_of_two_passive_parties_is_retried_on_the_same_session(fed) -> None:
    # passive-1 answered (its own list left) while passive-2 refused: nothing is aligned anywhere, and the retry
    # exchanges again with both (passive-1 under a fresh key; its rows are fixed only by PsiFinish).
    session_id = _session(fed, 6)
    engine = _engine(fed, "passive-2")
    caps = engine.psi_caps
    engine.psi_caps = dataclasses.replace(caps, max_ids=10)
    try:
        code, details = _refused(fed, session_id)
    finally:
        engine.psi_caps = caps
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "call to passive-2 failed" in details
    assert _engine(fed, "passive-1").session(session_id).psi_permutation is not None
    assert all(_engine(fed, p).session(session_id).rows is None for p in ("active", "passive-1", "passive-2"))
    common = fed.operator.align(session_id)
    assert len(common) > 0
    for party in ("passive-1", "passive-2"):
        assert _engine(fed, party).session(session_id).rows is not None


# --- the streamed exchange: chunk rules, cut streams, bad ids, the relative cap ---


def _points(n: int) -> np.ndarray:
    """n valid blinded points (as a deviating active party could send)."""
    return psi.PsiKey().blind([f"probe-{i}" for i in range(n)], psi.new_salt(), workers=1)


def _raw_exchange(fed: Federation, session_id: str, chunks: Iterable[psi.Chunk], salt: bytes = b"salt") -> list:
    """A PsiExchangeStream to passive-1 with the active party's certificate, chunks as given; the reply messages."""
    with fed.channel("active", "passive-1") as channel:
        stub = passive_pb2_grpc.PassiveStub(channel)
        return list(stub.PsiExchangeStream(psi_stream.requests(session_id, salt, chunks), timeout=60))


def _cut(points: np.ndarray, per_chunk: int) -> list[psi.Chunk]:
    n = -(-len(points) // per_chunk)
    return [
        psi.Chunk(i, n, len(points), points[i * per_chunk : (i + 1) * per_chunk].tobytes()) for i in range(n)
    ]


def _stream_refused(fed: Federation, session_id: str, chunks: Iterable[psi.Chunk], **kw) -> tuple:
    with pytest.raises(grpc.RpcError) as err:
        _raw_exchange(fed, session_id, chunks, **kw)
    return err.value.code(), err.value.details()


def _nothing_kept(fed: Federation, session_id: str) -> None:
    """passive-1 holds no exchange for the session: the honest active party aligns it."""
    assert _engine(fed, "passive-1").session(session_id).psi_permutation is None
    assert len(fed.operator.align(session_id)) > 0


@pytest.mark.parametrize(
    ("fault", "problem"),
    [
        ("out of order", "chunk 2 out of order: chunk 1 missing"),
        ("repeated", "chunk 1 repeated (chunk 2 expected)"),
        ("missing last", "the list ends after 3 of 4 chunks"),
        ("more than announced", "chunk 4 beyond the 4 announced"),
        ("total changed", "chunk 1 announces 4 chunks of 21 points, the first 4 chunks of 20 points"),
        ("too many points", "chunk 3 of 4 brings the list to 25 points, 20 announced"),
        ("bad count", "chunk 0 announces 40 chunks for 20 points: each chunk carries 1 to 8192 points"),
        ("ragged data", "chunk 1 holds 31 bytes, not 1 to 8192 values of 32 bytes"),
    ],
)
def test_broken_chunk_streams_are_refused_naming_the_problem_and_keep_nothing(fed, fault: str, problem: str) -> None:
    session_id = _session(fed, 20)
    chunks = _cut(_points(20), 5)  # 4 chunks of 5 points
    if fault == "out of order":
        chunks = [chunks[0], chunks[2], chunks[1], chunks[3]]
    elif fault == "repeated":
        chunks = [chunks[0], chunks[1], chunks[1], chunks[2], chunks[3]]
    elif fault == "missing last":
        chunks = chunks[:3]
    elif fault == "more than announced":
        chunks = [*chunks, psi.Chunk(4, 4, 20, chunks[0].data)]
    elif fault == "total changed":
        chunks[1] = dataclasses.replace(chunks[1], points=21)
    elif fault == "too many points":
        chunks[3] = dataclasses.replace(chunks[3], data=chunks[3].data * 2)
    elif fault == "bad count":
        chunks = [dataclasses.replace(c, chunks=40) for c in chunks]
    elif fault == "ragged data":
        chunks[1] = dataclasses.replace(chunks[1], data=chunks[1].data[:31])
    code, details = _stream_refused(fed, session_id, chunks)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"PSI: the active party's list: {problem}" in details
    _nothing_kept(fed, session_id)


def test_stream_cut_by_the_active_party_mid_way_keeps_nothing(fed) -> None:
    session_id = _session(fed, 21)
    chunks = _cut(_points(20), 5)
    sent, hold = threading.Event(), threading.Event()

    def two_then_wait() -> Iterator[passive_pb2.PsiExchangeChunk]:
        requests = psi_stream.requests(session_id, b"salt", chunks)
        yield next(requests)
        yield next(requests)
        sent.set()
        hold.wait(30)  # the call is cancelled meanwhile

    with fed.channel("active", "passive-1") as channel:
        call = passive_pb2_grpc.PassiveStub(channel).PsiExchangeStream(two_then_wait(), timeout=60)
        assert sent.wait(30)
        call.cancel()
        with pytest.raises(grpc.RpcError) as err:
            list(call)
        hold.set()
    assert err.value.code() == grpc.StatusCode.CANCELLED
    _nothing_kept(fed, session_id)


def test_empty_stream_and_missing_salt_are_refused(fed) -> None:
    session_id = _session(fed, 22)
    code, details = _stream_refused(fed, session_id, [])
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "PSI: the active party sent no IDs" in details
    code, details = _stream_refused(fed, session_id, _cut(_points(3), 3), salt=b"")
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "PSI: the active party sent no salt" in details
    _nothing_kept(fed, session_id)


@pytest.mark.parametrize("party", ["active", "passive-1"])
def test_duplicate_ids_name_the_party_and_both_rows(fed, party: str) -> None:
    session_id = _session(fed, 23)
    ids = _engine(fed, party).data.ids.copy()
    ids[5] = ids[2]
    with _ids(fed, party, ids):
        code, details = _refused(fed, session_id)
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"PSI: {party}'s own IDs: duplicate ids at rows 2 and 5" in details
    assert _engine(fed, "active").session(session_id).rows is None
    # Nothing aligned anywhere: the same session aligns once the IDs are fixed.
    assert len(fed.operator.align(session_id)) > 0


@pytest.mark.parametrize("party", ["active", "passive-1"])
def test_ids_that_are_not_strings_name_the_party_and_the_row(fed, party: str) -> None:
    session_id = _session(fed, 25)
    ids = _engine(fed, party).data.ids.astype(object)
    ids[3] = 17
    with _ids(fed, party, ids):
        code, details = _refused(fed, session_id)
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"PSI: {party}'s own IDs: sample id at row 3 is a int, not a string" in details
    assert _engine(fed, "active").session(session_id).rows is None


def test_mismatched_salts_find_no_common_id(fed, monkeypatch) -> None:
    # The salt only separates sessions and travels in the clear; a passive party hashing under another one (a bug
    # or a deviation) shares no value with the active list: to the active party that is an empty intersection.
    engine = _engine(fed, "passive-1")
    honest = engine.psi_exchange
    monkeypatch.setattr(engine, "psi_exchange", lambda sid, salt, chunks: honest(sid, salt + b"!", chunks))
    code, details = _refused(fed, _session(fed, 26))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "PSI: no sample ID is common to all of active" in details


def _tampered(fault: str):
    """A passive reply re-cut into chunks of 100 points, then broken as ``fault`` says."""

    def reply(stream: Iterator[tuple[str, psi.Chunk]]) -> Iterator[tuple[str, psi.Chunk]]:
        for name, chunk in stream:
            points = np.frombuffer(chunk.data, dtype=f"S{psi.POINT_BYTES}")
            chunks = _cut(points, 100)
            if name == psi.OWN and fault == "repeated":
                chunks.insert(2, chunks[1])
            elif name == psi.OWN and fault == "cut":
                chunks = chunks[:-1]
            elif name == psi.DOUBLE and fault == "out of order":
                chunks[0], chunks[1] = chunks[1], chunks[0]
            yield from ((name, c) for c in chunks)

    return reply


@pytest.mark.parametrize(
    ("fault", "problem"),
    [
        ("out of order", "chunk 1 out of order: chunk 0 missing"),
        ("repeated", "chunk 1 repeated (chunk 2 expected)"),
        ("cut", "the list ends after 5 of 6 chunks"),
    ],
)
def test_broken_reply_stream_is_refused_by_the_active_party(fed, monkeypatch, fault: str, problem: str) -> None:
    engine = _engine(fed, "passive-1")
    assert 500 < len(engine.data.ids) <= 600  # 6 chunks of 100 points
    honest = engine.psi_exchange
    monkeypatch.setattr(engine, "psi_exchange", lambda *args: _tampered(fault)(honest(*args)))
    session_id = _session(fed, 27)
    code, details = _refused(fed, session_id)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and f"PSI: passive-1's reply: {problem}" in details
    assert all(_engine(fed, p).session(session_id).rows is None for p in ("active", "passive-1", "passive-2"))
    monkeypatch.undo()
    assert len(fed.operator.align(_session(fed, 28))) > 0


def _refused_under_ratio(fed, engine, session_id: str) -> tuple[grpc.StatusCode, str]:
    """Align ``session_id`` with ``engine``'s cap lowered to 0.5 x its own set (and no floor: a test's lists sit
    under the default one); the engine's caps are restored afterwards."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine, "psi_caps", dataclasses.replace(engine.psi_caps, max_ratio=0.5, ratio_floor=0))
        return _refused(fed, session_id)


def test_passive_party_caps_the_active_list_relative_to_its_own_set(fed) -> None:
    engine = _engine(fed, "passive-1")
    n_own, n_active = len(engine.data.ids), len(_engine(fed, "active").data.ids)
    session_id = _session(fed, 29)
    code, details = _refused_under_ratio(fed, engine, session_id)
    smallest = math.ceil(n_active * 100 / n_own) / 100
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "call to passive-1 failed" in details
    assert (
        f"PSI: the active party's list: {n_active} IDs announced, over 0.5 x this party's own {n_own} IDs "
        f"([limits] psi_max_ratio; the smallest that accepts them is {smallest:g};"
    ) in details
    assert engine.session(session_id).psi_permutation is None  # refused before any point
    assert len(fed.operator.align(_session(fed, 30))) > 0  # the default (2) accepts equal-size sets


def test_active_party_caps_each_passive_list_relative_to_its_own_set(fed) -> None:
    engine = _engine(fed, "active")
    n_own, n_passive = len(engine.data.ids), len(_engine(fed, "passive-1").data.ids)
    session_id = _session(fed, 31)
    code, details = _refused_under_ratio(fed, engine, session_id)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"{n_passive} IDs announced, over 0.5 x this party's own {n_own} IDs ([limits] psi_max_ratio" in details
    assert engine.session(session_id).rows is None
    assert len(fed.operator.align(_session(fed, 32))) > 0
