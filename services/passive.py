"""Passive party: feature columns only. Plain-Python engine + thin gRPC servicer."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Protocol

import grpc
import numpy as np

from vflsec.services import he, lr, psi, wire
from vflsec.services.datasets import PartyData
from vflsec.services.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from vflsec.services.server import rpc
from vflsec.services.tensors import to_tensor
from vflsec.v1 import common_pb2, passive_pb2, passive_pb2_grpc


class CoordinatorLink(Protocol):
    """What a passive party needs from the coordinator."""

    def public_context(self, session_id: str) -> tuple[str, bytes]: ...

    def block_sums(self, session_id: str, step: int, ciphertexts: list[bytes]) -> np.ndarray: ...


@dataclass
class PassiveSession:
    backend: he.Backend
    n_classes: int
    weights: np.ndarray  # (K_logits, d_p), the true block: never leaves but to the coordinator
    optimizer: lr.BlockOptimizer
    mask_rng: np.random.Generator  # OS entropy: masks must be unpredictable to the coordinator
    psi_permutation: np.ndarray | None = None  # order in which our blinded IDs were sent
    rows: np.ndarray | None = None  # common index -> our row, after PSI
    last_forward: tuple[int, np.ndarray] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class PassiveParty:
    def __init__(self, party_id: str, data: PartyData, coordinator: CoordinatorLink) -> None:
        self.party_id = party_id
        self.data = data
        self.coordinator = coordinator
        self.sessions: dict[str, PassiveSession] = {}
        self._lock = threading.Lock()

    @property
    def n_features(self) -> int:
        return self.data.X.shape[1]

    def session(self, session_id: str) -> PassiveSession:
        try:
            return self.sessions[session_id]
        except KeyError:
            raise NotFound(f"unknown session {session_id!r}") from None

    def join(self, session_id: str, backend_name: str, n_classes: int, config: lr.OptimizerConfig, seed: int) -> int:
        if not session_id:
            raise InvalidArgument("session_id is empty")
        k = lr.n_logits(n_classes)
        context_backend, context = self.coordinator.public_context(session_id)
        if context_backend != backend_name:
            raise FailedPrecondition(
                f"coordinator runs session {session_id!r} on {context_backend}, not {backend_name}"
            )
        backend = he.open_public(backend_name, context)
        with self._lock:
            if session_id in self.sessions:
                raise AlreadyExists(f"session {session_id!r} already joined")
            self.sessions[session_id] = PassiveSession(
                backend=backend,
                n_classes=n_classes,
                weights=np.zeros((k, self.n_features)),
                optimizer=lr.BlockOptimizer(config, (k, self.n_features)),
                mask_rng=np.random.default_rng(),
            )
        return self.n_features

    # --- PSI (see services/psi.py) ---
    def psi_exchange(self, session_id: str, salt: bytes, blinded: list[bytes]) -> tuple[list[bytes], list[bytes]]:
        s = self.session(session_id)
        key = psi.PsiKey()
        try:
            reply = psi.passive_reply(key, [str(i) for i in self.data.ids], blinded, salt)
        except ValueError as exc:
            raise InvalidArgument(f"blinded IDs: {exc}") from exc
        s.psi_permutation, s.rows = reply.permutation, None
        return reply.reblinded_active, reply.blinded_own

    def psi_finish(self, session_id: str, positions: np.ndarray) -> int:
        s = self.session(session_id)
        if s.psi_permutation is None:
            raise FailedPrecondition("PsiFinish before PsiExchange")
        try:
            s.rows = psi.rows_from_positions(positions, s.psi_permutation)
        except ValueError as exc:
            raise InvalidArgument(f"positions: {exc}") from exc
        return len(s.rows)

    def _features(self, s: PassiveSession, sample_index: np.ndarray) -> np.ndarray:
        if s.rows is None:
            raise FailedPrecondition("samples are not aligned yet: run PSI first")
        if sample_index.size == 0:
            raise InvalidArgument("sample_index is empty")
        bad = (sample_index < 0) | (sample_index >= len(s.rows))
        if bad.any():
            raise NotFound(f"unknown sample index {int(sample_index[bad][0])} (aligned samples: {len(s.rows)})")
        return self.data.X[s.rows[sample_index]]

    # --- training and inference ---
    def forward(self, session_id: str, step: int, sample_index: np.ndarray) -> he.EncryptedMatrix:
        s = self.session(session_id)
        x = self._features(s, sample_index)
        with s.lock:
            if step >= 0:
                if s.last_forward is not None and step <= s.last_forward[0]:
                    raise FailedPrecondition(f"step {step} is not after step {s.last_forward[0]}")
                s.last_forward = (step, sample_index.copy())
            z = x @ s.weights.T
        return he.encrypt_matrix(s.backend, z)

    def backward(self, session_id: str, step: int, sample_index: np.ndarray, delta: he.EncryptedMatrix) -> None:
        s = self.session(session_id)
        with s.lock:
            if s.last_forward is None or s.last_forward[0] != step:
                raise FailedPrecondition(f"Backward for step {step} does not follow its Forward")
            if not np.array_equal(s.last_forward[1], sample_index):
                raise InvalidArgument(f"step {step}: sample_index differs from the Forward of that step")
            x = self._features(s, sample_index)
            if delta.shape != (len(sample_index), s.weights.shape[0]):
                raise InvalidArgument(
                    f"delta has shape {delta.shape}, expected {(len(sample_index), s.weights.shape[0])}"
                )
            cts, mask_sums = he.masked_feature_products(s.backend, delta, x, s.mask_rng)
            sums = self.coordinator.block_sums(session_id, step, [s.backend.serialize(c) for c in cts])
            if sums.shape != mask_sums.shape:
                raise FailedPrecondition(
                    f"coordinator returned block sums of shape {sums.shape}, expected {mask_sums.shape}"
                )
            grad = he.gradient_from_block_sums(sums, mask_sums, x.shape[1]) / len(sample_index)
            s.weights = s.optimizer.step(s.weights, grad)
            s.last_forward = (step, np.empty(0, dtype=np.int64))  # a step's backward runs once

    def weights(self, session_id: str) -> np.ndarray:
        return self.session(session_id).weights.copy()

    def close(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)


class PassiveServicer(passive_pb2_grpc.PassiveServicer):
    def __init__(self, party: PassiveParty) -> None:
        self.party = party

    @rpc
    def JoinSession(self, request: passive_pb2.JoinSessionRequest, context: grpc.ServicerContext):
        t = request.training
        config = lr.OptimizerConfig(t.optimizer or "adam", t.learning_rate or 0.05, t.l2)
        n = self.party.join(request.session_id, wire.backend_name(request.backend), request.n_classes, config, t.seed)
        return passive_pb2.JoinSessionReply(n_features=n, n_rows=len(self.party.data.ids))

    @rpc
    def PsiExchange(self, request: passive_pb2.PsiExchangeRequest, context: grpc.ServicerContext):
        double, own = self.party.psi_exchange(request.session_id, request.salt, list(request.blinded))
        return passive_pb2.PsiExchangeReply(double_blinded=double, own_blinded=own)

    @rpc
    def PsiFinish(self, request: passive_pb2.PsiFinishRequest, context: grpc.ServicerContext):
        n = self.party.psi_finish(request.session_id, np.asarray(request.positions, dtype=np.int64))
        return passive_pb2.PsiFinishReply(n_common=n)

    @rpc
    def Forward(self, request: passive_pb2.ForwardRequest, context: grpc.ServicerContext):
        s = self.party.session(request.session_id)
        z = self.party.forward(request.session_id, request.step, np.asarray(request.sample_index, dtype=np.int64))
        return wire.to_message(s.backend, z)

    @rpc
    def Backward(self, request: passive_pb2.BackwardRequest, context: grpc.ServicerContext):
        s = self.party.session(request.session_id)
        delta = wire.from_message(s.backend, request.delta, "delta")
        self.party.backward(request.session_id, request.step, np.asarray(request.sample_index, dtype=np.int64), delta)
        return common_pb2.Empty()

    @rpc
    def GetWeights(self, request: common_pb2.SessionRef, context: grpc.ServicerContext):
        return to_tensor(self.party.weights(request.session_id))

    @rpc
    def CloseSession(self, request: common_pb2.SessionRef, context: grpc.ServicerContext):
        self.party.close(request.session_id)
        return common_pb2.Empty()


ROLE_POLICY: dict[str, frozenset[str]] = {
    "JoinSession": frozenset({"active"}),
    "PsiExchange": frozenset({"active"}),
    "PsiFinish": frozenset({"active"}),
    "Forward": frozenset({"active"}),
    "Backward": frozenset({"active"}),
    "GetWeights": frozenset({"coordinator"}),
    "CloseSession": frozenset({"active"}),
}
