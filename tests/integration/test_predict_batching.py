"""Concurrent Predicts share one round (issue 32): each request is still admitted, budgeted and released on its own.

Real services: every party a gRPC server on loopback with mTLS, CKKS training, PSI alignment. Batching is made
deterministic, not timed: the round's window is long and it closes when its N requests have joined.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import grpc
import numpy as np
import pytest

from tests.integration.conftest import Federation, federation
from vflsec.services.config import load_config
from vflsec.services.crypto import he, ring_mask
from vflsec.services.defenses.release import ParamReleaseChain, ScoreReleaseChain
from vflsec.services.engines import active as active_engine
from vflsec.services.engines import checkpoint, coordinator
from vflsec.services.models import lr
from vflsec.services.transport.tensors import from_tensor
from vflsec.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc, passive_pb2, passive_pb2_grpc

BUDGET = 200
TRAIN = slice(0, 128)


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Federation, str, list[str]]]:
    policy = {"query_budget": BUDGET, "refuse_training_ids": True}
    with federation(tmp_path_factory.mktemp("batching"), n_passive=2, query_policy=policy) as f:
        info = f.operator.create_session("ckks", batch_size=64, seed=0)
        common = sorted(f.operator.align(info.session_id))
        list(f.operator.train(info.session_id, common[TRAIN], 1))
        yield f, info.session_id, common


def _expected(f: Federation, sid: str, ids: list[str]) -> np.ndarray:
    """The unmasked model's scores of ``ids``, from every party's own block."""
    a = f.parties["active"].engine
    s_a = a.session(sid)
    index = np.array([s_a.index_of[i] for i in ids])
    z = a.data.X[s_a.rows[index]] @ s_a.trainer.weights.T + s_a.trainer.bias
    for party in ("passive-1", "passive-2"):
        p = f.parties[party].engine
        s_p = p.session(sid)
        z = z + p.data.X[s_p.rows[index]] @ s_p.trainer.weights.T
    return lr.confidence_scores(z)


def _one_round(f: Federation, sid: str, requests: list[list[str]], monkeypatch) -> tuple[list, list[int]]:
    """The requests sent concurrently into one round (it closes once all have joined); each one's reply or
    RpcError, and the size of every AdmitQueries the coordinator served."""
    a, c = f.parties["active"].engine, f.parties["coordinator"].engine
    monkeypatch.setattr(active_engine, "PREDICT_BATCH_REQUESTS", len(requests))
    monkeypatch.setattr(a, "predict_window", 60.0)  # never waited out: the round is full first
    monkeypatch.setattr(a, "_batchers", {})
    rounds: list[int] = []
    admit = c.admit_queries

    def counted(session_id, queries):  # type: ignore[no-untyped-def]
        rounds.append(len(queries))
        return admit(session_id, queries)

    monkeypatch.setattr(c, "admit_queries", counted)

    def ask(ids: list[str]):  # type: ignore[no-untyped-def]
        try:
            return f.operator.predict(sid, ids)
        except grpc.RpcError as exc:
            return exc

    with ThreadPoolExecutor(len(requests)) as pool:
        replies = list(pool.map(ask, requests))
    return replies, rounds


def test_a_round_releases_each_request_as_alone_and_decrypts_nothing(fed, monkeypatch) -> None:
    f, sid, common = fed
    decrypted: list[object] = []
    decrypt = he.CkksBackend._decrypt
    monkeypatch.setattr(he.CkksBackend, "_decrypt", lambda self, ct: decrypted.append(ct) or decrypt(self, ct))
    held = common[200:]
    # Rows shared between requests (each is its own query): row 0 of the first is also in the second.
    requests = [held[0:4], [held[0], *held[4:7]], held[7:8], held[8:13]]
    scored = f.parties["coordinator"].engine.scored.get("active", 0)
    replies, rounds = _one_round(f, sid, requests, monkeypatch)
    assert rounds == [4]  # one admission call for the four requests
    for ids, reply in zip(requests, replies, strict=True):
        assert reply.sample_ids == ids
        np.testing.assert_allclose(reply.scores, _expected(f, sid, ids), rtol=0, atol=1e-6)  # 2^-24 fixed point
    assert f.parties["coordinator"].engine.scored["active"] == scored + sum(map(len, requests))  # per request
    # The same requests alone (no batching) release the same scores.
    monkeypatch.setattr(f.parties["active"].engine, "predict_window", 0.0)
    for ids, reply in zip(requests, replies, strict=True):
        np.testing.assert_allclose(f.operator.predict(sid, ids).scores, reply.scores, rtol=0, atol=1e-6)
    assert decrypted == []  # inference sums masked words: no slot of any key is decrypted, batched or not


def test_a_refused_request_leaves_its_round_mates_and_reads_as_alone(fed, monkeypatch) -> None:
    f, sid, common = fed
    engine = f.parties["coordinator"].engine
    held = common[260:]
    monkeypatch.setattr(f.parties["active"].engine, "predict_window", 0.0)
    with pytest.raises(grpc.RpcError) as refused_alone:
        f.operator.predict(sid, [held[40], common[TRAIN][3]])
    assert refused_alone.value.code() == grpc.StatusCode.PERMISSION_DENIED
    spent = engine.scored["active"]
    # 20 samples of budget left: the round's 7 honest rows fit and its 21-row request is past the budget whatever the
    # order its requests arrive in (the rest of the fixture's budget is more than the rows there are to ask for).
    monkeypatch.setattr(engine, "policy", replace(engine.policy, budget=spent + 20))
    over = held[60:81]
    requests = [held[0:3], [held[40], common[TRAIN][3]], held[3:6], over, held[6:7]]
    replies, rounds = _one_round(f, sid, requests, monkeypatch)
    assert rounds == [5]
    training, exhausted = replies[1], replies[3]
    assert isinstance(training, grpc.RpcError) and training.code() == grpc.StatusCode.PERMISSION_DENIED
    assert training.details() == refused_alone.value.details()  # its own rows only, as alone: nothing of the others
    assert isinstance(exhausted, grpc.RpcError) and exhausted.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    for i in (0, 2, 4):
        np.testing.assert_allclose(replies[i].scores, _expected(f, sid, requests[i]), rtol=0, atol=1e-6)
    # Refused requests spend nothing; the admitted ones exactly their rows, durably (a restarted coordinator reads it).
    assert engine.scored["active"] == spent + 7
    state = checkpoint.StateDir(f.layout.workdir / "coordinator" / "state")
    schema = load_config(f.layout.configs["coordinator"]).schema
    restarted = coordinator.Coordinator(ScoreReleaseChain(), ParamReleaseChain(), {}, state=state, schema=schema)
    assert restarted.scored["active"] == spent + 7


def test_batched_rpcs_refuse_an_entry_in_its_place(fed) -> None:
    """A deviating owner's bad entry (an invented query, repeated rows, a share of the wrong size) is refused alone."""
    f, sid, common = fed
    a = f.parties["active"].engine
    s_a = a.session(sid)
    c = coordinator_pb2_grpc.CoordinatorStub(f.channel("active", "coordinator"))
    passives = [passive_pb2_grpc.PassiveStub(f.channel("active", p)) for p in ("passive-1", "passive-2")]
    held = [s_a.index_of[i] for i in common[300:306]]
    rows = [common_pb2.QueryRows(sample_index=held[:3]), common_pb2.QueryRows(sample_index=[held[3], held[3]])]
    admitted = c.AdmitQueries(coordinator_pb2.AdmitQueriesRequest(session_id=sid, queries=rows)).queries
    assert admitted[0].status.code == 0 and admitted[0].admitted.query_id
    assert admitted[1].status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "repeats rows" in admitted[1].status.message
    query = admitted[0].admitted.query_id
    shared = [
        common_pb2.QueryRows(query_id="invented", sample_index=held[3:5]),
        common_pb2.QueryRows(query_id=query, sample_index=held[:3]),
        common_pb2.QueryRows(query_id=query, sample_index=[held[4], held[4]]),
    ]
    for p in passives:
        statuses = p.ShareLogitsBatch(passive_pb2.ShareLogitsBatchRequest(session_id=sid, queries=shared)).status
        assert [s.code for s in statuses] == [
            grpc.StatusCode.FAILED_PRECONDITION.value[0], 0, grpc.StatusCode.INVALID_ARGUMENT.value[0]
        ]
        assert "no open query 'invented'" in statuses[0].message
    index = np.array(held[:3])
    own = ring_mask.encode(s_a.trainer.inference_share(a.data.X[s_a.rows[index]]))  # the owner's share, honest
    for key in s_a.share_mask_keys.values():
        own -= ring_mask.share_mask(key, sid, s_a.step, query, index, s_a.trainer.share_width)
    release = [
        common_pb2.QueryShare(query_id=query, sample_index=held[:3], share=bytes(8)),  # the wrong size
        common_pb2.QueryShare(query_id=query, sample_index=held[:3], share=ring_mask.to_bytes(own)),
    ]
    released = c.ReleaseScoresBatch(coordinator_pb2.ReleaseBatchRequest(session_id=sid, queries=release)).released
    assert released[0].status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert released[1].status.code == 0
    scores = from_tensor(released[1].scores.scores, "scores", shape=(3, 2))
    ids = [str(a.data.ids[s_a.rows[i]]) for i in held[:3]]
    np.testing.assert_allclose(scores, _expected(f, sid, ids), rtol=0, atol=1e-6)
