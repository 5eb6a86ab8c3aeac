"""Finding 3: gradients revealed scores and labels.

Probe: the active party's gradient is δᵀ[X_a, 1] / n; with 8 rows and 10 features it solved for δ and got
p = δ + y to 1.1e-7. Now the coordinator refuses batches below 2 x the widest block (docs/protocol.md, "Batch
bound"), per session, from the widths the active party reports with the first step; the active party refuses
such a batch size at CreateSession, naming the smallest accepted value; the trainer merges a short last batch;
the default batch follows the bound.
"""

from __future__ import annotations

import tomllib

import grpc
import numpy as np
import pytest

from tests.integration.conftest import training_scores_request
from tests.security.conftest import federation
from vflsec.client.federation.launcher import FederationSpec, write_federation
from vflsec.services.config import ConfigError, dump_toml, load_config
from vflsec.services.data import datasets
from vflsec.services.models import lr
from vflsec.v1 import coordinator_pb2, coordinator_pb2_grpc, passive_pb2, passive_pb2_grpc


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
        with (
            fed.channel("active", "coordinator") as channel,
            fed.channel("passive-1", "coordinator") as p1,
            fed.channel("passive-2", "coordinator") as p2,
        ):
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            passives = [coordinator_pb2_grpc.CoordinatorStub(p1), coordinator_pb2_grpc.CoordinatorStub(p2)]

            def scores(rows: int, reported: dict[str, int]) -> None:
                # The owner's request is admitted (batch, widths) before any passive share is looked at.
                shared = passives if rows >= 22 and set(reported) == set(widths) else []
                stub.ComputeTrainingScores(
                    training_scores_request(shared, info.session_id, 1, list(range(rows)), reported)
                )

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
    with federation(
        tmp_path / "honest", dataset="breast_cancer", n_passive=2, passive_features=20, allow_plain=True
    ) as fed:
        info = fed.operator.create_session("plain", batch_size=22)
        common = sorted(fed.operator.align(info.session_id))
        train = common[:100]  # 100 = 4 x 22 + 12: the last 12 rows join the fourth batch
        progress = [p for p in fed.operator.train(info.session_id, train, 1) if not p.done]
        assert [p.n_batches for p in progress] == [4, 4, 4, 4]


def test_default_batch_follows_the_bound(tmp_path) -> None:
    # digits: 56 active features (+ bias) make the minimum batch 114, above the default 64.
    with federation(tmp_path, dataset="digits", n_passive=1, passive_features=8, allow_plain=True) as fed:
        info = fed.operator.create_session("plain", batch_size=0)
        widths = [info.n_active_features + 1, *info.passive_features.values()]
        assert lr.default_batch_size(widths) == lr.min_batch_size(widths) == 114
        common = sorted(fed.operator.align(info.session_id))
        progress = [p for p in fed.operator.train(info.session_id, common[:300], 1) if not p.done]
        assert progress[-1].n_batches == 300 // 114
    assert lr.batches(np.arange(10), 32)[0].size == 10  # fewer rows than a batch: one batch (then refused)


def _refused(call, request) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(request)
    return info.value.code(), info.value.details()


def test_repeated_rows_are_refused(tmp_path) -> None:
    # Finding 5 (review, 16:05): the bound counted rows, not distinct rows: one row repeated 2w times passed, and
    # the bias column's sum was then n·δ_i. Every party now takes each row of a batch or query once.
    with federation(tmp_path, dataset="breast_cancer", n_passive=1, passive_features=2) as fed:
        info = fed.operator.create_session("ckks", batch_size=64)
        sid = info.session_id
        fed.operator.align(sid)
        widths = {"active": info.n_active_features + 1, **info.passive_features}
        n = lr.min_batch_size(widths.values())
        with (
            fed.channel("active", "coordinator") as c_ch,
            fed.channel("active", "passive-1") as p_ch,
            fed.channel("passive-1", "coordinator") as s_ch,
        ):
            coordinator = coordinator_pb2_grpc.CoordinatorStub(c_ch)
            passive = passive_pb2_grpc.PassiveStub(p_ch)
            sharer = coordinator_pb2_grpc.CoordinatorStub(s_ch)

            def scores(index: list[int]) -> coordinator_pb2.EncryptedMatrix:
                shared = [sharer] if len(set(index)) == len(index) else []  # distinct rows are checked first
                return coordinator.ComputeTrainingScores(training_scores_request(shared, sid, 1, index, widths))

            repeated = [0] * n
            code, details = _refused(scores, repeated)
            assert code == grpc.StatusCode.INVALID_ARGUMENT and f"({n} entries, 1 distinct)" in details
            code, details = _refused(scores, [*range(n - 1), 0])  # one repeat is enough
            assert code == grpc.StatusCode.INVALID_ARGUMENT and f"{n - 1} distinct" in details

            # The passive party refuses them itself, for training and for inference.
            code, details = _refused(passive.ShareTrainingLogits, passive_pb2.ForwardRequest(
                session_id=sid, step=1, sample_index=repeated))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "repeats rows" in details
            code, details = _refused(sharer.SubmitTrainingShare, coordinator_pb2.TrainingShare(
                session_id=sid, step=1, sample_index=repeated, share=bytes(8 * n)))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "sample_index repeats a row" in details
            probs = scores(list(range(n)))  # an honest batch; the deviating Backward repeats its rows
            code, details = _refused(passive.Backward, passive_pb2.BackwardRequest(
                session_id=sid, step=1, sample_index=repeated, delta=probs))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "repeats rows" in details
            code, details = _refused(passive.ShareLogits, passive_pb2.ShareLogitsRequest(
                session_id=sid, query_id="q", sample_index=[n, n]))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "repeats rows" in details
            # A query repeating a row is refused whole at admission, before any budget is spent.
            code, details = _refused(coordinator.AdmitQuery, coordinator_pb2.AdmitQueryRequest(
                session_id=sid, sample_index=[n, n + 1, n]))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "(3 entries, 2 distinct)" in details


def test_block_widths_are_operator_approved(tmp_path) -> None:
    # Finding 3 (review, 16:05): widths were self-declared; a passive party declaring w = 32 kept the default
    # batch at 64 and, with one-hot "features", read δ (labels) for half of every batch. The coordinator's
    # [schema] (written by write_federation from the split it deals) now fixes every party's width.
    with federation(tmp_path, dataset="breast_cancer", n_passive=1, passive_features=2) as fed:
        schema = load_config(fed.layout.configs["coordinator"]).schema
        assert schema == {"active": 28, "passive-1": 2}
        info = fed.operator.create_session("ckks", batch_size=64)
        sid = info.session_id
        fed.operator.align(sid)
        with fed.channel("active", "coordinator") as channel, fed.channel("passive-1", "coordinator") as p_ch:
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            sharer = coordinator_pb2_grpc.CoordinatorStub(p_ch)

            def scores(widths: dict[str, int]) -> coordinator_pb2.EncryptedMatrix:
                return stub.ComputeTrainingScores(training_scores_request([sharer], sid, 1, list(range(64)), widths))

            for inflated, (party, declared, approved) in (
                ({"active": 29, "passive-1": 32}, ("passive-1", 32, 2)),
                ({"active": 32, "passive-1": 2}, ("active", 32, 29)),  # the owner's own columns + its bias
                ({"active": 29, "passive-1": 1}, ("passive-1", 1, 2)),
            ):
                code, details = _refused(scores, inflated)
                assert code == grpc.StatusCode.FAILED_PRECONDITION
                assert f"{party} declared block width {declared}; the operator-approved schema gives {approved}" in (
                    details
                )
            scores({"active": 29, "passive-1": 2})  # the approved widths pass

    # Without a schema the widths would be self-declared: such a coordinator refuses to start.
    layout = write_federation(
        FederationSpec(datasets.load_dataset("breast_cancer"), n_passive=1, passive_features=2), tmp_path / "open"
    )
    raw = tomllib.loads(layout.configs["coordinator"].read_text())
    del raw["schema"]
    layout.configs["coordinator"].write_text(dump_toml(raw))
    with pytest.raises(ConfigError, match=r"a coordinator needs a \[schema\] table .* never self-declared"):
        load_config(layout.configs["coordinator"])
    # The other roles need none, and every config writer gives the coordinator one.
    assert load_config(layout.configs["passive-1"]).schema is None
