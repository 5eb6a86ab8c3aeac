"""The split-NN family's links (proto/vflsec/v1/splitnn.proto, and the gradient form of Passive.Backward): protobuf in
and out here, plain values to the family. Reached as ``CoordinatorClient.splitnn`` / ``PassiveClient.splitnn``,
beside the engine's own calls, as the tree family's links are (tree_links.py)."""

from __future__ import annotations

from collections.abc import Mapping

import grpc
import numpy as np

from vflsec.services.crypto import entropy, ring_mask
from vflsec.services.errors import FailedPrecondition
from vflsec.services.transport.server import DEFAULT_CALL_POLICY, CallPolicy, call
from vflsec.services.transport.tensors import from_tensor, to_tensor
from vflsec.v1 import common_pb2, passive_pb2, passive_pb2_grpc, splitnn_pb2, splitnn_pb2_grpc


class SplitNnCoordinatorClient:
    """The active party's call to the coordinator's SplitNnCoordinator service (coordinator-top)."""

    peer = "coordinator"

    def __init__(self, channel: grpc.Channel, policy: CallPolicy = DEFAULT_CALL_POLICY) -> None:
        self.stub = splitnn_pb2_grpc.SplitNnCoordinatorStub(channel)
        self.policy = policy

    def top_step(
        self,
        session_id: str,
        step: int,
        sample_index: np.ndarray,
        share: np.ndarray,
        labels: np.ndarray,
        widths: Mapping[str, int],
        epoch: int = 0,
    ) -> tuple[np.ndarray, float]:
        """∂L/∂h for the step's rows, given the owner's masked share and labels (a step of its Train call's
        ``epoch``), and the batch loss."""
        request = splitnn_pb2.TopStepRequest(
            session_id=session_id,
            step=step,
            sample_index=sample_index.tolist(),
            share=ring_mask.to_bytes(share),
            labels=to_tensor(np.asarray(labels, dtype=np.int64)),
            widths=dict(widths),
            epoch=epoch,
        )
        reply = call(self.peer, self.stub.TopStep, request, self.policy)
        gradient = from_tensor(reply.gradient, "∂L/∂h", shape=share.shape).copy()
        return gradient, reply.loss

    def submit_embedding(self, session_id: str, step: int, sample_index: np.ndarray, share: np.ndarray) -> None:
        """A passive party's masked embedding share of a training step, straight to the key holder."""
        request = splitnn_pb2.EmbeddingShare(
            session_id=session_id, step=step, sample_index=sample_index.tolist(), share=ring_mask.to_bytes(share)
        )
        call(self.peer, self.stub.SubmitEmbedding, request, self.policy)


class SplitNnPassiveClient:
    """Calls to a passive party's SplitNnPassive service (the active party's PlainForward, the coordinator's
    GetBottom) and the active party's ∂L/∂h through Passive.Backward."""

    def __init__(self, party_id: str, channel: grpc.Channel, policy: CallPolicy = DEFAULT_CALL_POLICY) -> None:
        self.peer = party_id
        self.stub = splitnn_pb2_grpc.SplitNnPassiveStub(channel)
        self.passive = passive_pb2_grpc.PassiveStub(channel)
        self.policy = policy

    def plain_forward(
        self, session_id: str, step: int, sample_index: np.ndarray, cols: int, epoch: int = 0
    ) -> np.ndarray:
        """active-top: the party's output z for the rows, in the clear (step 0: inference)."""
        request = passive_pb2.ForwardRequest(
            session_id=session_id, step=step, sample_index=sample_index.tolist(), epoch=epoch
        )
        reply = call(self.peer, self.stub.PlainForward, request, self.policy)
        return from_tensor(reply, f"output of {self.peer}", shape=(len(sample_index), cols)).copy()

    def send_embedding(self, session_id: str, step: int, sample_index: np.ndarray, epoch: int = 0) -> bytes:
        """coordinator-top: the party sends its masked embedding of the rows to the key holder; the nonce its mask is
        bound to comes back (nothing else)."""
        request = passive_pb2.ForwardRequest(
            session_id=session_id, step=step, sample_index=sample_index.tolist(), epoch=epoch
        )
        nonce = call(self.peer, self.stub.SendEmbedding, request, self.policy).nonce
        if len(nonce) != entropy.NONCE_BYTES:
            raise FailedPrecondition(f"{self.peer} sent a mask nonce of {len(nonce)} bytes, not {entropy.NONCE_BYTES}")
        return nonce

    def bottom(self, session_id: str) -> dict[str, np.ndarray]:
        """The party's bottom as named tensors, pulled by the coordinator after training."""
        reply = call(self.peer, self.stub.GetBottom, common_pb2.SessionRef(session_id=session_id), self.policy)
        return {name: from_tensor(t, f"{name} of {self.peer}").copy() for name, t in reply.tensors.items()}

    def backward_gradient(self, session_id: str, step: int, sample_index: np.ndarray, gradient: np.ndarray) -> None:
        """The step's ∂L/∂h (coordinator-top) or ∂L/∂z_p (active-top), in the clear."""
        request = passive_pb2.BackwardRequest(
            session_id=session_id, step=step, sample_index=sample_index.tolist(), gradient=to_tensor(gradient)
        )
        call(self.peer, self.passive.Backward, request, self.policy)
