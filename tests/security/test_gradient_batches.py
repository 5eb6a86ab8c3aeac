"""Finding 3: gradients revealed scores and labels.

Probe: the active party's gradient is δᵀ[X_a, 1] / n; with 8 rows and 10 features it solved for δ and got
p = δ + y to 1.1e-7. Now the coordinator refuses batches below 2 x the widest block (docs/protocol.md, "Batch
bound"), per session, from the widths the active party reports with the first step; the active party refuses
such a batch size at CreateSession, naming the smallest accepted value; the trainer merges a short last batch;
the default batch follows the bound.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from tests.security.conftest import federation
from vflsec.services import he, lr, wire
from vflsec.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc


def test_small_batches_are_refused_and_short_batches_merged(tmp_path) -> None:
    with federation(tmp_path, dataset="breast_cancer", n_passive=2, passive_features=20) as fed:
        # The probe's shape: 10 active features (+ bias: width 11, the widest block), so the minimum batch is 22.
        with pytest.raises(grpc.RpcError) as refused:
            fed.operator.create_session("ckks", batch_size=8)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "minimum batch 22" in refused.value.details()
        assert "smallest accepted value is 22" in refused.value.details()

        info = fed.operator.create_session("ckks", batch_size=22)
        assert info.n_active_features == 10
        common = sorted(fed.operator.align(info.session_id))
        widths = {"active": 11, **info.passive_features}
        assert widths == {"active": 11, "passive-1": 10, "passive-2": 10}

        # A deviating active party that skips its own check: the coordinator refuses 8 rows itself.
        with fed.channel("active", "coordinator") as channel:
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            public = stub.GetPublicContext(common_pb2.SessionRef(session_id=info.session_id))
            backend = he.open_public("ckks", public.data)

            def scores(rows: int, reported: dict[str, int]) -> None:
                logits = wire.to_message(backend, he.encrypt_matrix(backend, np.zeros((rows, 1))))
                stub.ComputeTrainingScores(coordinator_pb2.TrainingScoresRequest(
                    session_id=info.session_id, step=1, logits=logits, replicas=1,
                    sample_index=list(range(rows)), widths=reported))

            tiny = {party: 1 for party in widths}
            for rows, reported in ((8, widths), (21, widths)):
                with pytest.raises(grpc.RpcError) as refused:
                    scores(rows, reported)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "below the minimum batch" in refused.value.details()
            # The widths must cover every party of the session...
            with pytest.raises(grpc.RpcError) as refused:
                scores(22, {"active": 11})
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            # ...and once the first step fixed them, they cannot shrink to lower the bound. (Under-reporting
            # at the first step buys nothing: each party then gets only as many sums as the width reported
            # for it, and an honest party that declares its real width is refused.)
            scores(22, widths)
            with pytest.raises(grpc.RpcError) as refused:
                scores(22, tiny)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION

    # An honest session with the smallest accepted batch trains; the short last batch is merged, not sent.
    with federation(tmp_path / "honest", dataset="breast_cancer", n_passive=2, passive_features=20) as fed:
        info = fed.operator.create_session("plain", batch_size=22)
        common = sorted(fed.operator.align(info.session_id))
        train = common[:100]  # 100 = 4 x 22 + 12: the last 12 rows join the fourth batch
        progress = [p for p in fed.operator.train(info.session_id, train, 1) if not p.done]
        assert [p.n_batches for p in progress] == [4, 4, 4, 4]


def test_default_batch_follows_the_bound(tmp_path) -> None:
    # digits: 56 active features (+ bias) make the minimum batch 114, above the default 64.
    with federation(tmp_path, dataset="digits", n_passive=1, passive_features=8) as fed:
        info = fed.operator.create_session("plain", batch_size=0)
        widths = [info.n_active_features + 1, *info.passive_features.values()]
        assert lr.default_batch_size(widths) == lr.min_batch_size(widths) == 114
        common = sorted(fed.operator.align(info.session_id))
        progress = [p for p in fed.operator.train(info.session_id, common[:300], 1) if not p.done]
        assert progress[-1].n_batches == 300 // 114
    assert lr.batches(np.arange(10), 32)[0].size == 10  # fewer rows than a batch: one batch (then refused)
