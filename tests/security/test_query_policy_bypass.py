"""Probes (finding 5): the coordinator's query policy cannot be bypassed by the active party.

- shares of invented indices while refuse_training_ids is on are refused, and a crafted own share added to a
  passive share learns nothing of z_p on the training rows (inference sums masked words; nothing is decrypted);
- the training-ID refusal trusts the rows the passive parties trained on, not the active party's report;
- the budget is the owner's: a new session does not reset it, and it survives a coordinator restart;
- no release before FinishTraining, nor while the session trains again;
- a chunked predict is admitted whole or refused whole: a later chunk that the policy would refuse means
  nothing is released.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from tests.security.conftest import Federation, federation
from vflsec.services.config import load_config
from vflsec.services.defenses.release import ParamReleaseChain, ScoreReleaseChain
from vflsec.services.engines import checkpoint, coordinator
from vflsec.v1 import coordinator_pb2, coordinator_pb2_grpc, passive_pb2, passive_pb2_grpc

BUDGET = 100
TRAIN, HELD_OUT = slice(0, 128), slice(300, None)


def _status(fn, *args) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        fn(*args)
    return err.value.code(), err.value.details()


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Federation, str, list[str]]]:
    policy = {"query_budget": BUDGET, "refuse_training_ids": True}
    with federation(tmp_path_factory.mktemp("bypass"), n_passive=1, query_policy=policy) as f:
        info = f.operator.create_session("ckks", batch_size=64, seed=0)
        common = sorted(f.operator.align(info.session_id))
        list(f.operator.train(info.session_id, common[TRAIN], 1))
        yield f, info.session_id, common


def _index(f: Federation, session_id: str, ids: list[str]) -> np.ndarray:
    s = f.parties["active"].engine.session(session_id)
    return np.array([s.index_of[i] for i in ids], dtype=np.int64)


def test_training_ciphertext_with_invented_indices_is_refused(fed) -> None:
    f, sid, common = fed
    c = coordinator_pb2_grpc.CoordinatorStub(f.channel("active", "coordinator"))
    p = passive_pb2_grpc.PassiveStub(f.channel("active", "passive-1"))
    passive = f.parties["passive-1"].engine
    trained, held = _index(f, sid, common[TRAIN][:10]), _index(f, sid, common[HELD_OUT][:10])

    # The inference Forward the attacker used to get on any rows is gone, and Forward with it (retired: the
    # training forward goes to the coordinator masked); its successor serves training steps only.
    code, details = _status(p.Forward, passive_pb2.ForwardRequest(session_id=sid, step=-1, sample_index=trained))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "ShareTrainingLogits" in details
    request = passive_pb2.ForwardRequest(session_id=sid, step=-1, sample_index=trained)
    code, details = _status(p.ShareTrainingLogits, request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "training steps >= 1" in details

    def release(query_id: str, index: np.ndarray):  # a crafted own share: zero words
        request = coordinator_pb2.ReleaseScoresRequest(
            session_id=sid, query_id=query_id, share=bytes(8 * len(index)), sample_index=index.tolist()
        )
        return c.ReleaseScores(request)

    # Invented indices, no admitted query: nothing is decrypted.
    code, details = _status(release, "invented", held)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "AdmitQuery" in details
    # The training rows themselves are refused at admission, even when the active party under-reported its
    # training batches: the coordinator also holds the rows the passive party says it trained on.
    f.parties["coordinator"].engine.session(sid).trained_index.clear()
    admit = coordinator_pb2.AdmitQueryRequest(session_id=sid, sample_index=trained.tolist())
    code, details = _status(c.AdmitQuery, admit)
    assert code == grpc.StatusCode.PERMISSION_DENIED and "used in training" in details
    # Admitted held-out rows: the sum is refused until passive-1 itself has shared those rows.
    query = c.AdmitQuery(coordinator_pb2.AdmitQueryRequest(session_id=sid, sample_index=held.tolist()))
    code, details = _status(release, query.query_id, held)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "passive-1 sent no share" in details
    # With passive-1's share, the crafted own share leaves passive-1's mask in the sum: the released scores tell
    # nothing about z_p on the training rows (nor on the held-out ones).
    p.ShareLogits(passive_pb2.ShareLogitsRequest(session_id=sid, query_id=query.query_id, sample_index=held))
    rows = passive.session(sid).rows
    w = passive.weights(sid)
    z_p_train = (passive.data.X[rows[trained]] @ w.T)[:, 0]
    z_p_held = (passive.data.X[rows[held]] @ w.T)[:, 0]
    try:
        released = release(query.query_id, held)
    except grpc.RpcError as exc:  # the sum decrypts to garbage: refused outright is fine too
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.details()
        return
    scores = np.frombuffer(released.scores.data, dtype=np.float64).reshape(-1, 2)[:, 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        recovered = np.log(scores) - np.log1p(-scores) - z_p_held  # what the probe recovered before the fix
    assert not np.allclose(recovered, z_p_train, atol=0.5), (recovered, z_p_train)


def test_budget_is_per_owner_across_sessions_and_restarts(fed) -> None:
    f, _, _ = fed
    engine = f.parties["coordinator"].engine
    other = f.operator.create_session("ckks", batch_size=64, seed=1)
    other_common = sorted(f.operator.align(other.session_id))
    list(f.operator.train(other.session_id, other_common[TRAIN], 1))
    spent = engine.scored["active"]
    assert spent > 0  # admitted in another session, counted for this owner
    remaining = BUDGET - spent
    code, details = _status(f.operator.predict, other.session_id, other_common[HELD_OUT][: remaining + 1])
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and f"{spent} of {BUDGET}" in details
    assert engine.scored["active"] == spent  # a refused query spends nothing
    f.operator.predict(other.session_id, other_common[HELD_OUT][:3])
    # A restarted coordinator reads the ledger (and the sessions) from its state.
    state = checkpoint.StateDir(f.layout.workdir / "coordinator" / "state")
    schema = load_config(f.layout.configs["coordinator"]).schema  # a smaller key epoch would refuse the session
    restarted = coordinator.Coordinator(ScoreReleaseChain(), ParamReleaseChain(), {}, state=state, schema=schema)
    assert restarted.scored["active"] == spent + 3
    assert restarted.session(other.session_id).finished_step is not None


def test_no_release_before_finish_training_nor_while_training(fed) -> None:
    f, _, _ = fed
    op = f.operator
    info = op.create_session("ckks", batch_size=32, seed=2)
    common = sorted(op.align(info.session_id))
    code, details = _status(op.predict, info.session_id, common[HELD_OUT][:2])
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "FinishTraining" in details
    list(op.train(info.session_id, common[:64], 1))
    # Training again: from its first step until FinishTraining, nothing is released.
    again = op.train(info.session_id, common[:96], 1)
    next(again)
    code, details = _status(op.predict, info.session_id, common[HELD_OUT][:2])
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "training" in details
    assert list(again)[-1].done
    assert op.predict(info.session_id, common[HELD_OUT][:2]).scores.shape == (2, 2)


def test_chunked_predict_is_admitted_whole_or_refused_whole(fed, monkeypatch) -> None:
    f, sid, common = fed
    active, engine = f.parties["active"].engine, f.parties["coordinator"].engine
    monkeypatch.setattr(active, "_predict_chunk_rows", lambda s: 8)
    releases = []
    lock = threading.Lock()
    real_release = active.coordinator.release_scores

    def counting_release(*args, **kwargs):
        with lock:
            releases.append(len(args[3]))  # (session, query, own share, sample_index, ...)
        return real_release(*args, **kwargs)

    monkeypatch.setattr(active.coordinator, "release_scores", counting_release)
    session = engine.session(sid)
    held = common[HELD_OUT][100:]
    # The control: a 20-row predict really goes out in chunks of 8.
    assert f.operator.predict(sid, held[:20]).scores.shape == (20, 2)
    assert releases == [8, 8, 4]
    releases.clear()
    released_before, spent = session.scored, engine.scored["active"]
    # A training row in the last chunk: refused before the first chunk is released.
    code, _ = _status(f.operator.predict, sid, [*held[20:37], common[TRAIN][0]])
    assert code == grpc.StatusCode.PERMISSION_DENIED
    # More rows than the budget has left, the overflow only in a later chunk: refused whole.
    remaining = BUDGET - spent
    assert remaining > 8
    code, _ = _status(f.operator.predict, sid, held[40 : 40 + remaining + 1])
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert releases == [] and session.scored == released_before and engine.scored["active"] == spent


def test_pending_shares_per_query_are_bounded(fed) -> None:
    """The owner cannot make the coordinator hold shares of arbitrarily many row subsets of one query."""
    f, sid, common = fed
    c = coordinator_pb2_grpc.CoordinatorStub(f.channel("active", "coordinator"))
    p = passive_pb2_grpc.PassiveStub(f.channel("active", "passive-1"))
    held = _index(f, sid, common[HELD_OUT][60 : 60 + coordinator.MAX_PENDING_CHUNKS + 1])
    query = c.AdmitQuery(coordinator_pb2.AdmitQueryRequest(session_id=sid, sample_index=held.tolist()))

    def share(rows: np.ndarray) -> None:
        p.ShareLogits(passive_pb2.ShareLogitsRequest(session_id=sid, query_id=query.query_id, sample_index=rows))

    for row in held[:-1]:
        share([row])
    code, details = _status(share, held[-1:])
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "waiting for release" in details
    outside = _index(f, sid, common[HELD_OUT][:1])  # an aligned row this query never admitted
    code, details = _status(share, outside)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "not an unreleased row" in details
