"""Review 11 (live, of inference without HE): failed Predicts left their queries open until the session refused every
query (a lockout), and one passive party could fill a query's pending-chunk slots so that another's honest share was
refused. Now the oldest open query lapses and the slots are counted per party; a passive party shares nothing while
its model trains again."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from tests.security.conftest import Federation, federation
from vflsec.services.crypto import ring_mask
from vflsec.services.engines import coordinator
from vflsec.v1 import coordinator_pb2, coordinator_pb2_grpc, passive_pb2, passive_pb2_grpc


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Federation, str, list[str]]]:
    with federation(tmp_path_factory.mktemp("queries"), dataset="breast_cancer", n_passive=2) as f:
        sid = f.operator.create_session("ckks", batch_size=64, seed=0).session_id
        common = sorted(f.operator.align(sid))
        list(f.operator.train(sid, common[:128], 1))
        yield f, sid, common


def _code(fn, *args) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        fn(*args)
    return err.value.code(), err.value.details()


def test_failed_predicts_never_lock_the_owner_out(fed, monkeypatch) -> None:
    f, sid, common = fed
    monkeypatch.setattr(coordinator, "MAX_OPEN_QUERIES", 3)
    c = coordinator_pb2_grpc.CoordinatorStub(f.channel("active", "coordinator"))
    index = f.parties["active"].engine.session(sid).index_of
    rows = [index[i] for i in common[200:205]]
    opened = [c.AdmitQuery(coordinator_pb2.AdmitQueryRequest(session_id=sid, sample_index=[r])) for r in rows[:4]]
    # Four admitted, none released (as Predicts that failed after admission leave them): the first lapsed.
    p = passive_pb2_grpc.PassiveStub(f.channel("active", "passive-1"))
    code, details = _code(p.ShareLogits, passive_pb2.ShareLogitsRequest(
        session_id=sid, query_id=opened[0].query_id, sample_index=[rows[0]]))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "no open query" in details
    assert len(f.parties["coordinator"].engine.session(sid).queries) == 3
    assert f.operator.predict(sid, common[205:207]).scores.shape == (2, 2)  # the owner still predicts


def test_one_passive_partys_chunks_never_take_anothers_slots(fed) -> None:
    f, sid, common = fed
    index = f.parties["active"].engine.session(sid).index_of
    rows = [index[i] for i in common[300:300 + coordinator.MAX_PENDING_CHUNKS + 2]]
    c = coordinator_pb2_grpc.CoordinatorStub(f.channel("active", "coordinator"))
    query = c.AdmitQuery(coordinator_pb2.AdmitQueryRequest(session_id=sid, sample_index=rows))
    flood = coordinator_pb2_grpc.CoordinatorStub(f.channel("passive-1", "coordinator"))
    for row in rows[: coordinator.MAX_PENDING_CHUNKS]:  # passive-1 fills its slots with row groups of its choosing
        flood.SubmitShare(coordinator_pb2.ShareRequest(
            session_id=sid, query_id=query.query_id, sample_index=[row], share=ring_mask.to_bytes(np.zeros((1, 1)))))
    code, details = _code(flood.SubmitShare, coordinator_pb2.ShareRequest(
        session_id=sid, query_id=query.query_id, sample_index=rows[-2:], share=bytes(16)))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "passive-1" in details
    # passive-2's honest share of the real chunk is still taken.
    honest = passive_pb2_grpc.PassiveStub(f.channel("active", "passive-2"))
    honest.ShareLogits(passive_pb2.ShareLogitsRequest(session_id=sid, query_id=query.query_id, sample_index=rows[-2:]))
    held = f.parties["coordinator"].engine.session(sid).queries[query.query_id].shares
    assert "passive-2" in held[tuple(rows[-2:])]


def test_no_share_while_training_again(fed) -> None:
    f, sid, common = fed
    again = f.operator.train(sid, common[:128], 1)
    next(again)  # the first step of another Train: the model is changing
    p = passive_pb2_grpc.PassiveStub(f.channel("active", "passive-1"))
    code, details = _code(p.ShareLogits, passive_pb2.ShareLogitsRequest(session_id=sid, query_id="q", sample_index=[0]))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "training again" in details
    assert list(again)[-1].done
