"""The coordinator's service (proto/vflsec/v1/coordinator.proto): the parties' calls on :class:`Coordinator`."""

from __future__ import annotations

import grpc
import numpy as np

from vflsec.services.defenses.release import ReleasedScores
from vflsec.services.engines.coordinator import Coordinator
from vflsec.services.engines.coordinator_state import CoordinatorSession
from vflsec.services.errors import InvalidArgument, ServiceError
from vflsec.services.transport import wire
from vflsec.services.transport.server import rpc
from vflsec.services.transport.tensors import to_tensor
from vflsec.services.transport.tls import current_caller
from vflsec.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc


class CoordinatorServicer(coordinator_pb2_grpc.CoordinatorServicer):
    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator

    @rpc
    def OpenSession(self, request: coordinator_pb2.OpenSessionRequest, context: grpc.ServicerContext):
        c = self.coordinator
        family, values = wire.model_settings(request.model, request.training)
        public = c.open_session(
            request.session_id,
            wire.backend_name(request.backend),
            request.n_classes,
            list(request.passive_parties),
            owner=current_caller().party_id,
            family_name=family,
            values=values,
        )
        return coordinator_pb2.OpenSessionReply(
            public_context=public,
            score_release=wire.steps_message(c.score_chain.describe()),
            param_release=wire.steps_message(c.param_chain.describe()),
        )

    def _owner(self, session_id: str) -> CoordinatorSession:
        """Active-only RPCs: the caller must be the active party that opened the session."""
        return self.coordinator.owned(session_id, current_caller().party_id)

    @rpc
    def GetPublicContext(self, request: common_pb2.SessionRef, context: grpc.ServicerContext):
        s = self.coordinator.member(request.session_id, current_caller().party_id)
        return coordinator_pb2.PublicContext(
            backend=wire.BACKEND_ENUM[s.backend.name],
            data=s.public_context,
            n_classes=s.n_classes,
            owner=s.owner,
        )

    @rpc
    def GetTrainingContext(self, request: coordinator_pb2.TrainingContextRequest, context: grpc.ServicerContext):
        epoch, rotation, data = self.coordinator.training_context(
            request.session_id, current_caller().party_id, request.step
        )
        return coordinator_pb2.TrainingContext(epoch=epoch, rotation=rotation, data=data)

    @rpc
    def ComputeTrainingScores(self, request: coordinator_pb2.TrainingScoresRequest, context: grpc.ServicerContext):
        self._owner(request.session_id)
        if request.HasField("logits"):
            raise InvalidArgument(
                "logits: a ciphertext [[z]] is no longer taken (the forward travels as masked shares in Z_2^64); "
                "send share: z_a minus every passive party's training mask"
            )
        probs = self.coordinator.training_scores(
            request.session_id,
            request.step,
            request.share,
            request.replicas,
            np.asarray(request.sample_index, np.int64),
            dict(request.widths),
        )
        return wire.message_of(probs)

    @rpc
    def SubmitTrainingShare(self, request: coordinator_pb2.TrainingShare, context: grpc.ServicerContext):
        self.coordinator.family_call(
            request.session_id,
            current_caller().party_id,
            "submit_training_share",
            step=request.step,
            sample_index=np.asarray(request.sample_index, np.int64),
            share=request.share,
        )
        return common_pb2.Empty()

    @rpc
    def DecryptBlockSums(self, request: coordinator_pb2.BlockSumsRequest, context: grpc.ServicerContext):
        sums = self.coordinator.block_sums(
            request.session_id,
            request.step,
            current_caller().party_id,
            list(request.ciphertexts),
            request.width,
            request.mask_tag,
        )
        return to_tensor(sums)

    @rpc
    def FinishTraining(self, request: common_pb2.SessionRef, context: grpc.ServicerContext):
        self._owner(request.session_id)
        self.coordinator.finish_training(request.session_id)
        return common_pb2.Empty()

    @rpc
    def AdmitQuery(self, request: coordinator_pb2.AdmitQueryRequest, context: grpc.ServicerContext):
        self._owner(request.session_id)
        query_id, scored = self.coordinator.admit_query(request.session_id, np.asarray(request.sample_index, np.int64))
        return coordinator_pb2.AdmitQueryReply(query_id=query_id, scored=scored, budget=self.coordinator.policy.budget)

    @rpc
    def SubmitShare(self, request: coordinator_pb2.ShareRequest, context: grpc.ServicerContext):
        caller = current_caller().party_id
        self.coordinator.member(request.session_id, caller)
        self.coordinator.submit_share(
            request.session_id, request.query_id, caller, np.asarray(request.sample_index, np.int64), request.share
        )
        return common_pb2.Empty()

    @rpc
    def ReleaseScores(self, request: coordinator_pb2.ReleaseScoresRequest, context: grpc.ServicerContext):
        self._owner(request.session_id)
        released = self.coordinator.release_scores(
            request.session_id, request.query_id, request.share, np.asarray(request.sample_index, np.int64)
        )
        return _released_message(released)

    @rpc
    def AdmitQueries(self, request: coordinator_pb2.AdmitQueriesRequest, context: grpc.ServicerContext):
        self._owner(request.session_id)
        outcomes = self.coordinator.admit_queries(
            request.session_id, [np.asarray(q.sample_index, np.int64) for q in request.queries]
        )
        budget = self.coordinator.policy.budget
        return coordinator_pb2.AdmitQueriesReply(
            queries=[
                coordinator_pb2.AdmittedQuery(status=wire.entry_status(outcome))
                if isinstance(outcome, ServiceError)
                else coordinator_pb2.AdmittedQuery(
                    admitted=coordinator_pb2.AdmitQueryReply(query_id=outcome[0], scored=outcome[1], budget=budget)
                )
                for outcome in outcomes
            ]
        )

    @rpc
    def SubmitShares(self, request: coordinator_pb2.SharesRequest, context: grpc.ServicerContext):
        caller = current_caller().party_id
        self.coordinator.member(request.session_id, caller)
        outcomes = self.coordinator.submit_shares(
            request.session_id,
            caller,
            [(e.query_id, np.asarray(e.sample_index, np.int64), e.share) for e in request.shares],
        )
        return common_pb2.EntryStatuses(status=[wire.entry_status(error) for error in outcomes])

    @rpc
    def ReleaseScoresBatch(self, request: coordinator_pb2.ReleaseBatchRequest, context: grpc.ServicerContext):
        self._owner(request.session_id)
        outcomes = self.coordinator.release_batch(
            request.session_id,
            [(e.query_id, np.asarray(e.sample_index, np.int64), e.share) for e in request.queries],
        )
        return coordinator_pb2.ReleaseBatchReply(
            released=[
                coordinator_pb2.ReleasedEntry(status=wire.entry_status(outcome))
                if isinstance(outcome, ServiceError)
                else coordinator_pb2.ReleasedEntry(scores=_released_message(outcome))
                for outcome in outcomes
            ]
        )

    @rpc
    def ReleaseModel(self, request: common_pb2.SessionRef, context: grpc.ServicerContext):
        self._owner(request.session_id)
        return wire.released_model_message(self.coordinator.release_model(request.session_id))

    @rpc
    def CloseSession(self, request: common_pb2.SessionRef, context: grpc.ServicerContext):
        self.coordinator.owned(request.session_id, current_caller().party_id, closing=True)
        self.coordinator.close(request.session_id)
        return common_pb2.Empty()


def _released_message(released: ReleasedScores) -> coordinator_pb2.ReleasedScores:
    return coordinator_pb2.ReleasedScores(
        scores=to_tensor(released.scores),
        chain=wire.steps_message(released.chain),
        argmax_changed=released.argmax_changed,
    )


# RPC -> the LR family step it runs (ModelFamily.steps; tests/unit/test_authz.py keeps the two equal)
LR_STEPS = {"SubmitTrainingShare": "submit_training_share"}
ROLE_POLICY: dict[str, frozenset[str]] = {
    "OpenSession": frozenset({"active"}),
    "GetPublicContext": frozenset({"active", "passive"}),
    "GetTrainingContext": frozenset({"active", "passive"}),
    "ComputeTrainingScores": frozenset({"active"}),
    "SubmitTrainingShare": frozenset({"passive"}),
    "DecryptBlockSums": frozenset({"active", "passive"}),
    "FinishTraining": frozenset({"active"}),
    "AdmitQuery": frozenset({"active"}),
    "SubmitShare": frozenset({"passive"}),
    "ReleaseScores": frozenset({"active"}),
    "AdmitQueries": frozenset({"active"}),
    "SubmitShares": frozenset({"passive"}),
    "ReleaseScoresBatch": frozenset({"active"}),
    "ReleaseModel": frozenset({"active"}),
    "CloseSession": frozenset({"active"}),
}
