"""Active party: labels + its own features; drives PSI, training and inference for its operator.

Plain-Python engine (:class:`ActiveParty`); its gRPC servicer is services/rpc/active.py. Everything the party
receives is offered to its plugins (``services/plugins/__init__.py``).
"""

from __future__ import annotations

import functools
import hashlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, ClassVar, TypeVar

import numpy as np

from vflsec.services import plugins
from vflsec.services.common import BATCH_ENTRIES, CHUNK_VALUES
from vflsec.services.config import PREDICT_BATCH_ROWS, PREDICT_WINDOW_MS
from vflsec.services.crypto import entropy, he, oprf, psi, ring_mask, spill
from vflsec.services.data.datasets import IdIndex, PartyData
from vflsec.services.defenses.gradients import GradientChain
from vflsec.services.defenses.release import ReleasedParams, ReleasedScores, StepDescription
from vflsec.services.engines import checkpoint
from vflsec.services.engines.batching import Batcher
from vflsec.services.engines.sessions import EpochKeys, SessionTable, epoch_keys
from vflsec.services.errors import FailedPrecondition, InvalidArgument, NotFound, PeerFailed, ServiceError
from vflsec.services.models import family as families

if TYPE_CHECKING:  # services/app.py hands the links in: importing the engine loads no gRPC or protobuf
    from vflsec.services.transport.links import CoordinatorClient, PassiveClient

T = TypeVar("T")

PREDICT_CHUNK_VALUES = CHUNK_VALUES  # share entries per chunk of a query (bounds message sizes: 256 KB of words)
# Requests one Predict round carries at most (besides [limits] predict_batch_rows): the entries every batched call
# may carry, well under the coordinator's open queries per session (MAX_OPEN_QUERIES, 256), so that the queries of
# overlapping rounds do not lapse one another.
PREDICT_BATCH_REQUESTS = BATCH_ENTRIES
# Predict rounds of a session running at once: while they run, the next round gathers (services/engines/batching.py).
# One: under load a round carries 14 requests instead of 9 with two, and each round costs every party its calls and
# the coordinator its ledger write; about 20 % less server CPU per request, throughput the same (docs/performance.md).
PREDICT_ROUNDS = 1


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
class AlignProgress:
    """Work of an alignment done so far, of all it takes (a display: the passive parties' sizes are the ones they
    announced when they joined), and the stage it is in. ECDH counts curve operations; OPRF, U's rows sent and the
    values received, per passive party."""

    done: int
    total: int
    # "blinding" (ours, ECDH), "exchanging" (each passive party's), "re-blinding" (theirs, ECDH), "finishing"
    stage: str


class _Tracker:
    """Adds up the chunks done by several threads (one per passive party) and reports each new total."""

    def __init__(self, total: int, report: Callable[[AlignProgress], None] | None) -> None:
        self._done, self._total, self._report, self._lock = 0, total, report, threading.Lock()

    def add(self, stage: str) -> Callable[[int], None]:
        def count(n: int) -> None:
            if self._report is not None:
                with self._lock:
                    self._done += n
                    self._report(AlignProgress(min(self._done, self._total), self._total, stage))

        return count


_INDEX_BLOCK = 1 << 20  # common indices written at once


class CommonIndex:
    """Own sample ID -> common index, for the aligned ``rows``: the party's :class:`datasets.IdIndex` (one for all
    its sessions, sorted at the first lookup) and a row -> common index array, no Python object per row (a dict of a
    million IDs took about 150 MB)."""

    def __init__(self, index: IdIndex, rows: np.ndarray) -> None:
        self._index = index  # the party's IDs are unique (PartyData checks)
        self._common = np.full(len(index.ids), -1, dtype=np.int32)  # active row -> common index, -1: not aligned
        for start in range(0, len(rows), _INDEX_BLOCK):  # no arange of every common index beside them
            block = rows[start : start + _INDEX_BLOCK]
            self._common[block] = np.arange(start, start + len(block), dtype=np.int32)

    def lookup(self, sample_ids: list[str] | np.ndarray) -> np.ndarray:
        """The common index of each ID; a KeyError with the first ID that is not among the aligned samples."""
        wanted = np.asarray(sample_ids, dtype=str).reshape(-1)
        at, found = self._index.find(wanted)
        index = np.where(found, self._common[at], -1).astype(np.int64)
        missing = np.flatnonzero(index < 0)
        if missing.size:
            raise KeyError(str(wanted[missing[0]]))
        return index

    def __getitem__(self, sample_id: str) -> int:
        return int(self.lookup([sample_id])[0])


@dataclass
class ActiveSession:
    FIXED_STATE: ClassVar[tuple[str, ...]] = ("context", "rows", "run_order")  # set once (checkpoint.py)

    session_id: str
    backend: he.Backend
    public_context: bytes
    n_classes: int
    training: families.TrainingConfig
    family: str  # the model family (services/models/family.py), chosen at creation
    trainer: families.ActiveTrainer  # the family's state and maths at this party
    passive_features: dict[str, int]
    score_release: list[StepDescription]  # the coordinator's chains, as it announced them (public)
    param_release: list[StepDescription]
    rng: np.random.Generator  # batch order (seeded: runs are reproducible)
    mask_key: bytes  # this session's mask stream (AES-CTR keyed from os.urandom, see services/crypto/entropy.py)
    # Per passive party, the key of its zero-sum masks (inference shares and split-NN training embeddings:
    # services/crypto/ring_mask.py), the party's own draw, received at JoinSession; empty in a checkpoint written
    # before share masks existed (such a session cannot predict).
    share_mask_keys: dict[str, bytes]
    rows: np.ndarray | None = None  # common index -> active row (after PSI, once every passive party took it)
    aligning: bool = False  # an Align of this session is running its exchange (in this process; not checkpointed)
    # The intersection, checkpointed before any passive party is told its positions and kept until every one
    # took them: a PsiFinish that failed at one party is sent again by the next Align (same positions).
    pending: psi.Alignment | None = None
    index_of: CommonIndex | None = None  # own sample ID -> common index
    passive_rows: dict[str, int] = field(default_factory=dict)  # the sizes announced at JoinSession (progress)
    step: int = 0
    trained: bool = False
    run: TrainingRun | None = None
    training_keys: EpochKeys | None = None  # the training-key epoch last used (fetched again when a step leaves it)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # split-NN coordinator-top: the session's gradient defenses (its settings' specs), drawing from our OS entropy
    gradient_defense: GradientChain = field(default_factory=GradientChain)

    def to_state(self) -> tuple[dict[str, np.ndarray], dict]:
        trainer_arrays, trainer_meta = self.trainer.to_state()
        arrays = {
            **trainer_arrays,
            **self.gradient_defense.state(),
            "context": checkpoint.from_bytes(self.public_context),
            "mask_key": checkpoint.from_bytes(self.mask_key),
            **{f"share_mask_key/{p}": checkpoint.from_bytes(key) for p, key in self.share_mask_keys.items()},
        }
        if self.rows is not None:
            arrays["rows"] = self.rows
        if self.pending is not None:
            arrays["pending_rows"] = self.pending.active_rows
            for party, positions in zip(self.passive_features, self.pending.passive_positions, strict=True):
                arrays[f"pending_positions/{party}"] = positions
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
            **trainer_meta,
            "family": self.family,
            "backend": self.backend.name,
            "n_classes": self.n_classes,
            "step": self.step,
            "trained": self.trained,
            "training": [t.optimizer, t.learning_rate, t.l2, t.batch_size, t.seed],
            "passive_features": self.passive_features,
            "rng": self.rng.bit_generator.state,
            "release": [
                [[name, dict(params)] for name, params in chain] for chain in (self.score_release, self.param_release)
            ],
            "run": run,
        }
        return arrays, meta

    @classmethod
    def from_state(
        cls, session_id: str, arrays: dict[str, np.ndarray], meta: dict, ids: IdIndex | Sequence[str] | np.ndarray
    ) -> ActiveSession:
        context = checkpoint.as_bytes(arrays["context"])
        training = families.TrainingConfig(*meta["training"])
        family = meta.get("family", families.DEFAULT)  # a checkpoint from before the family layer is LR's
        rng = np.random.default_rng()
        rng.bit_generator.state = meta["rng"]
        score_release, param_release = ([(name, params) for name, params in chain] for chain in meta["release"])
        s = cls(
            session_id=session_id,
            backend=he.open_public(meta["backend"], context),
            public_context=context,
            n_classes=meta["n_classes"],
            training=training,
            family=family,
            trainer=families.get(family).restore_active((arrays, meta)),
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
        )  # no exchange survives a restart: one interrupted before the intersection is run again by Align
        if "rows" in arrays:
            s.rows = np.array(arrays["rows"])
            s.index_of = CommonIndex(ids if isinstance(ids, IdIndex) else IdIndex(ids), s.rows)
        if "pending_rows" in arrays:
            s.pending = psi.Alignment(
                np.array(arrays["pending_rows"]),
                tuple(np.array(arrays[f"pending_positions/{party}"]) for party in s.passive_features),
            )
        if meta["run"] is not None:
            s.run = TrainingRun(order=arrays.get("run_order"), **meta["run"])
        s.gradient_defense = gradient_chain(getattr(s.trainer, "settings", None))
        s.gradient_defense.load_state(arrays)
        return s


def gradient_chain(settings: object) -> GradientChain:
    """The gradient defenses a session's settings name (none for a family without them); InvalidArgument naming
    the field and the step when a spec is bad."""
    try:
        return GradientChain.from_specs(getattr(settings, "gradient_defense", ()))
    except ValueError as exc:
        raise InvalidArgument(f"SplitNnModel.gradient_defense: {exc}") from exc


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
        psi_max_ratio: float = psi.MAX_RATIO,
        psi_ratio_floor: int = psi.RATIO_FLOOR,
        predict_window_ms: float = PREDICT_WINDOW_MS,
        predict_batch_rows: int = PREDICT_BATCH_ROWS,
        psi_protocol: str = psi.PROTOCOLS[0],
    ) -> None:
        if data.y is None:
            raise ValueError("the active party's data file needs a label column")
        if not passives:
            raise ValueError("an active party needs at least one passive party")
        self.party_id = party_id
        # Its OPRF bins, outputs and the passive values being matched wait on disk (spill.Parts, spill.Ranges); a kill
        # leaves them there, so they go at start-up (a live exchange's folders are locked and stay).
        spill.sweep()
        self.data = data
        self._id_index: tuple[object, IdIndex | None] = (None, None)  # (of which ID column, its index): id_index
        self._lock_index = threading.Lock()
        self.class_names = class_names
        self.coordinator = coordinator
        self.passives = dict(passives)
        self.hub = hub or plugins.PluginHub()
        self.state = state or checkpoint.StateDir(None)
        self.psi_caps = psi.Caps(psi_max_ids, psi_max_ratio, psi_ratio_floor)  # on a passive party's ID count
        if psi_protocol not in psi.PROTOCOLS:
            raise ValueError(f"psi_protocol must be one of {', '.join(psi.PROTOCOLS)}, got {psi_protocol!r}")
        self.psi_protocol = psi_protocol
        self.sessions = SessionTable(
            self.state, lambda sid, arrays, meta: ActiveSession.from_state(sid, arrays, meta, self.id_index())
        )
        # Calls to peers fan out here: Predict rounds overlap, and one waiting for a free thread waits for nothing.
        self._pool = ThreadPoolExecutor(max_workers=4 * (len(self.passives) + 1), thread_name_prefix="peer")
        if predict_window_ms < 0 or predict_batch_rows < 1:
            raise ValueError(f"invalid Predict batching: {predict_window_ms=}, {predict_batch_rows=}")
        self.predict_window = predict_window_ms / 1e3
        self.predict_batch_rows = predict_batch_rows
        self._batchers: dict[str, Batcher] = {}
        self._batchers_lock = threading.Lock()

    @property
    def n_classes(self) -> int:
        return max(len(self.class_names), 2)

    def session(self, session_id: str) -> ActiveSession:
        return self.sessions.get(session_id)

    def _save(self, s: ActiveSession) -> None:
        self.sessions.save(s.session_id, s)

    def _emit(self, kind: str, s: ActiveSession, source: str, **fields: object) -> None:
        if self.hub.active:
            self.hub.emit(plugins.Observation(kind=kind, session_id=s.session_id, source=source, **fields))

    def _each_passive(self, fn: Callable[[str, PassiveClient], T]) -> list[T]:
        """Run ``fn(party, client)`` for every passive party concurrently; results in party order. Every call has
        ended before this returns or raises (the first failure in party order), so no call to a peer is still in
        flight when the caller reports the error: a retry cannot race the call that failed beside it."""
        futures = [self._pool.submit(fn, party, client) for party, client in self.passives.items()]
        wait(futures)
        return [f.result() for f in futures]

    # --- session ---
    def create_session(
        self,
        session_id: str,
        backend_name: str,
        training: families.TrainingConfig,
        family_name: str = families.DEFAULT,
        values: Mapping[str, object] | None = None,
    ) -> ActiveSession:
        """Open the session at the coordinator and join every passive party to it. ``values`` are the family's
        settings as plain values (default: the TrainingConfig's, which are LR's); each passive party gets them
        with its position in the session (1..P), the coordinator with position 0."""
        session_id = session_id or uuid.uuid4().hex
        SessionTable.check_new(session_id)
        values = dict(training.optimizer_values() if values is None else values)
        try:
            family = families.get(family_name)
            settings = family.settings(values)
        except ValueError as exc:
            raise InvalidArgument(f"training: {exc}") from exc
        gradient_defense = gradient_chain(settings)  # before any party joins: a bad spec opens nothing
        if training.batch_size < 0:
            raise InvalidArgument(f"batch_size must be positive, got {training.batch_size}")
        d = self.data.X.shape[1]
        with self.sessions.lock:
            self.sessions.check_absent(session_id)
            reply = self.coordinator.open_session(
                session_id, backend_name, self.n_classes, list(self.passives), family.name, training, values
            )
            backend = he.open_public(backend_name, reply.public_context)
            position = {party: p for p, party in enumerate(self.passives, start=1)}
            joined = self._each_passive(
                lambda party, client: client.join(
                    session_id,
                    backend_name,
                    self.n_classes,
                    training,
                    family.name,
                    {**values, "party": position[party]},
                )
            )
            widths = [
                family.block_width(d, active=True),
                *(family.block_width(r.n_features, active=False) for r in joined),
            ]
            smallest = family.min_batch_size(widths)
            batch_size = training.batch_size or family.default_batch_size(widths)
            passive_features = [r.n_features for r in joined]
            announced = [r.output_width for r in joined]
            if any(announced):  # each passive party's own output width (split-NN active-top), for our top model
                try:
                    settings = family.settings({**values, "passive_widths": announced})
                    trainer = family.new_active(self.n_classes, d, settings, passive_features)
                except ValueError as exc:
                    self._close_joined(session_id)
                    raise FailedPrecondition(f"the passive parties' announced output widths: {exc}") from exc
            else:
                trainer = family.new_active(self.n_classes, d, settings, passive_features)
            if batch_size < smallest:
                self._close_joined(session_id)
                raise InvalidArgument(
                    f"batch_size {batch_size} is below the minimum batch {smallest} for these "
                    f"parties (2 x the widest block, {max(widths)} columns); the smallest accepted value is "
                    f"{smallest}"
                )
            training = replace(training, batch_size=batch_size)
            s = ActiveSession(
                session_id=session_id,
                backend=backend,
                public_context=reply.public_context,
                n_classes=self.n_classes,
                training=training,
                family=family.name,
                trainer=trainer,
                passive_features={party: r.n_features for party, r in zip(self.passives, joined, strict=True)},
                passive_rows={party: r.n_rows for party, r in zip(self.passives, joined, strict=True)},
                score_release=reply.score_release,
                param_release=reply.param_release,
                rng=np.random.default_rng(training.seed),  # batch order only: the seed steers no secret draw
                mask_key=entropy.new_key(),
                share_mask_keys={party: r.share_mask_key for party, r in zip(self.passives, joined, strict=True)},
                gradient_defense=gradient_defense,
            )
            self.sessions.add(session_id, s)
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
                "family": s.family,
                "settings": settings.to_dict() if isinstance(settings, families.DictForm) else {},
                "class_names": self.class_names,
                "active_features": list(self.data.columns),
                "passive_features": s.passive_features,
                "score_release": [name for name, _ in s.score_release],
                "param_release": [name for name, _ in s.param_release],
                # Each passive party's announced embedding defenses (split-NN active-top; empty elsewhere).
                "embedding_release": {
                    party: [[name, dict(params)] for name, params in r.embedding_release]
                    for party, r in zip(self.passives, joined, strict=True)
                },
            },
        )
        return s

    def _close_joined(self, session_id: str) -> None:
        """Undo a session refused after every party joined it."""
        self._each_passive(lambda party, client: client.close(session_id))
        self.coordinator.close(session_id)

    def id_index(self) -> IdIndex:
        """The operator's sample ID -> row, one for every session of the party's data (sorted when first looked up)."""
        with self._lock_index:
            ids, index = self._id_index
            if ids is not self.data.ids or index is None:
                self._id_index = self.data.ids, IdIndex(self.data.ids)
            return self._id_index[1]

    # --- alignment ---
    def align(self, session_id: str, progress: Callable[[AlignProgress], None] | None = None) -> np.ndarray:
        """PSI with every passive party; returns the aligned rows (common index -> own row). One Align runs at a
        time; one that failed anywhere before the intersection was fixed (an empty intersection, a refusal or a
        cut at any passive party, a restart) leaves nothing and the next Align exchanges again, with fresh keys on
        both sides. The intersection is checkpointed before any passive party hears of it, and the session is
        aligned only once every passive party has taken its positions: a PsiFinish that failed anywhere is sent
        again, with the same positions, by the next Align (docs/protocol.md, "Alignment"). Align on an aligned
        session returns its rows again without an exchange, so an operator whose reply was cut or too large asks
        again. ``progress`` hears of each chunk of curve work done."""
        s = self.session(session_id)
        own_ids = self.data.ids  # an array: no Python object per row during the exchange
        with s.lock:
            if s.rows is not None:  # aligned: the recorded rows again, no second exchange (a lost reply loses nothing)
                return s.rows
            if s.pending is None and s.aligning:
                raise FailedPrecondition(f"session {session_id!r} is being aligned by another Align call")
            pending = s.pending
            if pending is None:
                self._check_own_ids(own_ids)
                s.aligning = True
        passive_rows = [s.passive_rows.get(party, len(own_ids)) for party in self.passives]
        if self.psi_protocol == "oprf":  # U's rows sent and the values received, per passive party
            total = sum(oprf.bins(len(own_ids)) + oprf.CHECKS + oprf.HASHES * n for n in passive_rows)
        else:
            total = len(own_ids) + sum(len(own_ids) + 2 * n for n in passive_rows)
        tracker = _Tracker(total, progress)
        if pending is None:
            try:
                intersect = self._intersect_oprf if self.psi_protocol == "oprf" else self._intersect
                pending = intersect(s, own_ids, tracker)
            except BaseException:
                # Nothing is aligned, so the session may try again (a passive party that answered takes a new
                # exchange until PsiFinish fixed its rows; one that refused or was cut kept nothing).
                with s.lock:
                    s.aligning = False
                raise
            tracker.add("finishing")(0)
        else:  # an earlier Align did the curve work
            tracker.add("finishing")(total)
        self._finish(s, pending)
        return s.rows

    def _check_own_ids(self, own_ids: np.ndarray) -> None:
        if not len(own_ids):
            raise FailedPrecondition(f"PSI: {self.party_id} holds no sample IDs")
        if len(own_ids) > self.psi_caps.max_ids:
            raise FailedPrecondition(
                f"PSI: this party holds {len(own_ids)} sample IDs, over the cap of {self.psi_caps.max_ids} "
                "([limits] psi_max_ids; every passive party must accept as many)"
            )

    def _intersect(self, s: ActiveSession, own_ids: np.ndarray, tracker: _Tracker) -> psi.Alignment:
        """The exchange with every passive party and the intersection, checkpointed as the session's pending
        alignment."""
        key, salt = psi.PsiKey(), psi.new_salt()
        check = self.psi_caps.checker(len(own_ids))
        try:
            blinded = key.blind(own_ids, salt, progress=tracker.add("blinding"))
        except ValueError as exc:  # duplicate or non-string ids: nothing was sent
            raise FailedPrecondition(f"PSI: {self.party_id}'s own IDs: {exc}") from exc
        exchanging = tracker.add("exchanging")
        replies = self._each_passive(
            lambda party, client, sent=blinded: client.psi_exchange(s.session_id, salt, sent, check, exchanging)
        )
        del blinded  # every passive party has it: 32 MB at 1M IDs, not held through the intersection
        sizes = [len(own) for _, own in replies]
        for party, size in zip(self.passives, sizes, strict=True):
            if not size:
                raise FailedPrecondition(f"PSI: {party} holds no sample IDs")
        doubles, owns = [double for double, _ in replies], [own for _, own in replies]
        del replies
        try:
            alignment = psi.active_align(
                key,
                doubles,
                (owns.pop(0) for _ in range(len(owns))),  # each received list is freed once re-blinded
                names=list(self.passives),
                progress=tracker.add("re-blinding"),
            )
        except ValueError as exc:
            raise InvalidArgument(f"PSI: {exc}") from exc
        del doubles
        if alignment.size == 0:
            raise FailedPrecondition(
                f"PSI: no sample ID is common to all of {self.party_id} ({len(own_ids)} IDs), "
                + ", ".join(f"{party} ({size} IDs)" for party, size in zip(self.passives, sizes, strict=True))
                + ": check each party's ID column and its spelling (e.g. '7' vs '007')"
            )
        with s.lock:
            s.pending = alignment
            self._save(s)
        return alignment

    def _intersect_oprf(self, s: ActiveSession, own_ids: np.ndarray, tracker: _Tracker) -> psi.Alignment:
        """:meth:`_intersect` by OT extension (services/crypto/oprf.py): one OPRF exchange with every passive party
        (concurrently), then the same intersection of their values with ours."""
        salt = psi.new_salt()
        try:
            hashed = oprf.hash_column(own_ids, salt)  # on disk, read a block at a time by each step below
        except ValueError as exc:  # non-string ids: nothing was sent
            raise FailedPrecondition(f"PSI: {self.party_id}'s own IDs: {exc}") from exc
        try:
            try:
                psi.require_unique_by_range(hashed, "ids")  # on disk
            except ValueError as exc:  # duplicate ids: nothing was sent
                raise FailedPrecondition(f"PSI: {self.party_id}'s own IDs: {exc}") from exc
            m = oprf.bins(len(own_ids))
            try:
                hash_key, table = oprf.place(hashed, m)  # redrawn here until every ID has a bin: nothing was sent yet
            except oprf.CuckooFailure as exc:  # 16 keys failing in a row: not seen at any size; named, not INTERNAL
                raise FailedPrecondition(
                    f"PSI: {self.party_id} could not place its IDs into OPRF bins ({exc}); nothing was sent: Align "
                    'again, or align by [psi] protocol = "ecdh"'
                ) from exc
            bins = oprf.Bins(table, hashed)  # on disk for the exchanges: h(x) and the table are not kept
        finally:
            hashed.close()
        del table
        try:
            return self._exchange_oprf(s, own_ids, tracker, salt, hash_key, bins)
        finally:
            bins.close()

    def _exchange_oprf(
        self, s: ActiveSession, own_ids: np.ndarray, tracker: _Tracker, salt: bytes, hash_key: bytes, bins: oprf.Bins
    ) -> psi.Alignment:
        """:meth:`_intersect_oprf` from our bins on: one exchange with every passive party, concurrently."""
        m = bins.m

        def check(n: int) -> None:  # a passive party sends exactly 3 values per own ID, its count within our caps
            if n % oprf.HASHES:
                raise ValueError(f"{n} values announced, not {oprf.HASHES} per ID")
            self.psi_caps.check(n // oprf.HASHES, len(own_ids))

        exchanging = tracker.add("exchanging")

        def exchange(party: str, client: PassiveClient) -> tuple[int, tuple[np.ndarray, np.ndarray]]:
            """(the party's ID count, its match against ours): our outputs and the party's values wait on disk by
            value range and are matched range by range once all came (psi.RangeMatch), so only 5 bytes per own ID
            are kept of them; both are removed however the exchange ends."""
            base_ot, receivers, matches, sent = oprf.BaseOtSender(), [], [], [0]

            def u_rows(code_seed: bytes, answers: list[bytes]) -> Iterator[bytes]:
                k0, k1 = base_ot.keys(answers)
                receivers.append(oprf.Receiver(bins, k0, k1, code_seed))
                matches.clear()
                return counted(receivers[-1].u_chunks())

            def counted(chunks: Iterator[bytes]) -> Iterator[bytes]:
                for chunk in chunks:
                    sent[0] += 1  # counted before the call takes it: the party cannot have it sooner
                    yield chunk

            def receiver() -> oprf.Receiver:
                """Ours, once every U chunk was sent: an output is made with its chunk, so values that come sooner
                would meet outputs never made."""
                if sent[0] != oprf.row_chunks(m):
                    raise ValueError(
                        f"{party} answered before taking U ({sent[0]} of {oprf.row_chunks(m)} U chunks sent)"
                    )
                return receivers[-1]

            def take(values: np.ndarray) -> None:  # the party sends its values once it has all of U: ours are done
                if not matches:
                    matches.append(receiver().match(party))
                matches[0].add(values)

            hello = oprf.Hello(s.session_id, salt, hash_key, m, base_ot.point)

            def prove(challenge: bytes) -> oprf.Proof:  # the consistency check's answer, once U was all sent
                if sent[0] != oprf.row_chunks(m):
                    raise ValueError(f"a challenge before U's last chunk ({sent[0]} of {oprf.row_chunks(m)} sent)")
                return receivers[-1].proof(challenge)

            try:
                n = client.psi_oprf(hello, u_rows, prove, check, take, exchanging)
                try:
                    if not matches:  # an empty list: nothing of ours matched
                        matches.append(receiver().match(party))
                    return n // oprf.HASHES, matches[0].result()
                except ValueError as exc:
                    raise InvalidArgument(f"PSI: {party}'s reply: {exc}") from exc
            finally:
                for done in matches + receivers:
                    done.close()

        replies = self._each_passive(exchange)
        alignment = psi.combine(matched for _, matched in replies)
        if alignment.size == 0:
            raise FailedPrecondition(
                f"PSI: no sample ID is common to all of {self.party_id} ({len(own_ids)} IDs), "
                + ", ".join(f"{party} ({n} IDs)" for party, (n, _) in zip(self.passives, replies, strict=True))
                + ": check each party's ID column and its spelling (e.g. '7' vs '007')"
            )
        with s.lock:
            s.pending = alignment
            self._save(s)
        return alignment

    def _finish(self, s: ActiveSession, alignment: psi.Alignment) -> None:
        """Every passive party's positions, concurrently; the session is aligned only if every one took them."""
        positions = dict(zip(self.passives, alignment.passive_positions, strict=True))
        futures = {
            party: self._pool.submit(client.psi_finish, s.session_id, positions[party])
            for party, client in self.passives.items()
        }
        failed = {}
        for party, future in futures.items():
            try:
                future.result()
            except Exception as exc:  # every party answers before the failures are reported
                failed[party] = exc
        if failed:
            # A passive party that refuses the positions (INVALID_ARGUMENT) has voided its exchange (rule 4: one
            # refusal for every bad list): sending them again cannot succeed, so the next Align exchanges anew.
            void = [p for p, exc in failed.items() if isinstance(exc, PeerFailed) and exc.code == "INVALID_ARGUMENT"]
            if void:
                with s.lock:
                    s.pending, s.aligning = None, False
                    self._save(s)
            raise FailedPrecondition(
                "PSI: PsiFinish failed at "
                + "; ".join(f"{party}: {exc}" for party, exc in failed.items())
                + f". No party is aligned for use: {s.session_id!r} "
                + (
                    f"drops its intersection ({', '.join(void)} voided the exchange), and Align runs a new exchange "
                    "(a party that took its positions refuses one: then open a new session)"
                    if void
                    else "keeps its intersection, and Align sends the same positions again to finish it"
                )
            )
        with s.lock:
            s.rows, s.pending = alignment.active_rows, None
            s.index_of = CommonIndex(self.id_index(), s.rows)
            self._save(s)

    def _indices(self, s: ActiveSession, sample_ids: list[str]) -> np.ndarray:
        if s.rows is None:
            raise FailedPrecondition("samples are not aligned yet: call Align first")
        if not sample_ids:
            raise InvalidArgument("sample_ids is empty")
        try:
            return s.index_of.lookup(sample_ids)
        except KeyError as exc:
            raise NotFound(f"sample ID {exc.args[0]!r} is not among the aligned samples") from None

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
                smallest = families.get(s.family).min_batch_size(self._widths(s).values())
                batches = families.batches(run.order, s.training.batch_size, smallest)
                while run.batch < len(batches):
                    step = s.step + 1
                    self._train_step(s, step, index[batches[run.batch]], run.epoch - 1)
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
        """Every party's gradient block width, as the family counts it (LR: + the bias column at this party)."""
        family = families.get(s.family)
        return {
            self.party_id: family.block_width(self.data.X.shape[1], active=True),
            **{party: family.block_width(n, active=False) for party, n in s.passive_features.items()},
        }

    def _train_step(self, s: ActiveSession, step: int, index: np.ndarray, epoch: int) -> None:
        s.trainer.train_step(self._context(s, step, epoch), index)

    def _context(self, s: ActiveSession, step: int, epoch: int = 0) -> families.ActiveContext:
        """What the trainer gets for training step ``step`` of ``epoch`` (0: inference it runs itself)."""
        return families.ActiveContext(
            session_id=s.session_id,
            step=step,
            epoch=epoch,
            backend=s.backend,
            n_classes=s.n_classes,
            mask_key=s.mask_key,
            key_holder=self.coordinator,
            passives=self.passives,
            emit=lambda kind, source, **fields: self._emit(kind, s, source, **fields),
            features=lambda index: self.data.X[s.rows[index]],
            labels=lambda index: self.data.y[s.rows[index]],
            widths=self._widths(s),
            spawn=self._pool.submit,
            training_keys=lambda: self._training_keys(s, step),
            sample_ids=lambda index: [str(self.data.ids[row]) for row in s.rows[index]],
            share_mask_keys=s.share_mask_keys,
            gradient_defense=s.gradient_defense,
        )

    def _training_keys(self, s: ActiveSession, step: int) -> he.Backend:
        """The public key of step ``step``'s epoch (the coordinator rotates training keys every few steps)."""
        s.training_keys = epoch_keys(
            s.training_keys, step, s.backend.name, lambda at: self.coordinator.training_context(s.session_id, at)
        )
        return s.training_keys[2]

    # --- inference ---
    def _predict_chunk_rows(self, s: ActiveSession) -> int:
        return max(1, PREDICT_CHUNK_VALUES // s.trainer.share_width)

    def predict(self, session_id: str, sample_ids: list[str]) -> tuple[np.ndarray, list[StepDescription], int]:
        """Scores through the coordinator: the whole query is admitted (or refused) before any chunk is
        released; each passive party sends its masked share of a chunk to the coordinator, which adds ours
        (from which we subtract every passive party's mask: services/crypto/ring_mask.py). Concurrent requests of a
        session share one round (:meth:`_predict_batch`); each is still its own query."""
        s = self.session(session_id)
        index = self._indices(s, sample_ids)
        if s.trainer.scores_locally:
            return self._predict_locally(s, sample_ids, index), [], 0
        if set(s.share_mask_keys) != set(self.passives):
            raise FailedPrecondition(f"session {session_id!r} has no share-mask keys: open a new session")
        if not self.predict_window or len(index) > self._batch_rows(s):
            return self._predict_alone(s, sample_ids, index)
        batcher = self._batcher(s)
        released = batcher.submit(index, len(index))
        self._emit_released(s, sample_ids, index, released)
        return released.scores, list(released.chain), released.argmax_changed

    def _batch_rows(self, s: ActiveSession) -> int:
        """The most rows of a Predict round: [limits] predict_batch_rows, and one chunk (its shares, one message)."""
        return min(self.predict_batch_rows, self._predict_chunk_rows(s))

    def _batcher(self, s: ActiveSession) -> Batcher:
        with self._batchers_lock:
            if s.session_id not in self._batchers:
                self._batchers[s.session_id] = Batcher(
                    functools.partial(self._predict_batch, s),
                    self.predict_window,
                    self._batch_rows(s),
                    PREDICT_BATCH_REQUESTS,
                    PREDICT_ROUNDS,
                )
            return self._batchers[s.session_id]

    def _predict_batch(self, s: ActiveSession, queries: list[np.ndarray]) -> list[ReleasedScores | ServiceError]:
        """One round for concurrent requests: their queries admitted in one call (each on its own: a refusal stays
        with its request), every passive party's shares of the admitted ones in one call each, and their releases in
        one call (each its own sum and pass through the release chain). Ours is one pass over all their rows, each
        query's share under its own masks, as alone."""
        sid = s.session_id
        outcomes: list = list(self.coordinator.admit_queries(sid, queries))
        live = [i for i, admitted in enumerate(outcomes) if not isinstance(admitted, ServiceError)]
        if not live:
            return outcomes
        shared = [(outcomes[i].query_id, queries[i]) for i in live]
        shares = self._own_shares(s, shared)
        for refusals in self._each_passive(lambda party, client: client.share_logits_batch(sid, shared)):
            for i, error in zip(live, refusals, strict=True):
                if error is not None and not isinstance(outcomes[i], ServiceError):
                    outcomes[i] = error  # that query alone: its batch-mates are released
        kept = [k for k, i in enumerate(live) if not isinstance(outcomes[i], ServiceError)]
        released = self.coordinator.release_batch(sid, [(*shared[k], shares[k]) for k in kept], n_classes=s.n_classes)
        for k, scores in zip(kept, released, strict=True):
            outcomes[live[k]] = scores
        return outcomes

    def _own_shares(self, s: ActiveSession, queries: list[tuple[str, np.ndarray]]) -> list[np.ndarray]:
        """Our share of each (query id, rows): one pass over their rows, each query's share less every passive party's
        mask of that query (which the coordinator's sum cancels), as the passive parties mask theirs."""
        rows = s.rows[np.concatenate([index for _, index in queries])]
        words = ring_mask.encode(s.trainer.inference_share(self.data.X[rows]))
        masked, width = families.masks_shares(s.family), s.trainer.share_width
        shares, start = [], 0
        for query_id, index in queries:
            share = words[start : start + len(index)]
            start += len(index)
            if masked:
                for key in s.share_mask_keys.values():
                    share -= ring_mask.share_mask(key, s.session_id, s.step, query_id, index, width)
            shares.append(share)
        return shares

    def _emit_released(self, s: ActiveSession, sample_ids: list[str], index: np.ndarray, reply: ReleasedScores) -> None:
        if not self.hub.active:  # nothing to build the observation for
            return
        self._emit(
            plugins.RELEASED_SCORES,
            s,
            "coordinator",
            sample_ids=tuple(sample_ids),
            arrays={"scores": reply.scores, "own_features": self.data.X[s.rows[index]]},
            meta={
                "chain": [name for name, _ in reply.chain],
                "steps": [[name, dict(params)] for name, params in reply.chain],  # public params: Kerckhoffs
                "argmax_changed": reply.argmax_changed,
            },
        )

    def _predict_alone(
        self, s: ActiveSession, sample_ids: list[str], index: np.ndarray
    ) -> tuple[np.ndarray, list[StepDescription], int]:
        """A request as its own query and round, in chunks of at most PREDICT_CHUNK_VALUES share entries."""
        session_id = s.session_id
        query_id = self.coordinator.admit_query(session_id, index).query_id
        chunk = self._predict_chunk_rows(s)
        scores, changed, chain = [], 0, []
        for start in range(0, len(index), chunk):
            part = index[start : start + chunk]
            (share,) = self._own_shares(s, [(query_id, part)])
            self._each_passive(lambda party, client, part=part: client.share_logits(session_id, query_id, part))
            reply = self.coordinator.release_scores(session_id, query_id, share, part, n_classes=s.n_classes)
            self._emit_released(s, sample_ids[start : start + chunk], part, reply)
            scores.append(reply.scores)
            changed += reply.argmax_changed
            chain = list(reply.chain)
        return np.vstack(scores), chain, changed

    def _predict_locally(self, s: ActiveSession, sample_ids: list[str], index: np.ndarray) -> np.ndarray:
        """Scores this party computes itself from every passive party's output in the clear (split-NN active-top:
        the top model is here, so there is no release point; the docs say so)."""
        if not s.trained:
            raise FailedPrecondition("predictions come from a trained model: call Train first")
        chunk = max(1, PREDICT_CHUNK_VALUES // max(s.trainer.output_widths()))
        ctx, scores = self._context(s, 0), []
        for start in range(0, len(index), chunk):
            part, ids = index[start : start + chunk], tuple(sample_ids[start : start + chunk])
            x = self.data.X[s.rows[part]]
            scores.append(s.trainer.local_scores(ctx, part))
            self._emit(
                plugins.RELEASED_SCORES,
                s,
                self.party_id,  # its own scores: no coordinator, no release chain
                sample_ids=ids,
                arrays={"scores": scores[-1], "own_features": x},
                meta={"chain": [], "steps": [], "argmax_changed": 0},
            )
        return np.vstack(scores)

    def fetch_model(self, session_id: str) -> tuple[families.ReleasedModel, ReleasedParams]:
        s = self.session(session_id)
        if not s.trained:
            raise FailedPrecondition("the model is released after training")
        released = self.coordinator.release_model(session_id)
        model = s.trainer.released(released)
        self._emit(
            plugins.RELEASED_MODEL,
            s,
            "coordinator",
            arrays=dict(model.tensors),
            meta={
                "chain": [name for name, _ in released.chain],
                "steps": [[name, dict(params)] for name, params in released.chain],
                "withheld": [party for party, w in released.passive.items() if w is None],
            },
        )
        return model, released

    def close(self, session_id: str) -> None:
        self.session(session_id)
        with self._batchers_lock:
            self._batchers.pop(session_id, None)
        self._each_passive(lambda party, client: client.close(session_id))
        self.coordinator.close(session_id)
        self.sessions.close(session_id)
