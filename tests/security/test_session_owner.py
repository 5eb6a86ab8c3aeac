"""Probe (finding 4): a second active identity from the same CA, ``active-2``, calls every active-only RPC on
another party's session, at the coordinator and at the passive party. Every call is PERMISSION_DENIED and the
owner's session is unchanged (budget not spent, keys and checkpoints not deleted). Also: a passive party
answers ForecastRisk only to its own operator (and the coordinator), not to the active party's operator."""

from __future__ import annotations

import grpc
import numpy as np

from tests.security.conftest import federation
from vflsec.services.transport import tls
from vflsec.services.transport.server import peer_channel
from vflsec.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc, passive_pb2, passive_pb2_grpc

TAG = bytes(range(32))  # the caller's mask_tag (entropy.tag of its masks' context)

SID = "owned"
TIMEOUT = 30.0


def _code(fn, request) -> tuple[grpc.StatusCode, str]:
    try:
        fn(request, timeout=TIMEOUT)
    except grpc.RpcError as exc:
        return exc.code(), exc.details()
    return grpc.StatusCode.OK, ""


def test_foreign_active_identity_is_refused_everywhere(tmp_path) -> None:
    with federation(tmp_path, dataset="breast_cancer", n_passive=1, query_policy={"query_budget": 50}) as fed:
        op = fed.operator
        op.create_session("ckks", session_id=SID, batch_size=64)
        common = sorted(op.align(SID))
        list(op.train(SID, common[:128], 1))
        coordinator = fed.parties["coordinator"].engine
        passive = fed.parties["passive-1"].engine
        state = fed.layout.workdir / "coordinator" / "state"
        keys = {state / "epochs" / f"{SID}.e{e}.bin" for e in coordinator.sessions[SID].epochs}
        assert keys and all(k.exists() for k in keys)

        # The intruder: a valid certificate of the federation's CA with role active, another party id.
        intruder = tls.make_pki(fed.layout.workdir / "certs", ["active-2"]).files("active-2")
        channels = {
            target: peer_channel(fed.layout.addresses[target], target, intruder, 64 << 20)
            for target in ("coordinator", "passive-1")
        }
        c = coordinator_pb2_grpc.CoordinatorStub(channels["coordinator"])
        p = passive_pb2_grpc.PassiveStub(channels["passive-1"])
        ref = common_pb2.SessionRef(session_id=SID)
        index = list(range(128, 138))
        matrix = common_pb2.EncryptedMatrix(rows=10, cols=1, replicas=1, rows_per_ciphertext=10, ciphertexts=[b"x"])
        probes = {
            "Coordinator/GetPublicContext": (c.GetPublicContext, ref),
            "Coordinator/GetTrainingContext": (
                c.GetTrainingContext,
                coordinator_pb2.TrainingContextRequest(session_id=SID, step=2),
            ),
            "Coordinator/ComputeTrainingScores": (
                c.ComputeTrainingScores,
                coordinator_pb2.TrainingScoresRequest(session_id=SID, step=99, share=bytes(80), sample_index=index),
            ),
            "Coordinator/SubmitTrainingShare": (  # a passive party's RPC: denied to the active role whoever it is
                c.SubmitTrainingShare,
                coordinator_pb2.TrainingShare(session_id=SID, step=3, share=bytes(80), sample_index=index),
            ),
            "Coordinator/DecryptBlockSums": (
                c.DecryptBlockSums,
                coordinator_pb2.BlockSumsRequest(mask_tag=TAG, session_id=SID, step=1, ciphertexts=[b"x"]),
            ),
            "Coordinator/FinishTraining": (c.FinishTraining, ref),
            "Coordinator/AdmitQuery": (
                c.AdmitQuery,
                coordinator_pb2.AdmitQueryRequest(session_id=SID, sample_index=index),
            ),
            "Coordinator/ReleaseScores": (
                c.ReleaseScores,
                coordinator_pb2.ReleaseScoresRequest(session_id=SID, query_id="q", share=bytes(8), sample_index=index),
            ),
            "Coordinator/AdmitQueries": (
                c.AdmitQueries,
                coordinator_pb2.AdmitQueriesRequest(session_id=SID, queries=[common_pb2.QueryRows(sample_index=index)]),
            ),
            "Coordinator/ReleaseScoresBatch": (
                c.ReleaseScoresBatch,
                coordinator_pb2.ReleaseBatchRequest(
                    session_id=SID, queries=[common_pb2.QueryShare(query_id="q", share=bytes(8), sample_index=index)]
                ),
            ),
            "Coordinator/ReleaseModel": (c.ReleaseModel, ref),
            "Coordinator/CloseSession": (c.CloseSession, ref),
            "Passive/JoinSession": (
                p.JoinSession,
                passive_pb2.JoinSessionRequest(session_id=SID, backend=common_pb2.BACKEND_CKKS, n_classes=2),
            ),
            "Passive/PsiExchange": (
                p.PsiExchange,
                passive_pb2.PsiExchangeRequest(session_id=SID, salt=b"s" * 16, blinded=[b"p" * 32]),
            ),
            "Passive/PsiExchangeStream": (
                lambda request, timeout: list(p.PsiExchangeStream(iter([request]), timeout=timeout)),
                passive_pb2.PsiExchangeChunk(session_id=SID, salt=b"s" * 16),
            ),
            "Passive/PsiOprfStream": (
                lambda request, timeout: list(p.PsiOprfStream(iter([request]), timeout=timeout)),
                passive_pb2.PsiOprfRequest(hello=passive_pb2.PsiOprfHello(session_id=SID, salt=b"s" * 16, bins=128)),
            ),
            "Passive/PsiFinish": (p.PsiFinish, passive_pb2.PsiFinishRequest(session_id=SID, positions=[0])),
            "Passive/Forward": (p.Forward, passive_pb2.ForwardRequest(session_id=SID, step=1, sample_index=index)),
            "Passive/ShareTrainingLogits": (
                p.ShareTrainingLogits,
                passive_pb2.ForwardRequest(session_id=SID, step=3, sample_index=index),
            ),
            "Passive/ShareLogits": (
                p.ShareLogits,
                passive_pb2.ShareLogitsRequest(session_id=SID, query_id="q", sample_index=index),
            ),
            "Passive/ShareLogitsBatch": (
                p.ShareLogitsBatch,
                passive_pb2.ShareLogitsBatchRequest(
                    session_id=SID, queries=[common_pb2.QueryRows(query_id="q", sample_index=index)]
                ),
            ),
            "Passive/Backward": (
                p.Backward,
                passive_pb2.BackwardRequest(session_id=SID, step=1, sample_index=index, delta=matrix),
            ),
            "Passive/CloseSession": (p.CloseSession, ref),
        }
        weights_before = passive.weights(SID)
        outcome = {name: _code(fn, request) for name, (fn, request) in probes.items()}
        for channel in channels.values():
            channel.close()

        for name, (code, details) in outcome.items():
            assert code == grpc.StatusCode.PERMISSION_DENIED, (name, code, details)
            assert "active-2" in details, (name, details)
        # The owner's session is untouched: nothing admitted or spent, keys and checkpoints in place.
        assert coordinator.scored.get("active", 0) == 0 and coordinator.scored.get("active-2", 0) == 0
        assert SID in coordinator.sessions and SID in passive.sessions
        keys = {state / "epochs" / f"{SID}.e{e}.bin" for e in coordinator.sessions[SID].epochs}
        assert keys and all(k.exists() for k in keys)
        np.testing.assert_array_equal(passive.weights(SID), weights_before)
        released = op.predict(SID, common[128:178])  # the owner's whole budget is still there
        assert released.scores.shape == (50, 2)
        assert coordinator.scored["active"] == 50
        assert op.fetch_model(SID).passive["passive-1"] is not None

        # ForecastRisk: passive-1's own operator and the coordinator; not the active party's operator.
        forecast = {}
        for caller in ("operator-passive-1", "coordinator", "operator", "active"):
            with fed.channel(caller, "passive-1") as channel:
                request = passive_pb2.DiscloseRequest(session_id=SID, steps=[])
                forecast[caller] = _code(passive_pb2_grpc.PassiveStub(channel).ForecastRisk, request)[0]
    assert forecast == {
        "operator-passive-1": grpc.StatusCode.OK,
        "coordinator": grpc.StatusCode.OK,
        "operator": grpc.StatusCode.PERMISSION_DENIED,
        "active": grpc.StatusCode.PERMISSION_DENIED,
    }
