"""Thin servicers of the split-NN family's own services (proto/vflsec/v1/splitnn.proto): the coordinator-top
key holder's TopStep and SubmitEmbedding, a passive party's SendEmbedding (coordinator-top), PlainForward
(active-top) and GetBottom, each handing plain values to its engine."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc
import numpy as np

from vflsec.services.common import ACTIVE, COORDINATOR, PASSIVE
from vflsec.services.engines.coordinator import Coordinator
from vflsec.services.transport.server import rpc
from vflsec.services.transport.tensors import from_tensor, to_tensor
from vflsec.services.transport.tls import current_caller
from vflsec.v1 import common_pb2, passive_pb2, splitnn_pb2, splitnn_pb2_grpc

if TYPE_CHECKING:  # a coordinator process never imports the passive engine (nor torch through its defenses)
    from vflsec.services.engines.passive import PassiveParty

FAMILY = "splitnn"


class SplitNnCoordinatorServicer(splitnn_pb2_grpc.SplitNnCoordinatorServicer):
    """The split-NN family's own RPC at the key holder (proto/vflsec/v1/splitnn.proto)."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator

    @rpc
    def TopStep(self, request: splitnn_pb2.TopStepRequest, context: grpc.ServicerContext):
        index = np.asarray(request.sample_index, np.int64)
        labels = from_tensor(request.labels, "labels", shape=(len(index),))  # the family checks they are classes
        gradient, loss = self.coordinator.family_call(
            request.session_id,
            current_caller().party_id,
            "top_step",
            step=request.step,
            share=request.share,
            labels=labels,
            sample_index=index,
            widths=dict(request.widths),
            epoch=request.epoch,
        )
        return splitnn_pb2.TopStepReply(gradient=to_tensor(gradient), loss=loss)

    @rpc
    def SubmitEmbedding(self, request: splitnn_pb2.EmbeddingShare, context: grpc.ServicerContext):
        self.coordinator.family_call(
            request.session_id,
            current_caller().party_id,
            "submit_embedding",
            step=request.step,
            sample_index=np.asarray(request.sample_index, np.int64),
            share=request.share,
        )
        return common_pb2.Empty()


# RPC -> the family step it runs. The policy is the family's declaration of its callers (ModelFamily.steps), written
# out so that a party starts without loading the family (torch); tests/unit/test_authz.py keeps the two equal.
COORDINATOR_STEPS = {"TopStep": "top_step", "SubmitEmbedding": "submit_embedding"}
COORDINATOR_POLICY: dict[str, frozenset[str]] = {
    "TopStep": frozenset({ACTIVE}),
    "SubmitEmbedding": frozenset({PASSIVE}),
}


class SplitNnPassiveServicer(splitnn_pb2_grpc.SplitNnPassiveServicer):
    """The split-NN family's own RPC at a passive party (proto/vflsec/v1/splitnn.proto)."""

    def __init__(self, party: PassiveParty) -> None:
        self.party = party

    @rpc
    def PlainForward(self, request: passive_pb2.ForwardRequest, context: grpc.ServicerContext):
        index = np.asarray(request.sample_index, dtype=np.int64)
        z = self.party.family_call(
            request.session_id, current_caller().party_id, "plain_forward",
            step=request.step,
            sample_index=index,
            epoch=request.epoch,
        )
        return to_tensor(z)

    @rpc
    def SendEmbedding(self, request: passive_pb2.ForwardRequest, context: grpc.ServicerContext):
        nonce = self.party.family_call(
            request.session_id, current_caller().party_id, "send_embedding",
            step=request.step,
            sample_index=np.asarray(request.sample_index, dtype=np.int64),
            epoch=request.epoch,
        )
        return splitnn_pb2.EmbeddingSent(nonce=nonce)

    @rpc
    def GetBottom(self, request: common_pb2.SessionRef, context: grpc.ServicerContext):
        self.party.check_coordinator(current_caller().party_id)
        tensors = self.party.releasable(request.session_id)
        return splitnn_pb2.NamedTensors(tensors={name: to_tensor(t) for name, t in tensors.items()})


PASSIVE_STEPS = {"PlainForward": "plain_forward", "SendEmbedding": "send_embedding"}
PASSIVE_POLICY: dict[str, frozenset[str]] = {
    "PlainForward": frozenset({ACTIVE}),
    "SendEmbedding": frozenset({ACTIVE}),
    "GetBottom": frozenset({COORDINATOR}),  # the engine's pull of named tensors after training, no family step
}
