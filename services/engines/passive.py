"""Passive party: feature columns only. Plain-Python engine; its gRPC servicers are in services/rpc/ (passive.py,
splitnn.py, trees.py)."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from vflsec.services import plugins
from vflsec.services.common import (
    ACTIVE,
    CHUNK_VALUES,
    COORDINATOR,
    PASSIVE,
    require_distinct_rows,
    require_entries,
    require_query_id,
)
from vflsec.services.config import MIN_NODE_ROWS, MIN_TRAINING_ROWS
from vflsec.services.crypto import entropy, he, oprf, psi, ring_mask, spill
from vflsec.services.data.datasets import PartyData
from vflsec.services.defenses import params as param_defenses
from vflsec.services.defenses.embeddings import EmbeddingChain, basis_problem, binary_free_basis
from vflsec.services.engines import checkpoint
from vflsec.services.engines.policy import BackendPolicy
from vflsec.services.engines.sessions import EpochKeys, RowSet, SessionTable, declared_step, epoch_keys
from vflsec.services.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    ServiceError,
)
from vflsec.services.models import family as families

log = logging.getLogger(__name__)
# PSI streams (PsiExchangeStream, PsiOprfStream) one caller may hold open at once: a stream waits on its caller
# between messages, uncharged, so without a limit idle streams would hold every server thread (review 15, F5).
PSI_STREAMS_PER_OWNER = 2


class CoordinatorLink(Protocol):
    """What a passive party needs from the coordinator."""

    def public_context(self, session_id: str) -> tuple[str, bytes, str]: ...

    def training_context(self, session_id: str, step: int) -> tuple[int, int, bytes]: ...

    def block_sums(
        self, session_id: str, step: int, ciphertexts: list[bytes], width: int, mask_tag: bytes
    ) -> np.ndarray: ...

    def submit_share(self, session_id: str, query_id: str, sample_index: np.ndarray, share: np.ndarray) -> None: ...

    def submit_training_share(
        self, session_id: str, step: int, sample_index: np.ndarray, share: np.ndarray
    ) -> None: ...

    def submit_shares(
        self, session_id: str, shares: Sequence[tuple[str, np.ndarray, np.ndarray]]
    ) -> list[ServiceError | None]: ...


@dataclass
class PassiveSession:
    FIXED_STATE: ClassVar[tuple[str, ...]] = ("context", "rows", "psi_permutation")  # set once (checkpoint.py)

    backend: he.Backend
    public_context: bytes
    n_classes: int
    family: str  # the model family (services/models/family.py), chosen at creation
    trainer: families.PassiveTrainer  # the family's state and maths at this party
    # Key of this session's mask stream (AES-CTR, services/crypto/entropy.py): masks are unpredictable to the
    # coordinator, yet a step redone after a crash rebuilds the same masks (the coordinator answers it from cache).
    mask_key: bytes
    owner: str  # the active party that joined us to the session (and opened it at the coordinator)
    # Key of this party's zero-sum masks (inference shares and split-NN training embeddings:
    # services/crypto/ring_mask.py), drawn here from OS entropy and sent to the owner at JoinSession; None
    # in a checkpoint written before share masks existed: such a session cannot share.
    share_mask_key: bytes | None
    trained_rows: RowSet = field(default_factory=RowSet)  # common indices our block was updated on
    # The row of each blinded ID we sent, in order, set once per session (OPRF's on disk: spill.Column, in blocks)
    psi_permutation: np.ndarray | spill.Column | None = None
    rows: np.ndarray | None = None  # common index -> our row, after PSI
    completed_step: int = 0  # last training step whose update is applied (and checkpointed)
    # completed_step when the coordinator pulled our trained rows at FinishTraining: an inference output sent in the
    # clear comes from a finished model only (before training it would be X_p under weights the caller can guess)
    finished_step: int | None = None
    forward_index: tuple[int, np.ndarray] | None = None  # the batch of the step in flight
    # (epoch, rotation, public keys) of the training-key epoch last used: fetched again when a step leaves it.
    training_keys: EpochKeys | None = None
    # This party's embedding defenses on its output sent in the clear (split-NN active-top), this session's draws.
    embedding: EmbeddingChain = field(default_factory=EmbeddingChain)
    # Under embedding noise: answers sent in the clear per aligned row (against the chain's max_answers), and the
    # last training request counted, (step, sample_index), so that the same request asked again is not counted twice.
    answers: np.ndarray | None = None
    answered: tuple[int, np.ndarray] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def to_state(self) -> tuple[dict[str, np.ndarray], dict]:
        trainer_arrays, trainer_meta = self.trainer.to_state()
        arrays = {
            **trainer_arrays,
            "context": checkpoint.from_bytes(self.public_context),
            "mask_key": checkpoint.from_bytes(self.mask_key),
            "trained_rows_bits": self.trained_rows.packed(),
        }
        if self.share_mask_key is not None:
            arrays["share_mask_key"] = checkpoint.from_bytes(self.share_mask_key)
        if self.embedding:  # the PRF keys of the defense steps: the same bits and noise after a restart
            arrays["embedding_keys"] = checkpoint.from_bytes(b"".join(self.embedding.keys))
        for name in ("rows", "psi_permutation", "answers"):
            if getattr(self, name) is not None:
                arrays[name] = getattr(self, name)
        if self.answered is not None:
            arrays["answered_index"] = self.answered[1]
        meta = {
            **trainer_meta,
            "family": self.family,
            "backend": self.backend.name,
            "n_classes": self.n_classes,
            "completed_step": self.completed_step,
            "finished_step": self.finished_step,
            "owner": self.owner,
        }
        if self.embedding:
            meta["embedding_release"] = self.embedding.specs()
        if self.answered is not None:
            meta["answered_step"] = self.answered[0]
        return arrays, meta

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], meta: dict, basis: np.ndarray | None = None) -> PassiveSession:
        """``basis``: the party's kept masquerade K (drop=binary's), which sizes the restored layer's Q."""
        context = checkpoint.as_bytes(arrays["context"])
        family = meta.get("family", families.DEFAULT)  # a checkpoint from before the family layer is LR's
        embedding = EmbeddingChain.from_checkpoint(meta.get("embedding_release", ()))
        if embedding:  # the same defended layer (Q in its buffers) and PRF keys as before the restart, also for a
            # session joined when Q and the bit key were per session; older checkpoints kept only masquerade's key
            blob = checkpoint.as_bytes(arrays.get("embedding_keys", arrays.get("masquerade_key", np.zeros(0))))
            keys = [blob[i : i + entropy.KEY_BYTES] for i in range(0, len(blob), entropy.KEY_BYTES)]
            embedding = embedding.for_session(1, keys, basis=basis)  # m was resolved when the session joined
            trainer = families.get(family).restore_passive((arrays, meta), embedding.module)
        else:
            trainer = families.get(family).restore_passive((arrays, meta))
        return cls(
            backend=he.open_public(meta["backend"], context),
            public_context=context,
            n_classes=meta["n_classes"],
            family=family,
            trainer=trainer,
            mask_key=checkpoint.as_bytes(arrays["mask_key"]),
            owner=meta["owner"],
            share_mask_key=checkpoint.as_bytes(arrays["share_mask_key"]) if "share_mask_key" in arrays else None,
            trained_rows=RowSet.restore(arrays, "trained_rows"),
            psi_permutation=arrays.get("psi_permutation"),
            rows=arrays.get("rows"),
            completed_step=meta["completed_step"],
            finished_step=meta.get("finished_step"),
            embedding=embedding,
            answers=np.array(arrays["answers"], dtype=np.uint16) if "answers" in arrays else None,
            answered=(meta["answered_step"], arrays["answered_index"]) if "answered_step" in meta else None,
        )


def _refuse_second_exchange(session_id: str, s: PassiveSession) -> None:
    # An exchange is final once PsiFinish fixed the rows. Before that another one may run (a failed Align's retry:
    # an empty intersection, a failure at another passive party): it draws a fresh key and is charged to the
    # owner's psi_owner_budget like one in a new session, so it lets the active party test nothing that opening
    # a new session would not.
    if s.rows is not None:
        raise FailedPrecondition(
            f"session {session_id!r} has had its PSI exchange (one per session): open a new session to align again"
        )


class PassiveParty:
    def __init__(
        self,
        party_id: str,
        data: PartyData,
        coordinator: CoordinatorLink,
        state: checkpoint.StateDir | None = None,
        operator: str | None = None,
        coordinator_id: str = COORDINATOR,
        *,
        psi_max_ids: int = psi.MAX_IDS,
        psi_max_ratio: float = psi.MAX_RATIO,
        psi_ratio_floor: int = psi.RATIO_FLOOR,
        psi_owner_budget: int | None = None,
        psi_accept: Sequence[str] = psi.PROTOCOLS,
        allowed_backends: Sequence[str] = ("ckks",),
        embedding_release: Sequence[str] = (),
        min_training_rows: int = MIN_TRAINING_ROWS,
        min_node_rows: int = MIN_NODE_ROWS,
        hub: plugins.PluginHub | None = None,
    ) -> None:
        self.party_id = party_id
        # The OPRF exchange's values wait on disk (oprf.Sender); a kill leaves them there, so they go at start-up.
        spill.sweep()
        # [[plugins]]: what this party receives is offered to its own plugins, as the active party's are (a curious
        # passive party records ∂L/∂h for the label attacks); none by default.
        self.hub = hub or plugins.PluginHub()
        self.min_training_rows = min_training_rows  # [policy]: what this party discloses covers at least these rows
        self.min_node_rows = min_node_rows  # [policy]: ... and a node it partitions leaves both sides at least these
        # [defenses] embedding: this party's own defenses of its output sent in the clear (split-NN active-top);
        # parsed here, so that a bad spec stops the service at start. Each session draws its own noise keys.
        self.embedding_release = EmbeddingChain.from_specs(embedding_release)
        self.state = state or checkpoint.StateDir(None)
        # Masquerade's long-term secret: every session derives the same Q and bit key from it, so the z_B of several
        # sessions over the same rows, stacked, span no more than one session's (services/defenses/embeddings.py).
        # Under drop=binary Q also needs K, the directions uncorrelated with the binary columns of the whole shard:
        # computed once and kept beside the secret, so that rows added later do not move Q either. Under another
        # chain a stored K is still loaded: a drop=binary session checkpointed before the change restores with it.
        self.masquerade_secret: bytes | None = None
        masquerade = self.embedding_release.masquerade
        if masquerade is not None:
            self.masquerade_secret = self.state.secret("masquerade")
            if self.masquerade_secret is None:
                self.masquerade_secret = entropy.new_key()
                log.warning(
                    "%s: masquerade without a state folder: its Q, K and bit key last for this process only (sessions "
                    "after a restart get new ones: stacked with earlier ones they span x again); set state_dir",
                    party_id,
                )
        binary = masquerade is not None and masquerade.drop == "binary"
        self.masquerade_basis = self.state.long_term_array(
            "masquerade_basis",
            (lambda: binary_free_basis(data.X, data.columns)) if binary else None,
            lambda k: basis_problem(data.X, k, data.columns) if binary else None,
        )
        # [policy] allowed_backends: a plain session sends this party's logits in the clear, so it joins one only
        # when its own operator says so, whatever the coordinator allows.
        self.backend_policy = BackendPolicy.of(f"{party_id}'s", allowed_backends)
        self.psi_caps = psi.Caps(psi_max_ids, psi_max_ratio, psi_ratio_floor)  # on a partner's list
        # IDs of the active list this party blinds per owner, over all sessions and restarts ([limits]
        # psi_owner_budget; None: unlimited): one exchange per session does not stop testing a dictionary over
        # many sessions, this does.
        self.psi_owner_budget = psi_owner_budget
        # [psi] accept: the OPRF exchange is served unless this party's operator narrowed it to ["ecdh"]; ECDH always.
        self.psi_accept = frozenset(psi_accept)
        self.data = data
        self.coordinator = coordinator
        self.coordinator_id = coordinator_id  # the coordinator identity this party answers
        self.operator = operator or f"operator-{party_id}"  # this party's own operator (ForecastRisk)
        # A session the policy no longer allows (it changed since the session joined) is refused but for closing.
        self.sessions = SessionTable(
            self.state,
            lambda sid, arrays, meta: PassiveSession.from_state(arrays, meta, self.masquerade_basis),
            refusal=lambda sid, s: self.backend_policy.refusal(sid, s.backend.name),
            duplicate="already joined",
        )
        self.psi_ledger = checkpoint.StateDir(None if self.state.path is None else self.state.path / "psi_owners")
        self.psi_blinded: dict[str, int] = {
            owner: meta["blinded"] for owner, (_, meta) in self.psi_ledger.load_all().items()
        }
        self._lock = threading.Lock()
        self._psi_streams: dict[str, int] = {}  # PSI streams open, per caller

    @property
    def n_features(self) -> int:
        return self.data.X.shape[1]

    def session(self, session_id: str, *, closing: bool = False) -> PassiveSession:
        return self.sessions.get(session_id, closing=closing)

    def _save(self, session_id: str, s: PassiveSession) -> None:
        """Checkpoint ``s`` (caller holds s.lock) unless it was closed meanwhile: :meth:`close` takes the same lock,
        so a step or a deferred follow-up never writes a closed session's files back (review 18)."""
        if self._current(session_id, s):
            self.sessions.save(session_id, s)

    def _current(self, session_id: str, s: PassiveSession) -> bool:
        return session_id in self.sessions and self.sessions[session_id] is s

    def owned(self, session_id: str, caller: str, *, closing: bool = False) -> PassiveSession:
        return self.sessions.owned(session_id, caller, closing=closing)

    def check_coordinator(self, caller: str) -> None:
        if caller != self.coordinator_id:
            raise PermissionDenied(f"{caller} is not this party's coordinator {self.coordinator_id!r}")

    def check_forecaster(self, caller: str) -> None:
        if caller not in (self.operator, self.coordinator_id):
            raise PermissionDenied(f"{caller} is neither this party's operator {self.operator} nor its coordinator")

    def _emit(self, kind: str, session_id: str, source: str, **fields: Any) -> None:
        if self.hub.active:
            self.hub.emit(plugins.Observation(kind=kind, session_id=session_id, source=source, **fields))

    def _sample_ids(self, s: PassiveSession, sample_index: np.ndarray) -> list[str]:
        """This party's own IDs of aligned rows (it knows them: PSI told it which of its rows are common)."""
        return [str(self.data.ids[row]) for row in s.rows[sample_index]] if s.rows is not None else []

    def join(
        self,
        session_id: str,
        backend_name: str,
        n_classes: int,
        settings: Mapping[str, object],
        caller: str,
        family_name: str = families.DEFAULT,
    ) -> int:
        """Join a session the caller opened at the coordinator; ``settings`` are the family's training settings."""
        try:
            family = families.get(family_name)
            config = family.settings(settings)
        except ValueError as exc:
            raise InvalidArgument(f"training: {exc}") from exc
        SessionTable.check_new(session_id)
        self.backend_policy.require(backend_name)
        if n_classes < 2:
            raise InvalidArgument(f"n_classes must be >= 2, got {n_classes}")
        context_backend, context, owner = self.coordinator.public_context(session_id)
        if owner != caller:  # the session is the caller's only if the coordinator says it opened it
            raise PermissionDenied(f"session {session_id!r} was opened at the coordinator by {owner}, not {caller}")
        if context_backend != backend_name:
            raise FailedPrecondition(
                f"coordinator runs session {session_id!r} on {context_backend}, not {backend_name}"
            )
        backend = he.open_public(backend_name, context)
        trainer = family.new_passive(n_classes, self.n_features, config)
        embedding = EmbeddingChain()
        if self.embedding_release and trainer.output_in_the_clear:  # elsewhere our output leaves encrypted only
            embedding = self.embedding_release.for_session(
                len(self.data.ids), secret=self.masquerade_secret, basis=self.masquerade_basis
            )
            try:
                trainer = trainer.defended(embedding.module, embedding.min_width(self.n_features))
            except ValueError as exc:
                raise InvalidArgument(f"{self.party_id}'s embedding defense ([defenses] embedding): {exc}") from exc
        with self.sessions.lock:
            self.sessions.check_absent(session_id)
            s = PassiveSession(
                backend=backend,
                public_context=context,
                n_classes=n_classes,
                family=family.name,
                trainer=trainer,
                mask_key=entropy.new_key(),
                owner=owner,
                share_mask_key=entropy.new_key(),  # its own draw (rule 1); the owner learns it to cancel the masks
                embedding=embedding,
            )
            self.sessions.add(session_id, s)
        self._emit(
            plugins.SESSION,
            session_id,
            owner,
            meta={
                "family": family.name,
                "backend": backend_name,
                "n_classes": n_classes,
                "settings": dict(settings),
                "party": self.party_id,
                "n_features": self.n_features,
            },
        )
        return self.n_features

    # --- PSI (see services/crypto/psi.py) ---
    def psi_exchange(
        self, session_id: str, salt: bytes, chunks: Iterable[psi.Chunk]
    ) -> Iterator[tuple[str, psi.Chunk]]:
        """One exchange per session, capped in size: each reply lets the active party test its list against ours.

        The active list is received whole and checked (its announced size against the caps before any point;
        chunk order and count as they come), then the reply streams out as the pool computes it: A's list
        re-blinded, then our own blinded ids. The permutation is checkpointed before the first of our own values
        leaves; PsiFinish then fixes the rows, after which no other exchange runs on the session (also after a
        restart). Until then a failed alignment may exchange again, under a fresh key and the owner's budget.
        """
        s = self.session(session_id)
        _refuse_second_exchange(session_id, s)
        own_ids = self.data.ids
        if not len(own_ids):
            raise FailedPrecondition(f"PSI: {self.party_id} holds no sample IDs")
        reader = psi.ChunkReader(self.psi_caps.checker(len(own_ids)))
        try:
            for chunk in chunks:
                reader.add(chunk)
            received = reader.result()
        except ValueError as exc:
            raise InvalidArgument(f"PSI: the active party's list: {exc}") from exc
        if not len(received):
            raise InvalidArgument("PSI: the active party sent no IDs")
        if not salt:
            raise InvalidArgument("PSI: the active party sent no salt")
        try:
            reply = psi.passive_stream(psi.PsiKey(), own_ids, received, salt)  # checks our ids before any work
        except ValueError as exc:
            raise FailedPrecondition(f"PSI: {self.party_id}'s own IDs: {exc}") from exc
        n_received = len(received)
        del reader, received  # the reply's tasks hold the list until the last is made (32 MB at 1M IDs), not longer
        self._spend_psi_budget(s.owner, n_received)
        try:
            for name, chunk in reply.chunks:
                if name == psi.OWN and s.psi_permutation is not reply.permutation:
                    with s.lock:
                        _refuse_second_exchange(session_id, s)  # a concurrent exchange may have finished meanwhile
                        s.psi_permutation = reply.permutation
                        self._save(session_id, s)
                yield name, chunk
        except ValueError as exc:
            raise InvalidArgument(f"PSI: the active party's list: {exc}") from exc

    def psi_oprf(
        self, session_id: str, hello: oprf.Hello, steps: Iterable[bytes | oprf.Proof]
    ) -> Iterator[tuple[bytes, list[bytes]] | bytes | psi.Chunk]:
        """The OPRF exchange (services/crypto/oprf.py), one per session with psi_exchange's: yields our keys (code
        seed, base-OT answers), takes U's row chunks, yields our challenge, takes the proof and, only if U passes
        the consistency check, yields our values in chunks. The hello is checked (its bins against the caps, its
        point) and its bins charged to the owner's budget before any work."""
        if "oprf" not in self.psi_accept:  # our own config only: nothing read, drawn or charged
            accept = ", ".join(f'"{p}"' for p in sorted(self.psi_accept))
            raise FailedPrecondition(
                f"PSI: {self.party_id} does not serve the OPRF exchange (its [psi] accept = [{accept}]): set "
                f'[psi] protocol = "ecdh" at the active party, or add "oprf" to {self.party_id}\'s [psi] accept'
            )
        s = self.session(session_id)
        _refuse_second_exchange(session_id, s)
        own_ids = self.data.ids
        if not len(own_ids):
            raise FailedPrecondition(f"PSI: {self.party_id} holds no sample IDs")
        cap = self.psi_caps.largest(len(own_ids))
        if not 1 <= hello.bins <= oprf.bins(cap) or hello.bins % oprf.BIN_ALIGN:
            raise InvalidArgument(
                f"PSI: the active party's hello announces {hello.bins} bins: this party takes a multiple of "
                f"{oprf.BIN_ALIGN} up to {oprf.bins(cap)}, the bins of {cap} IDs ([limits] psi_max_ids, psi_max_ratio, "
                "psi_ratio_floor)"
            )
        if not 1 <= len(hello.salt) <= 64:
            raise InvalidArgument(f"PSI: the active party's salt holds {len(hello.salt)} bytes, not 1 to 64")
        if len(hello.hash_key) != oprf.KEY_BYTES:
            raise InvalidArgument(f"PSI: the active party's hash key holds {len(hello.hash_key)} bytes, not 16")
        try:
            oprf.check_point(hello.base_point, "the base-OT point S")
        except ValueError as exc:
            raise InvalidArgument(f"PSI: the active party's hello: {exc}") from exc
        # Charged before any work (base OTs, hashing our IDs: about a second at 1M), so an owner over its budget
        # costs us one check; refunded if our own IDs then fail, which is our fault, not the owner's.
        self._spend_psi_budget(s.owner, hello.bins, "announced as OPRF bins")
        hashed = None
        try:
            try:
                hashed = oprf.hash_column(own_ids, hello.salt)  # h(y) on disk, read a block at a time
                psi.require_unique_by_range(hashed, "ids")  # on disk
            except ValueError as exc:
                self._spend_psi_budget(s.owner, -hello.bins)
                raise FailedPrecondition(f"PSI: {self.party_id}'s own IDs: {exc}") from exc
            base_ot = oprf.BaseOtReceiver()
            answers = base_ot.answer(hello.base_point)
            code_seed = entropy.os_entropy().bytes(oprf.KEY_BYTES)
            sender = oprf.Sender(hashed, hello.hash_key, hello.bins, base_ot, code_seed)  # draws the challenge
        finally:
            if hashed is not None:
                hashed.close()
        try:  # our values wait on disk until sent (oprf.Sender): removed however the exchange ends
            yield from self._oprf_exchange(session_id, s, hello, sender, code_seed, answers, steps)
        finally:
            sender.close()

    def _oprf_exchange(
        self,
        session_id: str,
        s: PassiveSession,
        hello: oprf.Hello,
        sender: oprf.Sender,
        code_seed: bytes,
        answers: list[bytes],
        steps: Iterable[bytes | oprf.Proof],
    ) -> Iterator[tuple[bytes, list[bytes]] | bytes | psi.Chunk]:
        """:meth:`psi_oprf` from our keys on."""
        yield code_seed, answers
        steps = iter(steps)
        try:  # every refusal from here on is the active party's fault and voids the exchange alike
            try:
                while not sender.complete:
                    step = next(steps, None)
                    if not isinstance(step, bytes):
                        raise ValueError(f"U ended after {sender.chunks} of {oprf.row_chunks(hello.bins)} chunks")
                    sender.add(step)
            except ValueError as exc:
                raise InvalidArgument(f"PSI: the active party's U: {exc}") from exc
            yield sender.challenge  # only now: U is fixed
            proof = next(steps, None)
            if not isinstance(proof, oprf.Proof):
                raise InvalidArgument("PSI: the active party's stream holds no proof after U's last chunk")
            if next(steps, None) is not None:  # an honest party half-closes after its proof
                raise InvalidArgument("PSI: the active party's stream carries a message after its proof")
            try:
                sender.verify(proof)
            except oprf.CheckFailed as exc:  # no value leaves
                raise InvalidArgument(
                    f"PSI: the active party's {exc}; no value was sent, the exchange is void and its bins stay charged"
                ) from None
        except InvalidArgument:  # any earlier exchange's list is void too, unless PsiFinish already fixed rows
            with s.lock:
                if s.rows is None:
                    s.psi_permutation = None
                    self._save(session_id, s)
            raise
        rows = sender.rows  # the secret order, sealed from disk
        with s.lock:
            _refuse_second_exchange(session_id, s)  # a concurrent exchange may have finished meanwhile
            s.psi_permutation = rows
            self._save(session_id, s)
        for index, chunks, data in sender.value_chunks():
            yield psi.Chunk(index, chunks, sender.total, data)

    @contextlib.contextmanager
    def psi_stream_slot(self, caller: str) -> Iterator[None]:
        """One of ``caller``'s PSI_STREAMS_PER_OWNER stream slots, held for a PSI stream's life, or
        ResourceExhausted before anything is read."""
        with self._lock:
            held = self._psi_streams.get(caller, 0)
            if held >= PSI_STREAMS_PER_OWNER:
                raise ResourceExhausted(
                    f"PSI: {caller} has {held} PSI streams open at {self.party_id}, the most one party may hold at "
                    "once: finish or cancel one first"
                )
            self._psi_streams[caller] = held + 1
        try:
            yield
        finally:
            with self._lock:
                self._psi_streams[caller] -= 1

    def _spend_psi_budget(self, owner: str, n: int, sent: str = "sent") -> None:
        """Count ``n`` more IDs blinded (or OPRF bins announced) for ``owner``, durably, before any
        work; refuse over budget. A negative ``n`` refunds a charge for work this party then could not do."""
        with self._lock:
            spent = self.psi_blinded.get(owner, 0)
            if self.psi_owner_budget is not None and spent + n > self.psi_owner_budget:
                raise ResourceExhausted(
                    f"PSI budget of {owner} exhausted: {spent} of {self.psi_owner_budget} IDs blinded over its "
                    f"sessions, {n} more {sent} ([limits] psi_owner_budget)"
                )
            self.psi_blinded[owner] = spent + n
            self.psi_ledger.save(owner, {}, {"blinded": spent + n})

    def psi_finish(self, session_id: str, positions: np.ndarray) -> int:
        """Fix the common rows, once: a retry with the same positions is answered again, different ones refused.

        Bad positions before that void the exchange: one refusal naming no position (psi.BAD_POSITIONS), and the
        next alignment needs a new exchange, charged again, so each probe of our secret order (which positions are
        OPRF padding or share a row) costs a whole exchange and yields at most one bit. An int64 ``positions`` array
        becomes the rows (psi.rows_from_positions with consume)."""
        s = self.session(session_id)
        with s.lock:
            if s.psi_permutation is None:
                raise FailedPrecondition("PsiFinish before PsiExchange")
            try:
                rows = psi.rows_from_positions(positions, s.psi_permutation, consume=True)  # the request's own array
            except ValueError as exc:
                if s.rows is None:
                    s.psi_permutation = None
                    self._save(session_id, s)
                    raise InvalidArgument(
                        f"{exc}; the exchange is void: align again (a new exchange, charged to the budget)"
                    ) from exc
                rows = None  # positions that name no rows cannot be the ones fixed
            if s.rows is not None and (rows is None or not np.array_equal(rows, s.rows)):
                raise FailedPrecondition(f"session {session_id!r} is aligned already (one PSI per session)")
            s.rows = rows
            self._save(session_id, s)
        return len(s.rows)

    def _features(self, s: PassiveSession, sample_index: np.ndarray) -> np.ndarray:
        self._check_index(s, sample_index)
        return self.data.X[s.rows[sample_index]]

    def _check_index(self, s: PassiveSession, sample_index: np.ndarray) -> None:
        if s.rows is None:
            raise FailedPrecondition("samples are not aligned yet: run PSI first")
        if sample_index.size == 0:
            raise InvalidArgument("sample_index is empty")
        bad = (sample_index < 0) | (sample_index >= len(s.rows))
        if bad.any():
            raise NotFound(f"unknown sample index {int(sample_index[bad][0])} (aligned samples: {len(s.rows)})")
        require_distinct_rows(sample_index)  # the training forward, Backward and ShareLogits take every row once

    # --- training and inference ---
    def _training_step_output(self, s: PassiveSession, step: int, sample_index: np.ndarray, epoch: int) -> np.ndarray:
        """The trainer's output for a family step's training step ``step`` (caller holds s.lock), taken in order (see
        :meth:`_output`)."""
        if step < 1:
            raise InvalidArgument(f"a training output needs a step >= 1, got {step}")
        if epoch < 0:
            raise InvalidArgument(f"epoch must be >= 0, got {epoch}")
        return self._output(s, step, sample_index, self._features(s, sample_index), "the training forward", epoch)

    def _output(
        self,
        s: PassiveSession,
        step: int,
        sample_index: np.ndarray,
        x: np.ndarray,
        rpc: str,
        epoch: int,
        in_the_clear_of: str | None = None,
    ) -> np.ndarray:
        """The trainer's output for training step ``step`` on feature rows ``x`` (caller holds s.lock), taken in order:
        the next step, or a replay of the last completed one where the family can replay it (with the block as it was
        before that step, so LR's replayed z_p is the same). An output sent in the clear (``in_the_clear_of``: its
        session id) spends the rows' answers first."""
        if step == s.completed_step + 1:
            replay = False
        elif step == s.completed_step and s.trainer.can_replay:
            replay = True
        else:
            raise FailedPrecondition(
                f"{rpc} for step {step} is out of order: the last completed step is {s.completed_step}"
            )
        if in_the_clear_of is not None:
            self._spend_answers(in_the_clear_of, s, step, sample_index)
        if not replay:
            s.forward_index = (step, sample_index.copy())
        return s.trainer.forward(x, replay=replay, epoch=epoch)

    def _spend_answers(self, session_id: str, s: PassiveSession, step: int, sample_index: np.ndarray) -> None:
        """Count one answer for each of ``sample_index``'s (valid, distinct) rows, durably, before anything is
        computed; refuse the whole request, counting nothing, if a row has had embedding_noise's max_answers. The
        noise is fresh per model version, and the active party picks the versions (a tiny learning rate makes many
        nearly equal ones): the bound caps what averaging a row's answers can gain (σ/√max_answers). The same
        training request asked again (a replay, or the step redone at the same weights) was counted already."""
        bound = s.embedding.max_answers
        if bound is None or s.rows is None:
            return
        if step and s.answered is not None and s.answered[0] == step and np.array_equal(s.answered[1], sample_index):
            return
        if s.answers is None:
            s.answers = np.zeros(len(s.rows), dtype=np.uint16)
        spent = s.answers[sample_index] >= bound
        if spent.any():
            raise ResourceExhausted(
                f"sample index {int(sample_index[spent][0])} has had every answer this session allows "
                f"(embedding_noise max_answers = {bound}): its output is not sent in the clear again"
            )
        s.answers[sample_index] += 1
        if step:
            s.answered = (step, sample_index.copy())
        self._save(session_id, s)

    def _output_in_the_clear(
        self, session_id: str, s: PassiveSession, step: int, sample_index: np.ndarray, epoch: int = 0
    ) -> np.ndarray:
        """This party's output in the clear, for a family that sends it so by design (split-NN active-top), on a
        plain session only: step >= 1 trains (in order), step 0 is inference (caller holds s.lock)."""
        if not s.trainer.output_in_the_clear:
            raise FailedPrecondition(f"a {s.family} session sends no output in the clear")
        if s.backend.name != "plain":
            raise FailedPrecondition(
                f"session {session_id!r} runs on {s.backend.name}: an output sent in the clear belongs to a plain "
                "session (split-NN active-top has nothing for HE to protect)"
            )
        if epoch < 0:
            raise InvalidArgument(f"epoch must be >= 0, got {epoch}")
        if step == 0 and s.finished_step != s.completed_step:
            raise FailedPrecondition(
                "no output for inference before training is finished (FinishTraining) or while training again"
            )
        x = self._features(s, sample_index)
        if step == 0:
            self._spend_answers(session_id, s, 0, sample_index)
            return s.trainer.inference_share(x)
        return self._output(s, step, sample_index, x, "PlainForward", epoch, in_the_clear_of=session_id)

    def _training_keys(self, session_id: str, s: PassiveSession, step: int) -> he.Backend:
        """The public key of step ``step``'s epoch: the coordinator rotates training keys every few steps."""
        s.training_keys = epoch_keys(
            s.training_keys, step, s.backend.name, lambda at: self.coordinator.training_context(session_id, at)
        )
        return s.training_keys[2]

    def share_logits(self, session_id: str, query_id: str, sample_index: np.ndarray) -> None:
        """Inference: z_p + r_p for rows of an admitted query (words of Z_2^64), sent to the coordinator and never to
        the active party, so that every released score includes this party's share for exactly these rows. The mask
        r_p (services/crypto/ring_mask.py, under this party's own key) cancels against the owner's share: the
        coordinator, which holds W_p, never sees z_p = X_p W_pᵀ alone. A family whose key holder takes each column
        from its owner's share (a tree's node bits) sends it unmasked: that column is what it learns anyway."""
        require_query_id(query_id)
        s = self.session(session_id)
        x = self._features(s, sample_index)
        (share,) = self._masked_shares(session_id, s, x, [(query_id, sample_index)])
        self.coordinator.submit_share(session_id, query_id, sample_index, share)

    def share_logits_batch(
        self, session_id: str, queries: Sequence[tuple[str, np.ndarray]]
    ) -> list[ServiceError | None]:
        """:meth:`share_logits` for many admitted queries (the owner's batched Predicts): one pass over their rows,
        each query's share under its own mask (the same as alone), all sent to the coordinator in one call. Each
        query's rows are checked on their own (a row may be in two queries, not twice in one); an entry refused here
        or by the coordinator is returned in its place (None: shared) and the others are shared.

        A call's work is bounded before any is done, as ShareLogits' is by the aligned rows (review 13, F2: a row may
        be in many entries): at most BATCH_ENTRIES entries and, in all, as many rows as are aligned or as one Predict
        round carries (one chunk), whichever is more; beyond that the whole call is INVALID_ARGUMENT naming queries."""
        require_entries(len(queries), "queries")
        s = self.session(session_id)
        if s.rows is None:
            raise FailedPrecondition("samples are not aligned yet: run PSI first")
        total, bound = sum(len(index) for _, index in queries), max(len(s.rows), CHUNK_VALUES)
        if total > bound:
            raise InvalidArgument(
                f"queries name {total} rows in all; one call names at most {bound} (the aligned rows, or a round's)"
            )
        outcomes: list[ServiceError | None] = []
        for query_id, index in queries:
            try:
                require_query_id(query_id)
                self._check_index(s, index)
                outcomes.append(None)
            except ServiceError as exc:
                outcomes.append(exc)
        valid = [entry for entry, error in zip(queries, outcomes, strict=True) if error is None]
        if not valid:
            return outcomes
        x = self.data.X[s.rows[np.concatenate([index for _, index in valid])]]
        shares = self._masked_shares(session_id, s, x, valid)
        sent = [(query_id, index, share) for (query_id, index), share in zip(valid, shares, strict=True)]
        kept = iter(self.coordinator.submit_shares(session_id, sent))
        return [next(kept) if error is None else error for error in outcomes]

    def _masked_shares(
        self, session_id: str, s: PassiveSession, x: np.ndarray, queries: Sequence[tuple[str, np.ndarray]]
    ) -> list[np.ndarray]:
        """Each query's share of ``x`` (its rows, the queries' in order), under the query's own mask."""
        if s.share_mask_key is None:
            raise FailedPrecondition(f"session {session_id!r} was joined without a share-mask key: open a new one")
        with s.lock:
            if s.finished_step is None or s.finished_step != s.completed_step:
                raise FailedPrecondition(
                    "no inference share before training is finished (FinishTraining) or while training again"
                )
            z = s.trainer.inference_share(x)
            step = s.completed_step
        words = ring_mask.encode(z)  # clipped, never refused on its values (rule 4)
        masked = families.masks_shares(s.family)
        shares, start = [], 0
        for query_id, index in queries:
            share = words[start : start + len(index)]
            start += len(index)
            if masked:
                share += ring_mask.share_mask(s.share_mask_key, session_id, step, query_id, index, z.shape[1])
            shares.append(share)
        return shares

    def backward(
        self,
        session_id: str,
        step: int,
        sample_index: np.ndarray,
        delta: he.EncryptedMatrix | np.ndarray,
        delta_digest: bytes,
    ) -> None:
        """Apply step ``step``'s update once; a repeated Backward for a completed step is acknowledged.

        ``delta_digest`` (of δ's ciphertexts as received) keys this step's masks with the step number: the same
        δ gives the same products, another δ fresh masks.
        """
        s = self.session(session_id)
        with s.lock:
            if step == s.completed_step and step > 0:
                return  # a retry after our reply was lost, or a replayed step: already applied
            if step != s.completed_step + 1:
                raise FailedPrecondition(
                    f"Backward for step {step} does not follow its forward: the last completed step is "
                    f"{s.completed_step}"
                )
            if (
                s.forward_index is not None
                and s.forward_index[0] == step
                and not np.array_equal(s.forward_index[1], sample_index)
            ):
                raise InvalidArgument(f"step {step}: sample_index differs from the forward of that step")
            x = self._features(s, sample_index)
            ctx = families.PassiveContext(
                session_id=session_id,
                step=step,
                backend=s.backend,
                mask_key=s.mask_key,
                key_holder=self.coordinator,
                training_keys=lambda: self._training_keys(session_id, s, step),
                emit=lambda kind, source, **fields: self._emit(kind, session_id, source, **fields),
                sample_ids=lambda index: self._sample_ids(s, index),
                owner=s.owner,
                index=sample_index,
            )
            s.trainer.backward(ctx, x, delta, delta_digest)
            s.completed_step = step
            s.trained_rows.update(sample_index, limit=len(s.rows))
            s.forward_index = None
            self._save(session_id, s)  # acknowledged only once durable

    def family_call(self, session_id: str, caller: str, name: str, **payload: Any) -> Any:
        """A model family's own message ``name`` (its ModelFamily.steps["passive"]), from the session's owner (role
        "active") or this party's coordinator, as the step names them, run on the session's trainer under the
        session lock and checkpointed afterwards; what the step defers (a message to a peer, which may be waiting on
        this party meanwhile) runs once the lock is released."""
        if caller == self.coordinator_id:
            s, role = self.session(session_id), COORDINATOR
        else:
            s, role = self.owned(session_id, caller), ACTIVE
        step = declared_step(session_id, s, PASSIVE, name, role)
        deferred: list[Callable[[], Any]] = []

        def completed(rows: np.ndarray, at: int) -> None:
            s.trained_rows.update(rows, limit=len(s.rows))
            s.completed_step = at

        ctx = families.PassiveContext(
            session_id=session_id,
            step=s.completed_step,
            backend=s.backend,
            mask_key=s.mask_key,
            key_holder=self.coordinator,
            training_keys=lambda: self._training_keys(session_id, s, s.completed_step + 1),
            features=lambda index: self._features(s, index),
            completed=completed,
            output_in_the_clear=lambda at, rows, epoch: self._output_in_the_clear(session_id, s, at, rows, epoch),
            training_output=lambda at, rows, epoch: self._training_step_output(s, at, rows, epoch),
            share_mask_key=s.share_mask_key or b"",
            defer=deferred.append,
            locked=lambda later: self._locked(session_id, s, later),
            aligned_rows=0 if s.rows is None else len(s.rows),
            shard=lambda: self.data.X,
            min_training_rows=self.min_training_rows,
            min_node_rows=self.min_node_rows,
            emit=lambda kind, source, **fields: self._emit(kind, session_id, source, **fields),
            sample_ids=lambda index: self._sample_ids(s, index),
            owner=s.owner,
        )
        with s.lock:
            try:
                answer = step.run(s.trainer, ctx, **payload)
            finally:
                if step.checkpoint:
                    self._save(session_id, s)
        for later in deferred:
            later()
        return answer

    def _locked(self, session_id: str, s: PassiveSession, later: Callable[[], Any]) -> None:
        """A deferred family call's follow-up, under the session lock and checkpointed afterwards; nothing if the
        session was closed meanwhile (its checkpoint would come back, and a restart would restore it: review 18)."""
        with s.lock:
            if not self._current(session_id, s):
                return
            try:
                later()
            finally:
                self._save(session_id, s)

    def weights(self, session_id: str) -> np.ndarray:
        return self._block(self.session(session_id))

    def releasable(self, session_id: str) -> dict[str, np.ndarray]:
        """The named tensors the family lets the coordinator pull after training (split-NN: the bottom)."""
        s = self.session(session_id)
        if not getattr(families.get(s.family), "releases_passive_tensors", False):
            raise FailedPrecondition(f"a {s.family} session releases no named tensors of this party")
        with s.lock:
            return s.trainer.releasable()

    @staticmethod
    def _block(s: PassiveSession) -> np.ndarray:
        """The weight block the coordinator pulls and the parameter chain distorts."""
        released = s.trainer.releasable()
        if "weights" not in released:
            raise FailedPrecondition(f"a {s.family} session releases no weight block of this party")
        return released["weights"]

    def trained(self, session_id: str) -> np.ndarray:
        """The rows our block was trained on, for the coordinator's FinishTraining: the model is finished now."""
        s = self.session(session_id)
        with s.lock:
            if s.finished_step != s.completed_step:
                s.finished_step = s.completed_step
                self._save(session_id, s)
                self._emit_own_model(session_id, s)
            return s.trained_rows.array()

    def _emit_own_model(self, session_id: str, s: PassiveSession) -> None:
        """To this party's plugins, once a model is finished: its own training rows and what its trained model makes of
        them (LR z_p, split-NN h_p): what a curious passive party holds for model completion (Fu et al.)."""
        if not self.hub.active:
            return
        rows = s.trained_rows.array()
        x = self._features(s, rows)
        ids = tuple(self._sample_ids(s, rows))
        self._emit(plugins.TRAINING_DATA, session_id, self.party_id, sample_ids=ids, arrays={"features": x})
        try:
            outputs = s.trainer.inference_share(x)
        except FailedPrecondition:  # a family whose party has no output of its own
            return
        self._emit(plugins.OWN_MODEL, session_id, self.party_id, sample_ids=ids, arrays={"outputs": outputs})

    def aligned(self, session_id: str) -> int:
        """This party's aligned rows (0 before PSI): the coordinator bounds every family's training rows by them."""
        s = self.session(session_id)
        return 0 if s.rows is None else len(s.rows)

    def _stats(self, s: PassiveSession) -> param_defenses.DataStats:
        """Statistics of this party's own aligned rows; they are used here and never leave."""
        if s.rows is None:
            raise FailedPrecondition("samples are not aligned yet: run PSI first")
        try:
            return param_defenses.DataStats.from_features(self.data.X[s.rows])
        except ValueError as exc:
            raise FailedPrecondition(f"parameter defenses need min-max scaled features: {exc}") from exc

    def disclose(self, session_id: str, specs: list[str]) -> list[tuple[str, param_defenses.Distorted]]:
        """Run the parameter-release steps on the true block, in order, here at the passive party."""
        s = self.session(session_id)
        try:
            steps = [param_defenses.make_distortion(spec) for spec in specs]
        except ValueError as exc:
            raise InvalidArgument(f"parameter-release steps: {exc}") from exc
        stats = self._stats(s) if any(step.needs_stats for step in steps) else None
        rng = entropy.os_entropy()  # secret draws (ε′, the sign of R) must be unpredictable
        block: np.ndarray | None = self._block(s)
        results = []
        for step in steps:
            if block is None:
                break  # withheld: nothing left to distort
            try:
                result = step.distort(block, stats, s.n_classes, rng)
            except ValueError as exc:
                raise FailedPrecondition(f"{step.name}: {exc}") from exc
            results.append((step.name, result))
            block = result.disclosed
        return results

    def forecast(self, session_id: str, specs: list[str], warn_fraction: float) -> dict:
        """Forecast attack MSE of disclosing this block through ``specs`` (nothing is released)."""
        s = self.session(session_id)
        steps = self.disclose(session_id, specs)
        final = None
        if steps:
            offsets = [r.bias_offset for _, r in steps if r.bias_offset is not None]
            final = param_defenses.Distorted(
                steps[-1][1].disclosed,
                bias_offset=np.sum(offsets, axis=0) if offsets else None,
                undoable=all(r.undoable for _, r in steps),  # undone step by step, last to first
            )
        try:
            return param_defenses.forecast(
                self._block(s),
                self._stats(s),
                s.n_classes,
                final,
                warn_fraction=warn_fraction or param_defenses.DEFAULT_WARN_FRACTION,
            )
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from exc

    def close(self, session_id: str) -> None:
        """Under the session's lock, so that no step or deferred follow-up checkpoints it after its files are gone."""
        try:
            lock = self.sessions[session_id].lock
        except KeyError:  # unknown, or set aside at start-up: nothing runs on it
            lock = contextlib.nullcontext()
        with lock:
            closed = self.sessions.close(session_id)
        if closed is not None and hasattr(closed.trainer, "close"):  # its worker processes (a tree's product pool)
            closed.trainer.close()
