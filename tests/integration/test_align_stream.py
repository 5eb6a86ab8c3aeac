"""Alignment through the live services (real gRPC, mTLS, two passive parties): AlignStream reports the work
as it goes and returns the common IDs in bounded chunks, in the common order; a PsiFinish that fails at one
passive party leaves the session unaligned at the active party, and the next Align finishes it with the same
positions, so every party ends on the same common rows."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from tests.integration.conftest import Federation, federation
from vflsec.services.crypto import oprf
from vflsec.services.engines.active import ActiveSession
from vflsec.services.rpc import active as active_rpc
from vflsec.services.transport.server import peer_channel
from vflsec.v1 import active_pb2_grpc, common_pb2

STAGES = ("blinding", "exchanging", "re-blinding", "finishing")


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    folder = tmp_path_factory.mktemp("align-stream")
    with federation(folder, n_passive=2, allow_plain=True, psi_protocol="oprf") as running:
        yield running


def _session(fed: Federation, seed: int) -> str:
    return fed.operator.create_session("plain", seed=seed).session_id


def _engine(fed: Federation, party: str):
    return fed.parties[party].engine


def _ids_of(fed: Federation, party: str, rows: np.ndarray) -> np.ndarray:
    return _engine(fed, party).data.ids[rows]


def test_align_stream_reports_counts_and_returns_the_common_ids_in_chunks(fed, monkeypatch) -> None:
    monkeypatch.setattr(active_rpc, "ALIGN_CHUNK_IDS", 64)
    session_id = _session(fed, 1)
    stub = active_pb2_grpc.ActiveStub(fed.channel("operator", "active"))
    updates = list(stub.AlignStream(common_pb2.SessionRef(session_id=session_id)))
    progress = [u.progress for u in updates if u.HasField("progress")]
    chunks = [u.common for u in updates if u.HasField("common")]
    assert progress and all(u.HasField("progress") for u in updates[: len(progress)])  # progress comes first
    assert [p.done for p in progress] == sorted(p.done for p in progress)
    assert {p.stage for p in progress} <= set(STAGES) and progress[-1].stage == "finishing"
    # Every party's size was announced at JoinSession: the counts end at the whole work, OPRF's (this federation's)
    # U rows (m bins and 64 pad rows) and values, sum(m + 64 + 3 n_p) (ECDH's curve work is n_a + sum(n_a + 2 n_p)).
    n_active = len(_engine(fed, "active").data.ids)
    assert _engine(fed, "active").psi_protocol == "oprf"
    parties = ("passive-1", "passive-2")
    total = sum(oprf.bins(n_active) + oprf.CHECKS + 3 * len(_engine(fed, p).data.ids) for p in parties)
    assert progress[-1].done == progress[-1].total == total
    rows = _engine(fed, "active").session(session_id).rows
    assert len(chunks) == -(-len(rows) // 64) > 1 and all(len(c.common_ids) <= 64 for c in chunks)
    assert {(c.n_active, c.n_common) for c in chunks} == {(n_active, len(rows))}
    common = [i for c in chunks for i in c.common_ids]
    assert common == _ids_of(fed, "active", rows).tolist()  # the common order, as the passive parties hold it
    for party in ("passive-1", "passive-2"):
        assert common == _ids_of(fed, party, _engine(fed, party).session(session_id).rows).tolist()


def test_the_operator_sees_the_counts_and_the_unary_align_still_answers(fed) -> None:
    seen: list[tuple[int, int, str]] = []
    common = fed.operator.align(_session(fed, 2), lambda done, total, stage: seen.append((done, total, stage)))
    assert seen and seen[-1][0] == seen[-1][1] and len(common) > 0
    session_id = _session(fed, 3)
    reply = active_pb2_grpc.ActiveStub(fed.channel("operator", "active")).Align(
        common_pb2.SessionRef(session_id=session_id)
    )
    assert sorted(reply.common_ids) == sorted(common) and reply.n_common == len(common)


def test_a_psi_finish_failing_at_the_second_passive_party_is_finished_by_the_next_align(fed, monkeypatch) -> None:
    session_id = _session(fed, 4)
    second = _engine(fed, "passive-2")
    original, calls = second.psi_finish, []

    def fails_once(sid: str, positions: np.ndarray) -> int:
        calls.append(sid)
        if len(calls) == 1:
            raise RuntimeError("disk full (injected)")
        return original(sid, positions)

    monkeypatch.setattr(second, "psi_finish", fails_once)
    with pytest.raises(grpc.RpcError) as err:
        fed.operator.align(session_id)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "PsiFinish failed at passive-2" in err.value.details() and "disk full (injected)" in err.value.details()
    active = _engine(fed, "active").session(session_id)
    assert active.rows is None and active.pending is not None  # not aligned: nothing may train on it
    with pytest.raises(grpc.RpcError) as err:
        list(fed.operator.train(session_id, ["0"], 1))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "not aligned" in err.value.details()
    restored = ActiveSession.from_state(session_id, *active.to_state(), _engine(fed, "active").data.ids)
    assert restored.rows is None  # a restarted active party resumes the finish with the same positions
    np.testing.assert_array_equal(restored.pending.active_rows, active.pending.active_rows)
    for got, want in zip(restored.pending.passive_positions, active.pending.passive_positions, strict=True):
        np.testing.assert_array_equal(got, want)
    first_rows = _engine(fed, "passive-1").session(session_id).rows.copy()
    assert second.session(session_id).rows is None

    seen: list[tuple[int, int, str]] = []
    common = fed.operator.align(session_id, lambda *p: seen.append(p))  # no second exchange: the same positions
    assert len(calls) == 2 and seen[-1][0] == seen[-1][1] and {stage for *_, stage in seen} == {"finishing"}
    rows = active.rows
    assert active.pending is None and common == _ids_of(fed, "active", rows).tolist()
    np.testing.assert_array_equal(_engine(fed, "passive-1").session(session_id).rows, first_rows)
    for party in ("passive-1", "passive-2"):
        assert common == _ids_of(fed, party, _engine(fed, party).session(session_id).rows).tolist()
    # Aligned: Align again runs no exchange and answers the same common IDs (a reply lost on the way loses nothing).
    assert fed.operator.align(session_id) == common and len(calls) == 2
    np.testing.assert_array_equal(_engine(fed, "passive-1").session(session_id).rows, first_rows)


def test_positions_refused_at_every_passive_party_void_the_exchange_and_the_next_align_exchanges_anew(
    fed, monkeypatch
) -> None:
    # Review 15, F2: a refused list voids the passive party's exchange, so the active party drops its intersection
    # rather than send the same positions forever. The bad lists (one position twice) stand in for a buggy sender.
    session_id = _session(fed, 6)
    calls: list[str] = []
    for party in ("passive-1", "passive-2"):
        engine = _engine(fed, party)

        def doubled(sid: str, positions: np.ndarray, original=engine.psi_finish, party=party) -> int:
            calls.append(party)
            bad = calls.count(party) == 1
            return original(sid, np.concatenate([positions, positions[:1]]) if bad else positions)

        monkeypatch.setattr(engine, "psi_finish", doubled)
    with pytest.raises(grpc.RpcError) as err:
        fed.operator.align(session_id)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "voided the exchange), and Align runs a new exchange" in err.value.details()
    active = _engine(fed, "active").session(session_id)
    assert active.rows is None and active.pending is None
    common = fed.operator.align(session_id)  # a new exchange, charged again, and a good finish
    assert sorted(calls) == ["passive-1"] * 2 + ["passive-2"] * 2
    assert common == _ids_of(fed, "active", active.rows).tolist()


def test_a_reply_the_operator_could_not_receive_is_answered_again_without_a_second_exchange(fed) -> None:
    """The unary Align to a client whose receive limit is below the reply: the exchange ran and the session is
    aligned, but the IDs never arrived (RESOURCE_EXHAUSTED at the client). Asking again answers them, and no passive
    party runs a second exchange (its rows stay the ones it took)."""
    session_id = _session(fed, 5)
    small = peer_channel(fed.layout.addresses["active"], "active", fed.layout.tls("operator"), 256)
    with pytest.raises(grpc.RpcError) as err:
        active_pb2_grpc.ActiveStub(small).Align(common_pb2.SessionRef(session_id=session_id))
    small.close()
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    taken = {p: _engine(fed, p).session(session_id).rows.copy() for p in ("passive-1", "passive-2")}
    common = fed.operator.align(session_id)
    assert common == _ids_of(fed, "active", _engine(fed, "active").session(session_id).rows).tolist()
    for party, rows in taken.items():
        np.testing.assert_array_equal(_engine(fed, party).session(session_id).rows, rows)
        assert common == _ids_of(fed, party, rows).tolist()
