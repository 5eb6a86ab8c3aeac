"""Coordinator: holds the CKKS secret key, decrypts only aggregates, and is the single release point.

Plain-Python engine (:class:`Coordinator`) + thin gRPC servicer (:class:`CoordinatorServicer`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc
import numpy as np

from vflsec.services import he, lr, wire
from vflsec.services.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from vflsec.services.release import ParamReleaseChain, ReleaseContext, ScoreReleaseChain
from vflsec.services.server import rpc
from vflsec.services.tensors import to_tensor
from vflsec.services.tls import current_caller
from vflsec.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc

# Fetches a passive party's true weight block (K_logits x d_p) for a session.
WeightsFetcher = Callable[[str, str], np.ndarray]


@dataclass
class TrainingStep:
    """The [[p]] layout the coordinator issued for one step; block-sum requests must use exactly it."""

    step: int
    layout: he.MatrixLayout
    served: set[str] = field(default_factory=set)


@dataclass
class CoordinatorSession:
    backend: he.Backend
    public_context: bytes
    n_classes: int
    passive_parties: tuple[str, ...]
    owner: str  # the active party that opened the session
    release: ReleaseContext
    current: TrainingStep | None = None
    last_step: int = -1
    passive_weights: dict[str, np.ndarray] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class Coordinator:
    def __init__(
        self,
        score_chain: ScoreReleaseChain,
        param_chain: ParamReleaseChain,
        fetch_weights: WeightsFetcher,
        seed: int | None = None,
    ) -> None:
        self.score_chain = score_chain
        self.param_chain = param_chain
        self.fetch_weights = fetch_weights
        self.sessions: dict[str, CoordinatorSession] = {}
        self._seeds = np.random.SeedSequence(seed)
        self._lock = threading.Lock()

    def session(self, session_id: str) -> CoordinatorSession:
        try:
            return self.sessions[session_id]
        except KeyError:
            raise NotFound(f"unknown session {session_id!r}") from None

    def open_session(
        self, session_id: str, backend_name: str, n_classes: int, passive_parties: Sequence[str], owner: str
    ) -> bytes:
        if not session_id:
            raise InvalidArgument("session_id is empty")
        if n_classes < 2:
            raise InvalidArgument(f"n_classes must be >= 2, got {n_classes}")
        if len(set(passive_parties)) != len(passive_parties) or not passive_parties:
            raise InvalidArgument(f"passive_parties must be distinct and non-empty, got {list(passive_parties)}")
        with self._lock:
            if session_id in self.sessions:
                raise AlreadyExists(f"session {session_id!r} already exists")
            backend = he.make_keyholder(backend_name)
            rng = np.random.default_rng(self._seeds.spawn(1)[0])
            self.sessions[session_id] = CoordinatorSession(
                backend=backend,
                public_context=backend.public_context(),  # serialised once per session
                n_classes=n_classes,
                passive_parties=tuple(passive_parties),
                owner=owner,
                release=ReleaseContext(rng=rng, n_classes=n_classes),
            )
        return self.sessions[session_id].public_context

    def training_scores(
        self, session_id: str, step: int, logits: he.EncryptedMatrix, replicas: int
    ) -> he.EncryptedMatrix:
        """[[z]] -> [[p]]: the active party never sees a training score in plaintext."""
        s = self.session(session_id)
        k = lr.n_logits(s.n_classes)
        if logits.shape[1] != k:
            raise InvalidArgument(f"logits have {logits.shape[1]} columns, the model has {k}")
        if replicas < 1 or replicas * k > s.backend.slots:
            raise InvalidArgument(f"replicas must be in [1, {s.backend.slots // k}], got {replicas}")
        with s.lock:
            if step <= s.last_step:
                raise FailedPrecondition(f"step {step} is not after step {s.last_step}")
            z = he.decrypt_matrix(s.backend, logits)
            if not np.isfinite(z).all():
                raise InvalidArgument("aggregate logits decrypt to non-finite values")
            probs = he.encrypt_matrix(s.backend, lr.link(z), replicas=replicas)
            s.last_step = step
            s.current = TrainingStep(step, probs.layout)
        return probs

    def block_sums(self, session_id: str, step: int, caller: str, ciphertexts: Sequence[bytes]) -> np.ndarray:
        """Masked products -> masked block sums, once per party per step, only in the layout issued."""
        s = self.session(session_id)
        if caller != s.owner and caller not in s.passive_parties:
            raise PermissionDenied(f"{caller} is not a party of session {session_id!r}")
        with s.lock:
            current = s.current
            if current is None or current.step != step:
                raise FailedPrecondition(f"step {step} is not the current training step")
            if caller in current.served:
                raise FailedPrecondition(f"{caller} already received block sums for step {step}")
            layout = current.layout
            n_chunks = layout.n_chunks
            if not ciphertexts or len(ciphertexts) % n_chunks:
                raise InvalidArgument(
                    f"expected a multiple of {n_chunks} ciphertexts (one per chunk and feature group), "
                    f"got {len(ciphertexts)}"
                )
            current.served.add(caller)
        try:
            cts = he.deserialize_all(s.backend, ciphertexts, layout.ct_size)
        except ValueError as exc:
            raise InvalidArgument(f"ciphertexts: {exc}") from exc
        return he.block_sums(s.backend, cts, layout)

    def finish_training(self, session_id: str) -> None:
        """Pull every passive block over TLS and keep it here (PPS-B and the parameter chain need it)."""
        s = self.session(session_id)
        weights = {party: self.fetch_weights(party, session_id) for party in s.passive_parties}
        with s.lock:
            s.passive_weights = weights
            s.release.passive_weights = weights
            s.release.cache.clear()  # model-dependent precomputation is stale now

    def release_scores(self, session_id: str, logits: he.EncryptedMatrix) -> tuple[np.ndarray, int]:
        s = self.session(session_id)
        k = lr.n_logits(s.n_classes)
        if logits.shape[1] != k:
            raise InvalidArgument(f"logits have {logits.shape[1]} columns, the model has {k}")
        z = he.decrypt_matrix(s.backend, logits)
        if not np.isfinite(z).all():
            raise InvalidArgument("aggregate logits decrypt to non-finite values")
        raw = lr.confidence_scores(z)
        with s.lock:  # the release RNG and cache are per session
            released = self.score_chain(raw, z, s.release)
        changed = int(np.count_nonzero(released.argmax(axis=1) != raw.argmax(axis=1)))
        return released, changed

    def release_model(self, session_id: str) -> dict[str, np.ndarray | None]:
        s = self.session(session_id)
        if s.passive_weights is None:
            raise FailedPrecondition("the model is released after training: call FinishTraining first")
        with s.lock:
            return self.param_chain(s.passive_weights, s.release)

    def close(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)


def release_steps(chain: ScoreReleaseChain | ParamReleaseChain) -> list[common_pb2.ReleaseStep]:
    return [common_pb2.ReleaseStep(name=name, params=params) for name, params in chain.describe()]


class CoordinatorServicer(coordinator_pb2_grpc.CoordinatorServicer):
    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator

    @rpc
    def OpenSession(self, request: coordinator_pb2.OpenSessionRequest, context: grpc.ServicerContext):
        c = self.coordinator
        public = c.open_session(
            request.session_id,
            wire.backend_name(request.backend),
            request.n_classes,
            list(request.passive_parties),
            owner=current_caller().party_id,
        )
        return coordinator_pb2.OpenSessionReply(
            public_context=public,
            score_release=release_steps(c.score_chain),
            param_release=release_steps(c.param_chain),
        )

    @rpc
    def GetPublicContext(self, request: common_pb2.SessionRef, context: grpc.ServicerContext):
        s = self.coordinator.session(request.session_id)
        return coordinator_pb2.PublicContext(
            backend=wire.BACKEND_ENUM[s.backend.name], data=s.public_context, n_classes=s.n_classes
        )

    @rpc
    def ComputeTrainingScores(self, request: coordinator_pb2.TrainingScoresRequest, context: grpc.ServicerContext):
        s = self.coordinator.session(request.session_id)
        logits = wire.from_message(s.backend, request.logits, "logits")
        probs = self.coordinator.training_scores(request.session_id, request.step, logits, request.replicas)
        return wire.to_message(s.backend, probs)

    @rpc
    def DecryptBlockSums(self, request: coordinator_pb2.BlockSumsRequest, context: grpc.ServicerContext):
        sums = self.coordinator.block_sums(
            request.session_id, request.step, current_caller().party_id, list(request.ciphertexts)
        )
        return to_tensor(sums)

    @rpc
    def FinishTraining(self, request: common_pb2.SessionRef, context: grpc.ServicerContext):
        self.coordinator.finish_training(request.session_id)
        return common_pb2.Empty()

    @rpc
    def ReleaseScores(self, request: coordinator_pb2.ReleaseScoresRequest, context: grpc.ServicerContext):
        s = self.coordinator.session(request.session_id)
        logits = wire.from_message(s.backend, request.logits, "logits")
        scores, changed = self.coordinator.release_scores(request.session_id, logits)
        return coordinator_pb2.ReleasedScores(
            scores=to_tensor(scores), chain=release_steps(self.coordinator.score_chain), argmax_changed=changed
        )

    @rpc
    def ReleaseModel(self, request: common_pb2.SessionRef, context: grpc.ServicerContext):
        disclosed = self.coordinator.release_model(request.session_id)
        blocks = [
            coordinator_pb2.PassiveBlock(party_id=party, withheld=True)
            if w is None
            else coordinator_pb2.PassiveBlock(party_id=party, weights=to_tensor(w))
            for party, w in disclosed.items()
        ]
        return coordinator_pb2.ReleasedModel(passive=blocks, chain=release_steps(self.coordinator.param_chain))

    @rpc
    def CloseSession(self, request: common_pb2.SessionRef, context: grpc.ServicerContext):
        self.coordinator.close(request.session_id)
        return common_pb2.Empty()


ROLE_POLICY: dict[str, frozenset[str]] = {
    "OpenSession": frozenset({"active"}),
    "GetPublicContext": frozenset({"active", "passive"}),
    "ComputeTrainingScores": frozenset({"active"}),
    "DecryptBlockSums": frozenset({"active", "passive"}),
    "FinishTraining": frozenset({"active"}),
    "ReleaseScores": frozenset({"active"}),
    "ReleaseModel": frozenset({"active"}),
    "CloseSession": frozenset({"active"}),
}
