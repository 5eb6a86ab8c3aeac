"""Active party: labels + its own features; drives PSI, training and inference for its operator.

Plain-Python engine (:class:`ActiveParty`) + thin gRPC servicer (:class:`ActiveServicer`). Everything the
party receives is offered to its plugins (``services/plugins/__init__.py``).
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
import numpy as np

from vflsec.services import plugins
from vflsec.services.crypto import entropy, he, psi, share_mask
from vflsec.services.data.datasets import PartyData
from vflsec.services.engines import checkpoint
from vflsec.services.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from vflsec.services.models import lr
from vflsec.services.transport import wire
from vflsec.services.transport.links import CoordinatorClient, PassiveClient
from vflsec.services.transport.server import rpc
from vflsec.services.transport.tensors import from_tensor, to_tensor
from vflsec.v1 import active_pb2, active_pb2_grpc, common_pb2, coordinator_pb2

T = TypeVar("T")

PREDICT_CHUNK_CIPHERTEXTS = 8  # ciphertexts per passive reply during inference (bounds message sizes)


@dataclass
class Progress:
    epoch: int
    batch: int
    n_batches: int
    step: int
    seconds: float
    done: bool = False


@dataclass
class TrainingRun:
    """Where a Train call is, so that a restarted active party resumes it at its next step."""

    digest: str  # of the sample IDs, with the epoch count: the same request resumes, another starts anew
    epochs: int
    epoch: int = 1
    batch: int = 0  # batches of this epoch already applied
    order: np.ndarray | None = None  # this epoch's shuffled order
    done: bool = False


@dataclass
class ActiveSession:
    session_id: str
    backend: he.Backend
    public_context: bytes
    n_classes: int
    training: common_pb2.TrainingConfig
    weights: np.ndarray  # (K_logits, d_a)
    bias: np.ndarray  # (K_logits,)
    optimizer_w: lr.BlockOptimizer
    optimizer_b: lr.BlockOptimizer
    passive_features: dict[str, int]
    score_release: list[common_pb2.ReleaseStep]
    param_release: list[common_pb2.ReleaseStep]
    rng: np.random.Generator  # batch order (seeded: runs are reproducible)
    mask_key: bytes  # this session's mask stream (AES-CTR keyed from os.urandom, see services/crypto/entropy.py)
    # Per passive party, the key of its inference-share masks (services/crypto/share_mask.py), sent at JoinSession;
    # empty in a checkpoint written before share masks existed (such a session cannot predict).
    share_mask_keys: dict[str, bytes]
    rows: np.ndarray | None = None  # common index -> active row (after PSI)
    psi_started: bool = False  # one PSI exchange per session, checkpointed before it starts
    index_of: dict[str, int] = field(default_factory=dict)  # own sample ID -> common index
    step: int = 0
    trained: bool = False
    run: TrainingRun | None = None
    inference: he.Backend | None = None  # public inference keys (from the coordinator's AdmitQuery)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def k(self) -> int:
        return self.weights.shape[0]

    def to_state(self) -> tuple[dict[str, np.ndarray], dict]:
        (w_opt, w_t), (b_opt, b_t) = self.optimizer_w.state(), self.optimizer_b.state()
        arrays = {
            "weights": self.weights,
            "bias": self.bias,
            "context": checkpoint.from_bytes(self.public_context),
            "opt_w_m": w_opt["m"],
            "opt_w_v": w_opt["v"],
            "opt_b_m": b_opt["m"],
            "opt_b_v": b_opt["v"],
            "mask_key": checkpoint.from_bytes(self.mask_key),
            **{f"share_mask_key/{p}": checkpoint.from_bytes(key) for p, key in self.share_mask_keys.items()},
        }
        if self.rows is not None:
            arrays["rows"] = self.rows
        run = None
        if self.run is not None:
            run = {
                "digest": self.run.digest,
                "epochs": self.run.epochs,
                "epoch": self.run.epoch,
                "batch": self.run.batch,
                "done": self.run.done,
            }
            if self.run.order is not None:
                arrays["run_order"] = self.run.order
        t = self.training
        meta = {
            "backend": self.backend.name,
            "n_classes": self.n_classes,
            "step": self.step,
            "trained": self.trained,
            "training": [t.optimizer, t.learning_rate, t.l2, t.batch_size, t.seed],
            "passive_features": self.passive_features,
            "opt_t": [w_t, b_t],
            "rng": self.rng.bit_generator.state,
            "release": [
                [[r.name, dict(r.params)] for r in chain] for chain in (self.score_release, self.param_release)
            ],
            "run": run,
            "psi_started": self.psi_started,
        }
        return arrays, meta

    @classmethod
    def from_state(cls, session_id: str, arrays: dict[str, np.ndarray], meta: dict, ids: list[str]) -> ActiveSession:
        context = checkpoint.as_bytes(arrays["context"])
        optimizer, learning_rate, l2, batch_size, seed = meta["training"]
        training = common_pb2.TrainingConfig(
            optimizer=optimizer, learning_rate=learning_rate, l2=l2, batch_size=batch_size, seed=seed
        )
        config = lr.OptimizerConfig(optimizer, learning_rate, l2)
        weights, bias = np.array(arrays["weights"]), np.array(arrays["bias"])
        optimizer_w = lr.BlockOptimizer(config, weights.shape)
        optimizer_w.load_state({"m": arrays["opt_w_m"], "v": arrays["opt_w_v"]}, meta["opt_t"][0])
        optimizer_b = lr.BlockOptimizer(config, bias.shape, penalised=False)
        optimizer_b.load_state({"m": arrays["opt_b_m"], "v": arrays["opt_b_v"]}, meta["opt_t"][1])
        rng = np.random.default_rng()
        rng.bit_generator.state = meta["rng"]
        score_release, param_release = (
            [common_pb2.ReleaseStep(name=name, params=params) for name, params in chain] for chain in meta["release"]
        )
        s = cls(
            session_id=session_id,
            backend=he.open_public(meta["backend"], context),
            public_context=context,
            n_classes=meta["n_classes"],
            training=training,
            weights=weights,
            bias=bias,
            optimizer_w=optimizer_w,
            optimizer_b=optimizer_b,
            passive_features=meta["passive_features"],
            score_release=score_release,
            param_release=param_release,
            rng=rng,
            mask_key=checkpoint.as_bytes(arrays["mask_key"]),
            share_mask_keys={
                name.removeprefix("share_mask_key/"): checkpoint.as_bytes(key)
                for name, key in arrays.items()
                if name.startswith("share_mask_key/")
            },
            step=meta["step"],
            trained=meta["trained"],
            psi_started=meta.get("psi_started", "rows" in arrays),
        )
        if "rows" in arrays:
            s.rows = np.array(arrays["rows"])
            s.index_of = {ids[row]: i for i, row in enumerate(s.rows)}
        if meta["run"] is not None:
            s.run = TrainingRun(order=arrays.get("run_order"), **meta["run"])
        return s


class ActiveParty:
    def __init__(
        self,
        party_id: str,
        data: PartyData,
        class_names: list[str],
        coordinator: CoordinatorClient,
        passives: Mapping[str, PassiveClient],
        hub: plugins.PluginHub | None = None,
        state: checkpoint.StateDir | None = None,
        *,
        psi_max_ids: int = psi.MAX_IDS,
    ) -> None:
        if data.y is None:
            raise ValueError("the active party's data file needs a label column")
        if not passives:
            raise ValueError("an active party needs at least one passive party")
        self.party_id = party_id
        self.data = data
        self.class_names = class_names
        self.coordinator = coordinator
        self.passives = dict(passives)
        self.hub = hub or plugins.PluginHub()
        self.state = state or checkpoint.StateDir(None)
        self.psi_max_ids = psi_max_ids
        ids = [str(i) for i in data.ids]
        self.sessions: dict[str, ActiveSession] = {
            sid: ActiveSession.from_state(sid, arrays, meta, ids)
            for sid, (arrays, meta) in self.state.load_all().items()
        }
        self._pool = ThreadPoolExecutor(max_workers=max(2, len(self.passives) + 1), thread_name_prefix="peer")
        self._lock = threading.Lock()

    @property
    def n_classes(self) -> int:
        return max(len(self.class_names), 2)

    def session(self, session_id: str) -> ActiveSession:
        try:
            return self.sessions[session_id]
        except KeyError:
            raise NotFound(f"unknown session {session_id!r}") from None

    def _save(self, s: ActiveSession) -> None:
        self.state.save(s.session_id, *s.to_state())

    def _emit(self, kind: str, s: ActiveSession, source: str, **fields: object) -> None:
        if self.hub.active:
            self.hub.emit(plugins.Observation(kind=kind, session_id=s.session_id, source=source, **fields))

    def _each_passive(self, fn: Callable[[str, PassiveClient], T]) -> list[T]:
        """Run ``fn(party, client)`` for every passive party concurrently; results in party order."""
        futures = [self._pool.submit(fn, party, client) for party, client in self.passives.items()]
        return [f.result() for f in futures]

    # --- session ---
    def create_session(self, session_id: str, backend_name: str, training: common_pb2.TrainingConfig) -> ActiveSession:
        session_id = session_id or uuid.uuid4().hex
        if not checkpoint.valid_session_id(session_id):
            raise InvalidArgument(f"invalid session_id {session_id!r}")
        config = wire.optimizer_config(training)
        if training.batch_size < 0:
            raise InvalidArgument(f"batch_size must be positive, got {training.batch_size}")
        k, d = lr.n_logits(self.n_classes), self.data.X.shape[1]
        with self._lock:
            if session_id in self.sessions:
                raise AlreadyExists(f"session {session_id!r} already exists")
            reply = self.coordinator.open_session(session_id, backend_name, self.n_classes, list(self.passives))
            backend = he.open_public(backend_name, reply.public_context)
            share_mask_keys = {party: entropy.new_key() for party in self.passives}
            joined = self._each_passive(
                lambda party, client: client.join(
                    session_id, backend_name, self.n_classes, training, share_mask_keys[party]
                )
            )
            widths = [d + 1, *(r.n_features for r in joined)]
            batch_size = training.batch_size or lr.default_batch_size(widths)
            if batch_size < lr.min_batch_size(widths):
                self._each_passive(lambda party, client: client.close(session_id))
                self.coordinator.close(session_id)
                raise InvalidArgument(
                    f"batch_size {batch_size} is below the minimum batch {lr.min_batch_size(widths)} for these "
                    f"parties (2 x the widest block, {max(widths)} columns); the smallest accepted value is "
                    f"{lr.min_batch_size(widths)}"
                )
            training = common_pb2.TrainingConfig(
                optimizer=config.name,
                learning_rate=config.learning_rate,
                l2=config.l2,
                batch_size=batch_size,
                seed=training.seed,
            )
            s = ActiveSession(
                session_id=session_id,
                backend=backend,
                public_context=reply.public_context,
                n_classes=self.n_classes,
                training=training,
                weights=np.zeros((k, d)),
                bias=np.zeros(k),
                optimizer_w=lr.BlockOptimizer(config, (k, d)),
                optimizer_b=lr.BlockOptimizer(config, (k,), penalised=False),
                passive_features={party: r.n_features for party, r in zip(self.passives, joined, strict=True)},
                score_release=list(reply.score_release),
                param_release=list(reply.param_release),
                rng=np.random.default_rng(training.seed),  # batch order only: the seed steers no secret draw
                mask_key=entropy.new_key(),
                share_mask_keys=share_mask_keys,
            )
            self._save(s)
            self.sessions[session_id] = s
        self._emit(
            plugins.PUBLIC_CONTEXT,
            s,
            "coordinator",
            blobs={"context": [reply.public_context]},
            meta={"backend": backend_name},
        )
        self._emit(
            plugins.SESSION,
            s,
            "coordinator",
            meta={
                "n_classes": s.n_classes,
                "class_names": self.class_names,
                "active_features": list(self.data.columns),
                "passive_features": s.passive_features,
                "score_release": [step.name for step in s.score_release],
                "param_release": [step.name for step in s.param_release],
            },
        )
        return s

    # --- alignment ---
    def align(self, session_id: str) -> list[str]:
        """PSI with every passive party: one exchange per session, marked in the checkpoint before it starts, so
        a restarted party does not run a second one; an exchange that failed before any reply is unmarked and may
        be retried (docs/protocol.md, "Alignment")."""
        s = self.session(session_id)
        own_ids = [str(i) for i in self.data.ids]
        if not own_ids:
            raise FailedPrecondition(f"PSI: {self.party_id} holds no sample IDs")
        if len(own_ids) > self.psi_max_ids:
            raise FailedPrecondition(
                f"PSI: this party holds {len(own_ids)} sample IDs, over the cap of {self.psi_max_ids} "
                "([limits] psi_max_ids; every passive party must accept as many)"
            )
        with s.lock:
            if s.psi_started:
                raise FailedPrecondition(
                    f"session {session_id!r} has had its PSI exchange (one per session): open a new session to "
                    "align again"
                )
            s.psi_started = True
            self._save(s)
        key, salt = psi.PsiKey(), psi.new_salt()
        blinded = key.blind_ids(own_ids, salt)
        try:
            replies = self._each_passive(lambda party, client: client.psi_exchange(session_id, salt, blinded))
        except Exception:
            # Nothing is aligned yet, so the session may try again: a passive party that did answer has marked its
            # own session and refuses a second exchange itself, one that refused kept nothing.
            with s.lock:
                s.psi_started = False
                self._save(s)
            raise
        for party, (_, own) in zip(self.passives, replies, strict=True):
            if len(own) > self.psi_max_ids:  # it could test that many candidates against our list
                raise InvalidArgument(
                    f"PSI: {party} sent {len(own)} IDs, over this party's cap of {self.psi_max_ids} "
                    "([limits] psi_max_ids)"
                )
            if not own:
                raise FailedPrecondition(f"PSI: {party} holds no sample IDs")
        try:
            names = list(self.passives)
            alignment = psi.active_align(key, [r[0] for r in replies], [r[1] for r in replies], names=names)
        except ValueError as exc:
            raise InvalidArgument(f"PSI: {exc}") from exc
        if alignment.size == 0:
            raise FailedPrecondition(
                f"PSI: no sample ID is common to all of {self.party_id} ({len(own_ids)} IDs), "
                + ", ".join(f"{party} ({len(own)} IDs)" for party, (_, own) in zip(self.passives, replies, strict=True))
                + ": check each party's ID column and its spelling (e.g. '7' vs '007')"
            )
        positions = dict(zip(self.passives, alignment.passive_positions, strict=True))
        self._each_passive(lambda party, client: client.psi_finish(session_id, positions[party]))
        with s.lock:
            s.rows = alignment.active_rows
            s.index_of = {own_ids[row]: i for i, row in enumerate(s.rows)}
            self._save(s)
        return [own_ids[row] for row in s.rows]

    def _indices(self, s: ActiveSession, sample_ids: list[str]) -> np.ndarray:
        if s.rows is None:
            raise FailedPrecondition("samples are not aligned yet: call Align first")
        if not sample_ids:
            raise InvalidArgument("sample_ids is empty")
        try:
            return np.fromiter((s.index_of[i] for i in sample_ids), dtype=np.int64, count=len(sample_ids))
        except KeyError as exc:
            raise NotFound(f"sample ID {exc.args[0]!r} is not among the aligned samples") from None

    def _aggregate_logits(self, s: ActiveSession, step: int, index: np.ndarray) -> he.EncryptedMatrix:
        """[[z]] = Σ_p [[z_p]] + (X_a W_aᵀ + b): ciphertexts only, the active party cannot decrypt."""
        received = self._each_passive(
            lambda party, client: client.forward(s.backend, s.session_id, step, index, s.n_classes)
        )
        for party, (_, blobs) in zip(self.passives, received, strict=True):
            self._emit(plugins.ENCRYPTED_LOGITS, s, party, blobs={"ciphertexts": blobs}, meta={"step": step})
        total = received[0][0]
        for matrix, _ in received[1:]:
            total = he.add_matrices(s.backend, total, matrix)
        own = self.data.X[s.rows[index]] @ s.weights.T + s.bias
        return he.add_plain_matrix(s.backend, total, own)

    # --- training ---
    def train(self, session_id: str, sample_ids: list[str], epochs: int) -> Iterator[Progress]:
        """Train for ``epochs`` over ``sample_ids``; the same request after a crash resumes where it stopped."""
        s = self.session(session_id)
        if epochs < 1:
            raise InvalidArgument(f"epochs must be >= 1, got {epochs}")
        index = self._indices(s, sample_ids)
        digest = hashlib.sha256("\n".join([str(epochs), *sample_ids]).encode()).hexdigest()
        if not s.lock.acquire(blocking=False):
            raise FailedPrecondition(f"session {session_id!r} is already training")
        try:
            run = s.run
            if run is None or run.digest != digest or run.done:
                run = s.run = TrainingRun(digest, epochs)
                rows = s.rows[index]
                self._emit(
                    plugins.TRAINING_DATA,
                    s,
                    self.party_id,
                    sample_ids=tuple(sample_ids),
                    arrays={"features": self.data.X[rows], "labels": self.data.y[rows]},
                )
            start = time.perf_counter()
            while run.epoch <= epochs:
                if run.order is None:
                    run.order = s.rng.permutation(len(index))
                batches = lr.batches(run.order, s.training.batch_size, lr.min_batch_size(self._widths(s).values()))
                while run.batch < len(batches):
                    step = s.step + 1
                    self._train_step(s, step, index[batches[run.batch]])
                    s.step, run.batch = step, run.batch + 1
                    self._save(s)  # the step is complete at every party: the resume point moves past it
                    yield Progress(run.epoch, run.batch, len(batches), step, time.perf_counter() - start)
                run.epoch, run.batch, run.order = run.epoch + 1, 0, None
            self.coordinator.finish_training(session_id)
            s.trained, run.done = True, True
            self._save(s)
            yield Progress(epochs, 0, 0, s.step, time.perf_counter() - start, done=True)
        finally:
            s.lock.release()

    def _widths(self, s: ActiveSession) -> dict[str, int]:
        """Every party's gradient block width: its feature columns, plus the bias column for this party."""
        return {self.party_id: self.data.X.shape[1] + 1, **s.passive_features}

    def _replicas(self, s: ActiveSession, batch: int) -> int:
        """One replication factor for every party's gradient products, sized for the widest block."""
        widest = max(self._widths(s).values())
        return he.choose_replicas(batch, s.k, widest, s.backend.slots)

    def _train_step(self, s: ActiveSession, step: int, index: np.ndarray) -> None:
        logits = self._aggregate_logits(s, step, index)
        widths = self._widths(s)
        reply = self.coordinator.training_scores(
            s.backend, s.session_id, step, logits, self._replicas(s, len(index)), index, widths
        )
        self._emit(
            plugins.ENCRYPTED_SCORES,
            s,
            "coordinator",
            blobs={"ciphertexts": list(reply.ciphertexts)},
            meta={"step": step},
        )
        probs = wire.from_message(s.backend, reply, "training scores", rows=len(index), cols=s.k)
        rows = s.rows[index]
        delta = he.add_plain_matrix(s.backend, probs, -lr.targets(self.data.y[rows], s.n_classes))
        delta_message = wire.to_message(s.backend, delta)  # serialised once, sent to every passive party
        own = self._pool.submit(self._own_gradient, s, step, delta, wire.digest(reply.ciphertexts), rows)
        self._each_passive(lambda party, client: client.backward(s.session_id, step, index, delta_message))
        grad = own.result()
        # Applied only once every party has applied the step: a failed step is redone whole, never twice here.
        s.weights = s.optimizer_w.step(s.weights, grad[:, :-1])
        s.bias = s.optimizer_b.step(s.bias, grad[:, -1])

    def _own_gradient(
        self, s: ActiveSession, step: int, delta: he.EncryptedMatrix, scores_digest: bytes, rows: np.ndarray
    ) -> np.ndarray:
        x = np.hstack([self.data.X[rows], np.ones((len(rows), 1))])  # the ones column yields the bias gradient
        # Masks keyed by step and [[p]]: a replayed step (the coordinator repeats [[p]]) rebuilds the same bytes.
        masks = entropy.keyed_stream(s.mask_key, s.session_id, step, scores_digest)
        cts, mask_sums = he.masked_feature_products(s.backend, delta, x, masks)
        width = x.shape[1]
        sums = self.coordinator.block_sums(s.session_id, step, [s.backend.serialize(c) for c in cts], width)
        if sums.shape != (width, s.k):
            raise FailedPrecondition(f"coordinator returned block sums of shape {sums.shape}, expected {(width, s.k)}")
        grad = he.gradient_from_block_sums(sums, mask_sums[:width], width) / len(rows)
        self._emit(
            plugins.GRADIENT,
            s,
            "coordinator",
            arrays={"weights": grad[:, :-1], "bias": grad[:, -1]},
            meta={"step": step},
        )
        return grad

    # --- inference ---
    def _predict_chunk_rows(self, s: ActiveSession) -> int:
        return PREDICT_CHUNK_CIPHERTEXTS * (s.backend.slots // s.k)

    def predict(self, session_id: str, sample_ids: list[str]) -> tuple[np.ndarray, list[common_pb2.ReleaseStep], int]:
        """Scores through the coordinator: the whole query is admitted (or refused) before any chunk is
        released; each passive party sends its masked share of a chunk to the coordinator, which adds ours
        (from which we subtract every passive party's mask: services/crypto/share_mask.py)."""
        s = self.session(session_id)
        index = self._indices(s, sample_ids)
        if set(s.share_mask_keys) != set(self.passives):
            raise FailedPrecondition(f"session {session_id!r} has no share-mask keys: open a new session")
        admitted = self.coordinator.admit_query(session_id, index)
        if s.inference is None:
            s.inference = he.open_public(s.backend.name, admitted.inference_context)
        query_id, keys = admitted.query_id, s.inference
        chunk = self._predict_chunk_rows(s)
        scores, changed, chain = [], 0, []
        for start in range(0, len(index), chunk):
            part = index[start : start + chunk]
            masks = sum(
                share_mask.share_mask(key, keys.default_mask_bound, session_id, s.step, query_id, part, s.k)
                for key in s.share_mask_keys.values()
            )
            own = self._pool.submit(
                he.encrypt_matrix, keys, self.data.X[s.rows[part]] @ s.weights.T + s.bias - masks
            )
            self._each_passive(lambda party, client, part=part: client.share_logits(session_id, query_id, part))
            reply: coordinator_pb2.ReleasedScores = self.coordinator.release_scores(
                keys, session_id, query_id, own.result(), part
            )
            released = from_tensor(reply.scores, "released scores", shape=(len(part), s.n_classes), finite=False)
            ids = sample_ids[start : start + chunk]
            self._emit(
                plugins.RELEASED_SCORES,
                s,
                "coordinator",
                sample_ids=tuple(ids),
                arrays={"scores": released, "own_features": self.data.X[s.rows[part]]},
                meta={
                    "chain": [step.name for step in reply.chain],
                    "steps": [[step.name, dict(step.params)] for step in reply.chain],  # public params: Kerckhoffs
                    "argmax_changed": reply.argmax_changed,
                },
            )
            scores.append(released)
            changed += reply.argmax_changed
            chain = list(reply.chain)
        return np.vstack(scores), chain, changed

    def fetch_model(self, session_id: str) -> tuple[np.ndarray, np.ndarray, coordinator_pb2.ReleasedModel]:
        s = self.session(session_id)
        if not s.trained:
            raise FailedPrecondition("the model is released after training")
        released = self.coordinator.release_model(session_id)
        disclosed = {
            f"w_passive/{b.party_id}": from_tensor(b.weights, f"weights of {b.party_id}", ndim=2)
            for b in released.passive
            if not b.withheld
        }
        # The released bias: the active party's own, plus what the parameter chain adds (PPS-A flip).
        bias = s.bias.copy()
        if released.HasField("bias_offset"):
            bias = bias + from_tensor(released.bias_offset, "bias offset", shape=(s.k,))
        self._emit(
            plugins.RELEASED_MODEL,
            s,
            "coordinator",
            arrays={"w_active": s.weights.copy(), "bias": bias, "trained_bias": s.bias.copy(), **disclosed},
            meta={
                "chain": [step.name for step in released.chain],
                "steps": [[step.name, dict(step.params)] for step in released.chain],
                "withheld": [b.party_id for b in released.passive if b.withheld],
            },
        )
        return s.weights.copy(), bias, released

    def close(self, session_id: str) -> None:
        self.session(session_id)
        self._each_passive(lambda party, client: client.close(session_id))
        self.coordinator.close(session_id)
        self.sessions.pop(session_id, None)


class ActiveServicer(active_pb2_grpc.ActiveServicer):
    def __init__(self, party: ActiveParty) -> None:
        self.party = party

    @rpc
    def CreateSession(self, request: active_pb2.CreateSessionRequest, context: grpc.ServicerContext):
        s = self.party.create_session(request.session_id, wire.backend_name(request.backend), request.training)
        return active_pb2.SessionInfo(
            session_id=s.session_id,
            n_classes=s.n_classes,
            class_names=self.party.class_names,
            n_active_features=s.weights.shape[1],
            passive_features=s.passive_features,
            score_release=s.score_release,
            param_release=s.param_release,
        )

    @rpc
    def Align(self, request: common_pb2.SessionRef, context: grpc.ServicerContext):
        common = self.party.align(request.session_id)
        return active_pb2.AlignReply(common_ids=common, n_active=len(self.party.data.ids))

    @rpc
    def Train(self, request: active_pb2.TrainRequest, context: grpc.ServicerContext):
        for p in self.party.train(request.session_id, list(request.sample_ids), request.epochs):
            yield active_pb2.TrainProgress(
                epoch=p.epoch, batch=p.batch, n_batches=p.n_batches, step=p.step, seconds=p.seconds, done=p.done
            )

    @rpc
    def Predict(self, request: active_pb2.PredictRequest, context: grpc.ServicerContext):
        scores, chain, changed = self.party.predict(request.session_id, list(request.sample_ids))
        return active_pb2.PredictReply(
            sample_ids=request.sample_ids, scores=to_tensor(scores), chain=chain, argmax_changed=changed
        )

    @rpc
    def FetchModel(self, request: common_pb2.SessionRef, context: grpc.ServicerContext):
        weights, bias, released = self.party.fetch_model(request.session_id)
        return active_pb2.ModelReply(active_weights=to_tensor(weights), bias=to_tensor(bias), released=released)

    @rpc
    def CloseSession(self, request: common_pb2.SessionRef, context: grpc.ServicerContext):
        self.party.close(request.session_id)
        return common_pb2.Empty()


ROLE_POLICY: dict[str, frozenset[str]] = {
    method: frozenset({"operator"})
    for method in ("CreateSession", "Align", "Train", "Predict", "FetchModel", "CloseSession")
}

