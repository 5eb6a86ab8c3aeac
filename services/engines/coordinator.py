"""Coordinator: holds the CKKS secret key, decrypts only aggregates, and is the single release point.

Plain-Python engine (:class:`Coordinator`); its gRPC servicers are in services/rpc/ (coordinator.py, splitnn.py,
trees.py).
"""

from __future__ import annotations

import collections
import secrets
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from vflsec.services import common
from vflsec.services.config import QUERY_BUDGET, StatisticsPolicy
from vflsec.services.crypto import entropy, he, masking, psi, ring_mask
from vflsec.services.defenses.params import Distorted
from vflsec.services.defenses.release import (
    ParamReleaseChain,
    ReleaseConfigError,
    ReleaseContext,
    ReleasedParams,
    ReleasedScores,
    ScoreReleaseChain,
)
from vflsec.services.engines import checkpoint
from vflsec.services.engines.coordinator_state import Answer, CoordinatorSession, MeteredKeys, Query, TrainingStep
from vflsec.services.engines.policy import BackendPolicy
from vflsec.services.engines.sessions import RowSet, SessionTable, checked_rows, declared_step, family_step
from vflsec.services.errors import (
    FailedPrecondition,
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
    ServiceError,
)
from vflsec.services.models import family as families


class PassivePeer(Protocol):
    """What the coordinator asks of a passive party (over mTLS; see services/transport/links.py)."""

    def weights(self, session_id: str) -> np.ndarray: ...

    def disclose(self, session_id: str, specs: list[str]) -> list[tuple[str, Distorted]]: ...

    def trained_rows(self, session_id: str) -> np.ndarray: ...

    def aligned_rows(self, session_id: str) -> int: ...

    def tensors(self, session_id: str) -> dict[str, np.ndarray]: ...


# Admitted queries whose rows are not all released yet, per session (each holds the passive shares in flight); a new
# one past it lapses the oldest (its budget stays spent), so failed Predicts never lock the owner out.
MAX_OPEN_QUERIES = 256
MASK_TAG_BYTES = 32  # BlockSumsRequest.mask_tag: HMAC-SHA256 (entropy.tag)
# Chunks of one query whose shares wait for the owner's ReleaseScores, per passive party (Predict keeps one in flight).
MAX_PENDING_CHUNKS = 4
# |z| a released sum is scored within (rule 4): an honest sum of logits or embeddings lies far inside it
SCORE_BOUND = ring_mask.SCORE_BOUND


@dataclass(frozen=True)
class QueryPolicy:
    """Limits on what the active party may have scored, enforced at the single release point."""

    budget: int = QUERY_BUDGET  # scored samples per owner, over all its sessions and restarts; 0 = unlimited
    refuse_training_ids: bool = False  # refuse scores for samples that were used in training
    max_rows: int = 100_000  # rows per query

    def __post_init__(self) -> None:
        if self.budget < 0 or self.max_rows < 1:
            raise ValueError(f"invalid query policy {self}")



class Coordinator:
    def __init__(
        self,
        score_chain: ScoreReleaseChain,
        param_chain: ParamReleaseChain,
        passives: Mapping[str, PassivePeer],
        policy: QueryPolicy | None = None,
        state: checkpoint.StateDir | None = None,
        schema: Mapping[str, int] | None = None,
        allowed_backends: Sequence[str] = ("ckks",),
        key_rotation_steps: int | None = None,
        max_rows: int = psi.MAX_IDS,
        statistics: StatisticsPolicy | None = None,
    ) -> None:
        self.score_chain = score_chain
        self.statistics = statistics or StatisticsPolicy()  # [policy] min_training_rows, min_node_rows (rule 3)
        # A bound on the aligned rows ([limits] psi_max_ids: no party aligns more IDs than one PSI exchange carries),
        # so a row index from a peer cannot make the sessions' row bitmaps grow without bound.
        self.max_rows = max_rows
        # Operator-approved feature columns per party ([schema] in the config, required there); None only for
        # engines built directly in tests, whose widths are then self-declared.
        self.schema = None if schema is None else dict(schema)
        # [policy] allowed_backends: plain hides nothing, so a deployment runs it only when its operator says so.
        self.backend_policy = BackendPolicy.of("this coordinator's", allowed_backends)
        self.key_rotation_steps = key_rotation_steps  # an operator's tighter bound on steps per training key
        self.param_chain = param_chain
        self.passives = passives
        self.policy = policy or QueryPolicy()
        self.state = state or checkpoint.StateDir(None)
        # Beside the sessions: training keys (one file per session and live epoch) and the query budget's ledger
        # (samples admitted per owner, over all its sessions). The session file keeps epoch 0's public context,
        # which parties parse with.
        self.epoch_keys = checkpoint.StateDir(None if self.state.path is None else self.state.path / "epochs")
        self.ledger = checkpoint.CountLedger(None if self.state.path is None else self.state.path / "owners")
        self.sessions = SessionTable(self.state, self._restore, refusal=lambda sid, s: s.refused)
        for sid, s in self.sessions.items():
            s.refused = self._refusal(sid, s)
        # A crash between a checkpoint and a key file's removal (or creation) leaves keys no session names: drop.
        live = {_epoch_file(sid, e) + ".bin" for sid, s in self.sessions.items() for e in s.epochs}
        if self.epoch_keys.path is not None:
            keys = {f.name for f in self.epoch_keys.path.glob("*.bin")}
            live |= {f for f in keys if f.rpartition(".e")[0] in self.state.unreadable}  # kept with their checkpoint
            for orphan in keys - live:
                (self.epoch_keys.path / orphan).unlink()
        self.scored: dict[str, int] = self.ledger.load_all()
        self._lock = threading.Lock()  # every owner's count (self.scored): held for arithmetic only, never per row
        # (session, step, party) -> block-sums requests being decrypted in this process (the same bytes, concurrently)
        self._decrypting: collections.Counter[tuple[str, int, str]] = collections.Counter()
        self._ledger_lock = threading.Lock()  # one ledger write at a time; _durable: each owner's count last written
        self._durable = dict(self.scored)
        self._ledger_writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger")
        # Inference keys of an earlier release (inference decrypts nothing now): secret keys protecting nothing, removed
        legacy = None if self.state.path is None else self.state.path / "inference"
        if legacy is not None and legacy.is_dir():
            for stale in legacy.glob("*.bin"):
                stale.unlink()

    def _restore(self, session_id: str, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> CoordinatorSession:
        """A checkpointed session with its key files (one that raises is set aside: SessionTable)."""
        if "epochs" not in meta:
            raise ValueError("its checkpoint predates training-key epochs: the operator removes it")
        return CoordinatorSession.from_state(
            arrays,
            meta,
            {e: self.epoch_keys.load_bytes(_epoch_file(session_id, e)) for e in meta["epochs"]},
            self.state.load_bytes(session_id),
        )

    def session(self, session_id: str, *, closing: bool = False) -> CoordinatorSession:
        return self.sessions.get(session_id, closing=closing)

    def _refusal(self, session_id: str, s: CoordinatorSession) -> str | None:
        """Why a restored session may not go on under the current configuration, if it may not."""
        refusal = self.backend_policy.refusal(session_id, s.backend.name)
        if refusal is not None:
            return refusal
        try:
            self._check_rotation(s)
        except FailedPrecondition as exc:
            return str(exc)
        return None

    def _check_rotation(self, s: CoordinatorSession) -> None:
        """The session's key epoch length T was fixed at OpenSession; a [schema] or [limits] key_rotation_steps
        changed since may allow fewer steps per key (else one key would answer more than N/4 functionals)."""
        if self.key_rotation(s.owner, s.passive_parties, s.n_classes, s.family) < s.rotation:
            raise FailedPrecondition(
                "the schema or key_rotation_steps changed since this session opened; open a new session"
            )

    def _save(self, session_id: str, s: CoordinatorSession) -> None:
        self.sessions.save(session_id, s)

    def owned(self, session_id: str, caller: str, *, closing: bool = False) -> CoordinatorSession:
        return self.sessions.owned(session_id, caller, closing=closing)

    def member(self, session_id: str, caller: str) -> CoordinatorSession:
        """The session, if ``caller`` is its owner or one of its passive parties."""
        s = self.session(session_id)
        if caller != s.owner and caller not in s.passive_parties:
            raise PermissionDenied(f"{caller} is not a party of session {session_id!r}")
        return s

    def approved_width(self, s: CoordinatorSession, party: str) -> int | None:
        return self._approved_width(s.owner, party, s.model)

    def _approved_width(self, owner: str, party: str, family: families.ModelFamily) -> int | None:
        """The block width the schema approves for ``party`` (its feature columns as the family counts a block,
        LR: + 1 for the owner's bias column); None without a schema. A party the schema does not name has none."""
        if self.schema is None:
            return None
        if party not in self.schema:
            raise FailedPrecondition(f"the coordinator's schema approves no width for {party}")
        return family.block_width(self.schema[party], active=party == owner)

    def key_rotation(
        self, owner: str, passive_parties: Sequence[str], n_classes: int, family_name: str = families.DEFAULT
    ) -> int:
        """Steps per training-key epoch. Each step answers party q w_q·k block sums, each at most one linear
        functional of the key for a deviating party; summed over every party, any coalition of them reads at most
        N / KEY_ROTATION_MARGIN functionals per key. Without a schema (engines built in tests): every step."""
        family = families.get(family_name)
        widths = [self._approved_width(owner, party, family) for party in (owner, *passive_parties)]
        if None in widths:
            return 1
        derived = he.key_rotation_steps(family.answers_per_step((w for w in widths if w is not None), n_classes))
        return min(derived, self.key_rotation_steps or derived)

    def open_session(
        self,
        session_id: str,
        backend_name: str,
        n_classes: int,
        passive_parties: Sequence[str],
        owner: str,
        family_name: str = families.DEFAULT,
        values: Mapping[str, object] | None = None,
    ) -> bytes:
        """Open a session of ``family_name`` (``values``: its settings as plain values; default LR's defaults)."""
        SessionTable.check_new(session_id)
        try:
            family = families.get(family_name)
            settings = family.settings(values or {})
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from exc
        try:  # a release step that cannot handle this family's scores or parameters refuses the session now
            self.score_chain.require(family.name)
            self.param_chain.require(family.name)
        except ReleaseConfigError as exc:
            raise FailedPrecondition(f"this coordinator's release chains cannot serve {family.name}: {exc}") from exc
        self.backend_policy.require(backend_name)
        if n_classes < 2:
            raise InvalidArgument(f"n_classes must be >= 2, got {n_classes}")
        if len(set(passive_parties)) != len(passive_parties) or not passive_parties:
            raise InvalidArgument(f"passive_parties must be distinct and non-empty, got {list(passive_parties)}")
        rotation = self.key_rotation(owner, passive_parties, n_classes, family.name)
        with self.sessions.lock:
            self.sessions.check_absent(session_id)
            backend = he.make_keyholder(backend_name)
            s = CoordinatorSession(
                epochs={0: backend},
                rotation=rotation,
                public_context=backend.public_context(),  # serialised once per session
                n_classes=n_classes,
                passive_parties=tuple(passive_parties),
                owner=owner,
                # Every release-time draw reads OS entropy: no configuration can make the noise reproducible.
                release=ReleaseContext(rng=entropy.os_entropy(), n_classes=n_classes),
                family=family.name,
                trainer=family.new_key_holder(n_classes, passive_parties, settings),
            )
            self.epoch_keys.save_bytes(_epoch_file(session_id, 0), backend.export_keyholder())
            self.state.save_bytes(session_id, s.public_context)
            self.sessions.add(session_id, s)
        return s.public_context

    def training_scores(
        self,
        session_id: str,
        step: int,
        share: bytes,
        replicas: int,
        sample_index: np.ndarray,
        widths: Mapping[str, int],
    ) -> he.WireMatrix:
        """The owner's ``share`` of the logits plus every passive party's (SubmitTrainingShare), added in Z_2^64 by the
        family (nothing is decrypted) -> [[p]], serialised once (kept for a replay and sent as is): the active party
        never sees a training score in plaintext.

        A replay of the last step (after a crash) must name the same batch and gets the same [[p]] bytes back.
        """
        s = self.session(session_id)
        training_scores = family_step(session_id, s, "training_scores")
        k = s.trainer.share_width
        if replicas < 1 or replicas * k > s.backend.slots:
            raise InvalidArgument(f"replicas must be in [1, {s.backend.slots // k}], got {replicas}")
        own = _share_words(share, len(sample_index), k)
        with s.lock:
            replay = self._admit_step(session_id, s, step, sample_index, widths)
            keys = self._epoch_keys(session_id, s, step)
            if replay is None:
                probs = training_scores(keys, step, np.array(sample_index), own, replicas, s.passive_parties)
                layout = he.MatrixLayout(probs.shape, probs.replicas, probs.rows_per_ct)
                replay = s.current = TrainingStep(step, layout, np.array(sample_index), list(probs.ciphertexts))
                self._advance(session_id, s, step, sample_index, widths)
            else:
                _check_replayed_scores(keys, replay)
        layout = replay.layout
        return he.WireMatrix(layout.shape, layout.replicas, layout.rows_per_ct, list(replay.scores))

    def _admit_step(
        self, session_id: str, s: CoordinatorSession, step: int, sample_index: np.ndarray, widths: Mapping[str, int]
    ) -> TrainingStep | None:
        """A training step's admission, for every family (caller holds s.lock): distinct rows, all aligned, the
        widths every party declared (fixed at the first step, checked against the schema), the minimum batch, and
        the step order. A repeat of the last step (after a crash) must name the same batch: its recorded answer is
        returned, to be given again; None for a new step."""
        common.require_distinct_rows(sample_index)
        self.aligned_rows(session_id, s, sample_index)
        n = len(sample_index)
        parties = {s.owner, *s.passive_parties}
        if set(widths) != parties or min(widths.values(), default=0) < 1:
            raise InvalidArgument(f"widths must give every party of the session {sorted(parties)} a width >= 1")
        if s.widths and dict(widths) != s.widths:
            raise FailedPrecondition(f"block widths {dict(widths)} differ from the session's {s.widths}")
        if not s.widths:  # the widths are fixed now: T must still fit them
            self._check_rotation(s)
        for party, width in sorted(widths.items()):
            approved = self.approved_width(s, party)
            if approved is not None and width != approved:
                raise FailedPrecondition(
                    f"{party} declared block width {width}; the operator-approved schema gives {approved}"
                )
        smallest = s.model.min_batch_size(widths.values())
        if n < smallest:
            raise InvalidArgument(
                f"a batch of {n} rows is below the minimum batch {smallest} (2 x the widest block, "
                f"{max(widths.values())} columns): smaller batches let gradients reveal scores and labels"
            )
        if step < max(s.last_step, 1):
            raise FailedPrecondition(f"step {step} is before the last step {s.last_step}")
        current = s.current
        if current is None or current.step != step:
            return None
        if not np.array_equal(current.sample_index, sample_index):
            raise FailedPrecondition(f"step {step} was computed for another batch; it can only be replayed")
        return current

    def aligned_rows(self, session_id: str, s: CoordinatorSession, sample_index: np.ndarray) -> np.ndarray:
        """``sample_index`` if every row lies below the rows every passive party aligned (caller holds s.lock), else
        INVALID_ARGUMENT. The coordinator runs no PSI: it asks each passive party for its count once (a session
        aligns once) and keeps the smallest, so no family trains on a row the active party invented (rule 3)."""
        index = checked_rows(sample_index, self.max_rows, "sample_index")
        if s.aligned is None:
            counts = {party: self._peer(party).aligned_rows(session_id) for party in s.passive_parties}
            unaligned = sorted(party for party, n in counts.items() if n < 1)
            if unaligned:
                raise FailedPrecondition(f"{', '.join(unaligned)} aligned no rows for this session: run PSI first")
            s.aligned = min(counts.values())
        if index.size and int(index.max()) >= s.aligned:
            raise InvalidArgument(
                f"sample_index: row {int(index.max())} was never aligned (the passive parties aligned {s.aligned} rows)"
            )
        return index

    def _advance(self, session_id: str, s: CoordinatorSession, step: int, sample_index: np.ndarray, widths) -> None:
        """Record step ``step`` as the last one (caller holds s.lock) and drop the keys no later step can need."""
        s.widths = dict(widths)
        s.last_step = step
        s.trained_index.update(sample_index, limit=self.max_rows)
        # The newest keys stay even when a step used none (split-NN decrypts nothing): parsing and form checks use them
        self._drop_epochs(session_id, s, [e for e in s.epochs if e < s.epoch(step) and e != max(s.epochs)])

    def _drop_epochs(self, session_id: str, s: CoordinatorSession, dropped: Sequence[int]) -> None:
        """Forget these key epochs (caller holds s.lock) and checkpoint; their files go after the checkpoint that no
        longer names them."""
        for epoch in dropped:
            del s.epochs[epoch]
            s.spent.pop(epoch, None)
        self._save(session_id, s)
        for epoch in dropped:
            self.epoch_keys.remove(_epoch_file(session_id, epoch))

    def _new_epoch_keys(self, session_id: str, s: CoordinatorSession, epoch: int) -> he.Backend:
        """Fresh keys from OS entropy for ``epoch`` (caller holds s.lock), stored before they are used so that a replay
        after a restart decrypts under the same key; the caller checkpoints the session that names them."""
        keys = he.make_keyholder(s.backend.name)
        if self.epoch_keys.path is not None:  # without a state folder there is nothing to export
            self.epoch_keys.save_bytes(_epoch_file(session_id, epoch), keys.export_keyholder())
        s.epochs[epoch] = keys
        return keys

    def _train(
        self,
        session_id: str,
        s: CoordinatorSession,
        step: int,
        sample_index: np.ndarray,
        widths: Mapping[str, int],
        layout: he.MatrixLayout,
        compute: Callable[[he.Backend], families.StepAnswer],
    ) -> families.StepAnswer:
        """A family's training step at the key holder (caller holds s.lock): admitted as every step is, its answer
        ``compute(keys)`` under the step's keys, recorded; each step is applied once, and a repeat of the last
        step's request (same rows) gets its recorded answer again."""
        replay = self._admit_step(session_id, s, step, sample_index, widths)
        if replay is not None:
            if replay.gradient is None:
                raise FailedPrecondition(f"step {step} was another family's step; it can only be replayed")
            return replay.gradient.copy(), replay.loss
        if step != s.last_step + 1:
            raise FailedPrecondition(f"step {step} does not follow the last step {s.last_step}")
        epoch = s.epoch(step)
        keys = MeteredKeys(
            lambda: self._epoch_keys(session_id, s, step), lambda n: self._charge(session_id, s, epoch, n)
        )
        gradient, loss = compute(keys)
        s.current = TrainingStep(step, layout, np.array(sample_index), [], gradient=gradient, loss=loss)
        self._advance(session_id, s, step, sample_index, widths)
        return gradient.copy(), loss

    def _charge(self, session_id: str, s: CoordinatorSession, epoch: int, slots: int) -> None:
        """Rule 2: ``slots`` more decrypted under key epoch ``epoch`` (caller holds s.lock), checkpointed before the
        decryption; refused, with nothing decrypted, past the key's budget of he.KEY_BUDGET slots."""
        spent = s.spent.get(epoch, 0)
        if spent + slots > he.KEY_BUDGET:
            raise ResourceExhausted(
                f"decryption budget of training key epoch {epoch}: {spent} of {he.KEY_BUDGET} slots (N/4) spent, "
                f"{slots} more asked; a step decrypts at most {he.KEY_BUDGET} slots (split-NN: batch x embedding)"
            )
        s.spent[epoch] = spent + slots
        self._save(session_id, s)

    def _epoch_keys(self, session_id: str, s: CoordinatorSession, step: int) -> he.Backend:
        """Step ``step``'s training keys (caller holds s.lock); a step opening a new epoch makes its keys, stored
        before they are used so that a replay after a restart decrypts under the same key."""
        epoch = s.epoch(step)
        keys = s.epochs.get(epoch)
        if keys is None:
            if step < s.last_step:
                raise FailedPrecondition(f"the keys of step {step} (epoch {epoch}) are dropped")
            keys = self._new_epoch_keys(session_id, s, epoch)
            self._save(session_id, s)
        return keys

    def _decision(self, session_id: str, s: CoordinatorSession, bits: int) -> int:
        """Rule 2 for a decision (caller holds s.lock, in a family step): ``bits`` charged to the newest key epoch,
        or to fresh keys (older ones dropped) when it cannot take them; the epoch. The charge is durable with the
        step's checkpoint, written before its reply and so before anything of the decision is decrypted (a crash in
        between loses the step with its charge); fresh keys are checkpointed at once, before older files go."""
        if not 0 < bits <= he.KEY_BUDGET:
            raise ResourceExhausted(f"a decision of {bits} bits: a key answers at most {he.KEY_BUDGET} (N/4)")
        epoch = max(s.epochs)
        if s.spent.get(epoch, 0) + bits <= he.KEY_BUDGET:
            s.spent[epoch] = s.spent.get(epoch, 0) + bits
            return epoch
        old = list(s.epochs)
        self._new_epoch_keys(session_id, s, epoch + 1)
        s.spent[epoch + 1] = bits
        self._drop_epochs(session_id, s, old)  # checkpoints the new keys' session before the old files go
        return epoch + 1

    @staticmethod
    def _held_keys(s: CoordinatorSession, epoch: int) -> he.Backend:
        keys = s.epochs.get(epoch)
        if keys is None:
            raise FailedPrecondition(f"the keys of epoch {epoch} are not held (the newest is {max(s.epochs)})")
        return keys

    def training_context(self, session_id: str, caller: str, step: int) -> tuple[int, int, bytes]:
        """(epoch, rotation, public context) of the keys a party encrypts step ``step`` under: the last step
        (a replay) or the next one; no keys are made for steps further ahead."""
        s = self.member(session_id, caller)
        with s.lock:
            if not max(s.last_step, 1) <= step <= s.last_step + 1:
                raise FailedPrecondition(
                    f"training keys are given for the last step {s.last_step} or the next, not step {step}"
                )
            keys = self._epoch_keys(session_id, s, step)
            return s.epoch(step), s.rotation, keys.public_context()

    def block_sums(
        self, session_id: str, step: int, caller: str, ciphertexts: Sequence[bytes], width: int, mask_tag: bytes
    ) -> np.ndarray:
        """Masked products -> masked block sums of the caller's ``width`` columns, once per party and step.

        Admission (docs/protocol.md, "Block sums"): the caller's width must be the one the active party reported
        for it (both must agree); the batch must be at least twice it (checked per step for every width); the request
        carries exactly ceil(ceil(width / R) / parts) x ceil(n_chunks / fold) ciphertexts (masking.product_count;
        parts: two feature groups a product under CKKS, masking.product_parts; fold: masking.gradient_fold), each no
        larger than a fresh one, checked before
        any is parsed; one request per party and step is decrypted, and every repeat gets that request's answer
        (its sums, from the cache, or its refusal) whatever its bytes: products are re-randomised (review 20, F3),
        so an honest party redoing a step sends other bytes, and an answer it had tells it nothing new; but only
        under the first request's ``mask_tag`` (the caller's HMAC of its masks' context): a repeat under other masks
        would get sums its masks do not unmask, and is refused (review 21, F9). A request
        whose decryption a stopped coordinator never finished is replaced by the party's next one (none of it was
        released); while one is decrypted here, another of the same party and step is refused. Products that
        decrypt outside the masked range are refused, and the sums leave flooded with fresh OS-entropy noise and
        rounded (he.BLOCK_SUM_FLOODING, he.BLOCK_SUM_GRID).
        """
        s = self.member(session_id, caller)
        block_sums = family_step(session_id, s, "block_sums")
        if len(mask_tag) != MASK_TAG_BYTES:
            raise InvalidArgument(f"mask_tag: must be {MASK_TAG_BYTES} bytes, got {len(mask_tag)}")
        digest, tag = common.digest(ciphertexts).hex(), mask_tag.hex()
        with s.lock:
            current = s.current
            if current is None or current.step != step:
                raise FailedPrecondition(f"step {step} is not the current training step")
            answer = current.answers.get(caller)
            working = (session_id, step, caller)
            # A checkpoint older than the tag kept none (None): its repeats are answered whatever their tag.
            other_masks = answer is not None and answer.tag not in (None, tag)
            if answer is not None and (answer.sums is not None or answer.refused is not None) and other_masks:
                raise FailedPrecondition(
                    f"{caller}'s block sums of step {step} were asked under other masks (mask_tag differs from the "
                    "first request's): redo the step with the masks of its first request, or open a new session"
                )
            if answer is not None:
                if answer.refused is not None:
                    raise InvalidArgument(answer.refused)
                if answer.sums is not None:
                    return answer.sums.copy()
                if (answer.digest != digest or other_masks) and working in self._decrypting:
                    raise FailedPrecondition(
                        f"{caller}'s block sums of step {step} are being computed from another request of its own"
                    )
                # In progress when the coordinator stopped: decrypted once more, this request in that one's place.
            if width != s.widths.get(caller):
                raise InvalidArgument(
                    f"{caller} declared block width {width}; the active party reported {s.widths.get(caller)}"
                )
            layout = current.layout
            keys = s.epochs[s.epoch(step)]  # the current step's epoch is never dropped
            parts, fold = masking.product_parts(keys), masking.gradient_fold(layout)
            expected_count = masking.product_count(width, layout, fold=fold, parts=parts)
            if len(ciphertexts) != expected_count:
                raise InvalidArgument(
                    f"a block of {width} columns at {layout.replicas} replicas, {parts} feature group(s) a "
                    f"ciphertext, over {layout.n_chunks} chunks added {fold} a product, is "
                    f"{expected_count} ciphertexts, got {len(ciphertexts)}"
                )
            limit = keys.max_ciphertext_bytes
            if any(len(blob) > limit for blob in ciphertexts):
                raise InvalidArgument(f"a ciphertext exceeds {limit} bytes, the size of a fresh one")
            if answer is None or answer.digest != digest or other_masks:
                # From here the step's one answer is spent, whatever the outcome, and durably so before any byte
                # is parsed: only this request (its digest and tag) may be decrypted for the party at this step.
                answer = current.answers[caller] = Answer(digest, entropy.new_key(), tag=tag)
                self._save(session_id, s)
            elif answer.tag is None:  # resumed from a checkpoint older than the tag: bound to this request's (its
                # seed kept, so that a concurrent byte-identical resume decrypts to the same sums; review 22, F1)
                answer.tag = tag
                self._save(session_id, s)
            self._decrypting[working] += 1
        # Parsed and decrypted outside the session lock, so the parties' requests of a step are answered side by
        # side. Only these bytes can get here (the digest is recorded), and a concurrent repeat of them decrypts to
        # the very same sums: the flooding is keyed by the answer's seed.
        try:
            try:
                cts = he.deserialize_all(keys, ciphertexts, layout.ct_size)
                sums = block_sums(keys, cts, layout, width)  # the family checks its products' form first
            except ValueError as exc:
                refused = f"ciphertexts: {exc}"
                self._record(session_id, s, answer, "refused", refused)
                raise InvalidArgument(refused) from exc
            sums = _flood(sums, keys.block_sum_flooding, entropy.keyed_stream(answer.seed, "block-sums"))
            self._record(session_id, s, answer, "sums", sums)
            return sums.copy()
        finally:
            with s.lock:
                self._decrypting[working] -= 1
                if self._decrypting[working] <= 0:
                    del self._decrypting[working]

    def _record(self, session_id: str, s: CoordinatorSession, answer: Answer, field: str, outcome: Any) -> None:
        """A block-sums answer's outcome (``sums`` or ``refused``), kept only once it is durable: repeats are answered
        from memory, and a request with no durable outcome is replaced after a restart (fresh flooding seed), so an
        outcome released but never saved would be a second sample of the step (review 21)."""
        with s.lock:
            setattr(answer, field, outcome)
            try:
                self._save(session_id, s)
            except BaseException:
                setattr(answer, field, None)  # as if stopped before it: nothing of it was released
                raise

    def family_call(self, session_id: str, caller: str, name: str, **payload: Any) -> Any:
        """A model family's own message ``name`` (its ModelFamily.steps["coordinator"]), from a party of the session
        the step names (the owner: role "active"), run on the session's key-holder trainer under the session lock,
        checkpointed afterwards even when it fails (a decryption answer spent on a refused request stays spent)."""
        s = self.member(session_id, caller)
        position = 0 if caller == s.owner else s.passive_parties.index(caller) + 1
        role = common.ACTIVE if position == 0 else common.PASSIVE
        step = declared_step(session_id, s, common.COORDINATOR, name, role)
        ctx = families.KeyHolderContext(
            session_id=session_id,
            caller=position,
            decision=lambda bits: self._decision(session_id, s, bits),
            held_keys=lambda epoch: self._held_keys(s, epoch),
            public_keys=lambda epoch: self._held_keys(s, epoch).public_context(),
            peer=lambda p: self._peer(s.passive_parties[p - 1]),
            check_rows=lambda rows: self.aligned_rows(session_id, s, rows),
            trained=lambda rows: s.trained_index.update(rows, limit=self.max_rows),
            train=lambda *args: self._train(session_id, s, *args),
            min_training_rows=self.statistics.min_training_rows,
            min_node_rows=self.statistics.min_node_rows,
            last_step=s.last_step,
            save=lambda: self._save(session_id, s),
        )
        with s.lock:
            try:
                return step.run(s.trainer, ctx, **payload)
            finally:
                if step.checkpoint:
                    self._save(session_id, s)

    def finish_training(self, session_id: str) -> None:
        """Pull every passive block over TLS and keep it here (PPS-B and the parameter chain need it), with
        the rows each block was trained on (the training-ID refusal trusts them, not the active party)."""
        s = self.session(session_id)
        pulled = s.passive_parties if s.model.releases_passive_blocks else ()
        weights = {party: self._peer(party).weights(session_id) for party in pulled}
        k = s.trainer.share_width
        for party, block in weights.items():
            # The block must have the width its gradients were computed (and bounded) for.
            width = s.widths.get(party, self.approved_width(s, party))
            if block.ndim != 2 or block.shape[0] != k or (width is not None and block.shape[1] != width):
                raise FailedPrecondition(
                    f"{party}'s weight block has shape {block.shape}; training used ({k}, {width})"
                )
        tensors = self._pulled_tensors(session_id, s)
        trained = RowSet()
        for party in s.passive_parties:
            rows = checked_rows(self._peer(party).trained_rows(session_id), self.max_rows, f"{party}'s trained rows")
            trained.update(rows, limit=self.max_rows)
        with s.lock:
            s.passive_weights = weights
            s.passive_tensors = tensors
            s.release.passive_weights = weights
            s.release.cache.clear()  # model-dependent precomputation is stale now
            s.passive_trained = trained
            s.finished_step = s.last_step
            s.queries.clear()  # admitted for an earlier model: void (their budget stays spent)
            self._save(session_id, s)

    def _pulled_tensors(self, session_id: str, s: CoordinatorSession) -> dict[str, np.ndarray]:
        """Each passive party's named tensors (split-NN: its bottom), each under its own position's prefix only, so
        no party can stand in for another's tensors or for the top model. A party may send none (it keeps its bottom
        under an embedding defense)."""
        if not getattr(s.model, "releases_passive_tensors", False):
            return {}
        pulled: dict[str, np.ndarray] = {}
        for position, party in enumerate(s.passive_parties, start=1):
            tensors = self._peer(party).tensors(session_id)
            prefix = s.model.tensor_prefix(position)  # type: ignore[attr-defined]  # releases_passive_tensors
            foreign = sorted(name for name in tensors if not name.startswith(prefix))
            if foreign:
                raise FailedPrecondition(f"{party} released {foreign}; expected names under {prefix}")
            pulled |= tensors
        return pulled

    def admit_query(self, session_id: str, sample_index: np.ndarray) -> tuple[str, int]:
        """Check the query policy for every row of a query before any of it is released; spend its budget.

        Returns the query id and the owner's admitted total. A refused query spends nothing.
        """
        return _one(self.admit_queries(session_id, [sample_index]))

    def admit_queries(self, session_id: str, queries: Sequence[np.ndarray]) -> list[tuple[str, int] | ServiceError]:
        """:meth:`admit_query` for each of ``queries`` in order (the owner's batched Predicts): each is admitted or
        refused on its own rows, the policy and the owner's count, exactly as alone; a refusal is returned in its
        place and spends nothing. Each entry is checked under the session's lock only; the lock over every owner's
        count is taken once per call, for the budget's arithmetic (review 13, F1: an owner's free refusals held every
        session's admission). The ledger is written once for the call, in the background: a release waits until it
        holds its queries' budget."""
        common.require_entries(len(queries), "queries")
        s = self.session(session_id)
        outcomes: list = [_request_error(self._check_request, index) for index in queries]  # None: well-formed
        with s.lock:
            # The session's state, the same for every entry, refuses the whole call; after the form, so that a
            # malformed AdmitQuery is INVALID_ARGUMENT in any state.
            if None in outcomes:
                s.check_releasable()
            for i, index in enumerate(queries):
                if outcomes[i] is None:
                    outcomes[i] = _request_error(self._check_rows, session_id, s, index)
            asked = [i for i, outcome in enumerate(outcomes) if outcome is None]
            with self._lock:
                scored = self.scored.get(s.owner, 0)
                for i in asked:
                    outcomes[i] = _request_error(self._within_budget, scored, len(queries[i]))
                    if not isinstance(outcomes[i], ServiceError):
                        scored = outcomes[i]
                self.scored[s.owner] = scored
            for i in asked:
                if not isinstance(outcomes[i], ServiceError):
                    outcomes[i] = self._open_query(s, queries[i], outcomes[i])
        # Written while the passive parties share the rows; a release waits for it (_commit_ledger), so a crash before
        # it loses only queries nothing was released of (open queries are not checkpointed).
        if any(isinstance(outcome, tuple) for outcome in outcomes):
            self._ledger_writer.submit(self._commit_ledger, s.owner)
        return outcomes  # type: ignore[return-value]

    def _commit_ledger(self, owner: str, spent: int | None = None) -> None:
        """Make the owner's admitted count durable up to ``spent`` (None: every admission so far) unless a write
        already holds it. Concurrent admissions share one write (an fsync, outside the session's lock)."""
        if spent is not None and self._durable.get(owner, 0) >= spent:
            return  # no wait behind another round's write
        with self._ledger_lock:
            with self._lock:
                scored = self.scored.get(owner, 0)
            if self._durable.get(owner, 0) < (scored if spent is None else spent):
                self.ledger.save(owner, scored)
                self._durable[owner] = scored

    def _check_request(self, sample_index: np.ndarray) -> None:
        """A query's own form, checked before the session's state (its refusal names the request's field)."""
        if len(sample_index) == 0:
            raise InvalidArgument("sample_index is empty")
        common.require_distinct_rows(sample_index)  # the passive parties refuse them too: refused whole, nothing spent
        if len(sample_index) > self.policy.max_rows:
            raise InvalidArgument(f"{len(sample_index)} rows in one query; the limit is {self.policy.max_rows}")

    def _check_rows(self, session_id: str, s: CoordinatorSession, sample_index: np.ndarray) -> None:
        """A query's rows against its session (caller holds s.lock): all aligned (the owner knows the alignment's
        size, so this refusal tells it nothing: rule 4), none a training row under the policy."""
        self.aligned_rows(session_id, s, sample_index)
        if self.policy.refuse_training_ids:
            used = sample_index[s.trained_index.members(sample_index) | s.passive_trained.members(sample_index)]
            if used.size:
                raise PermissionDenied(
                    f"refused: {used.size} requested sample(s) were used in training (e.g. index {used.min()})"
                )

    def _within_budget(self, scored: int, n: int) -> int:
        """The owner's count ``scored`` with ``n`` more rows, else RESOURCE_EXHAUSTED past the budget."""
        if self.policy.budget and scored + n > self.policy.budget:
            raise ResourceExhausted(
                f"query budget exhausted: {scored} of {self.policy.budget} samples scored, {n} more requested"
            )
        return scored + n

    @staticmethod
    def _open_query(s: CoordinatorSession, sample_index: np.ndarray, spent: int) -> tuple[str, int]:
        """An admitted query, open until its rows are released (caller holds s.lock); its id and the owner's total."""
        query_id = secrets.token_hex(16)
        while len(s.queries) >= MAX_OPEN_QUERIES:  # the oldest open query lapses (a failed Predict leaves one)
            del s.queries[next(iter(s.queries))]
        s.queries[query_id] = Query(Counter(sample_index.tolist()), spent=spent)
        return query_id, spent

    def _query(self, s: CoordinatorSession, query_id: str) -> Query:
        common.require_query_id(query_id)
        try:
            return s.queries[query_id]
        except KeyError:
            raise FailedPrecondition(f"no open query {query_id!r} in this session (AdmitQuery first)") from None

    def submit_share(
        self, session_id: str, query_id: str, caller: str, sample_index: np.ndarray, share: bytes
    ) -> None:
        """A passive party's share (words of Z_2^64, under its zero-sum mask) for rows of an admitted query, kept
        until the owner releases those rows."""
        error = self.submit_shares(session_id, caller, [(query_id, sample_index, share)])[0]
        if error is not None:
            raise error

    def submit_shares(
        self, session_id: str, caller: str, shares: Sequence[tuple[str, np.ndarray, bytes]]
    ) -> list[ServiceError | None]:
        """:meth:`submit_share` for each (query id, rows, share) in order; a refused entry is returned in its place
        (None: kept) and the others are kept."""
        common.require_entries(len(shares), "shares")
        s = self.session(session_id)
        if caller not in s.passive_parties:
            raise PermissionDenied(f"{caller} is not a passive party of session {session_id!r}")
        width = s.trainer.share_width
        words = [_request_error(_share_words, share, len(index), width) for _, index, share in shares]
        outcomes: list[ServiceError | None] = [w if isinstance(w, ServiceError) else None for w in words]
        with s.lock:
            s.check_releasable()
            for i, (query_id, sample_index, _) in enumerate(shares):
                if outcomes[i] is None:
                    try:
                        self._keep_share(s, query_id, caller, sample_index, words[i])  # type: ignore[arg-type]
                    except ServiceError as exc:
                        outcomes[i] = exc
        return outcomes

    def _keep_share(
        self, s: CoordinatorSession, query_id: str, caller: str, sample_index: np.ndarray, words: np.ndarray
    ) -> None:
        """One passive share kept for its query's rows (caller holds s.lock)."""
        query = self._query(s, query_id)
        rows = query.check_rows(sample_index)
        # Counted per party: one party's row groups never take another's place (review 11: a passive party filled
        # the query's slots and an honest party's share was refused)
        waiting = sum(1 for held in query.shares.values() if caller in held)
        if caller not in query.shares.get(rows, {}) and waiting >= MAX_PENDING_CHUNKS:
            raise ResourceExhausted(
                f"query {query_id!r} has {MAX_PENDING_CHUNKS} chunks of {caller} waiting for release"
            )
        query.shares.setdefault(rows, {})[caller] = words

    def release_scores(
        self, session_id: str, query_id: str, own_share: bytes, sample_index: np.ndarray
    ) -> ReleasedScores:
        """Scores of admitted rows: the sum of every passive party's share for exactly these rows and the owner's own
        share, added in Z_2^64 where the zero-sum masks cancel (services/crypto/ring_mask.py): nothing is decrypted,
        and no share is ever seen unmasked (each is a one-time pad on its own)."""
        return _one(self.release_batch(session_id, [(query_id, sample_index, own_share)]))

    def release_batch(
        self, session_id: str, queries: Sequence[tuple[str, np.ndarray, bytes]]
    ) -> list[ReleasedScores | ServiceError]:
        """:meth:`release_scores` for each (query id, rows, own share) in order, each its own sum and its own pass
        through the score-release chain (as alone); a refused entry is returned in its place."""
        common.require_entries(len(queries), "queries")
        s = self.session(session_id)
        width = s.trainer.share_width
        outcomes: list = [_request_error(_share_words, share, len(index), width) for _, index, share in queries]
        with s.lock:
            spent = [s.queries[q].spent for q, _, _ in queries if q in s.queries]
        self._commit_ledger(s.owner, max(spent, default=0))  # these queries' budget is durable before any release
        with s.lock:
            s.check_releasable()
            for i, (query_id, sample_index, _) in enumerate(queries):
                if not isinstance(outcomes[i], ServiceError):
                    try:
                        outcomes[i] = self._take_shares(s, query_id, sample_index, outcomes[i])
                    except ServiceError as exc:
                        outcomes[i] = exc
        raws = [
            None if isinstance(every, ServiceError) else self._scored_sum(s, every)  # type: ignore[arg-type]
            for every in outcomes
        ]
        chain = self.score_chain.describe()
        with s.lock:
            for i, raw_z in enumerate(raws):
                if raw_z is not None:
                    raw, z = raw_z
                    scores = self.score_chain(raw, z, s.release)  # the release RNG and cache are per session
                    # A statistic, checkpointed with the session's next save: nothing decides on it (the budget is
                    # the owner's ledger, durable before the release), so no release waits for a session write.
                    s.scored += len(raw)
                    changed = int(np.count_nonzero(scores.argmax(axis=1) != raw.argmax(axis=1)))
                    outcomes[i] = ReleasedScores(scores, chain, changed)
        return outcomes  # type: ignore[return-value]

    def _take_shares(
        self, s: CoordinatorSession, query_id: str, sample_index: np.ndarray, own: np.ndarray
    ) -> list[np.ndarray]:
        """Every share of one query's rows, the owner's first; the rows are taken (caller holds s.lock)."""
        query = self._query(s, query_id)
        rows = query.check_rows(sample_index)
        shares = query.shares.get(rows, {})
        missing = [party for party in s.passive_parties if party not in shares]
        if missing:
            raise FailedPrecondition(f"{', '.join(missing)} sent no share for these rows of query {query_id!r}")
        # The rows are taken now, released or not: a request that fails from here on was the owner's.
        del query.shares[rows]
        query.remaining -= Counter(rows)
        if not query.remaining:
            del s.queries[query_id]
        return [own, *(shares[party] for party in s.passive_parties)]

    def _scored_sum(self, s: CoordinatorSession, every: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """(scores, aggregate) of one query's shares, before the release chain."""
        if getattr(s.model, "selects_share_columns", False):
            z = self._selected(s, every)
        else:
            # Rule 4: no check on the sum may refuse (an owner shifting its own share by c would read from a refusal
            # whether the passive logit exceeds −c). An honest sum lies far inside SCORE_BOUND; one beyond it (a
            # crafted own share) is clipped to it and scored like any other, so the owner learns of it only what
            # the release chain lets through.
            z = ring_mask.open_sum(every, SCORE_BOUND)
        return s.trainer.scores(z), z

    def _selected(self, s: CoordinatorSession, shares: Sequence[np.ndarray]) -> np.ndarray:
        """A family that selects share columns (a tree): each party's share (by position, the owner's first, with no
        mask) read apart, each column taken from its owner's share alone and every other party's value in it never
        used, so that what a share says (or a refusal of it) depends on its own party's values only."""
        owners = np.asarray(s.trainer.column_owners())  # type: ignore[attr-defined]  # selects_share_columns
        z = np.zeros((shares[0].shape[0], owners.size))
        for position, share in enumerate(shares):
            own = owners == position
            z[:, own] = ring_mask.decode(share)[:, own]
        return z

    def _peer(self, party: str) -> PassivePeer:
        try:
            return self.passives[party]
        except KeyError:
            raise FailedPrecondition(f"the coordinator has no address for passive party {party!r}") from None

    def release_model(self, session_id: str) -> ReleasedParams:
        """Each passive block through the parameter-release chain, the bias offset the chain adds, and the
        parameters the key holder's trainer releases (split-NN: the top model, with the passive bottoms pulled at
        FinishTraining unless the chain withholds them).

        The steps run at each passive party (its data statistics never leave it); the coordinator checks
        every step's output against the true block it holds (e.g. the achieved interpretability level g).
        """
        s = self.session(session_id)
        if s.passive_weights is None:
            raise FailedPrecondition("the model is released after training: call FinishTraining first")
        disclosed, offset = self._disclosed_blocks(session_id, s)
        call = families.ReleaseCall(
            session_id, self.param_chain.specs, lambda p: self._peer(s.passive_parties[p - 1])
        )
        # Pulled passive tensors go out as LR's blocks do under an empty chain; any step (withhold) keeps them home.
        tensors = {**s.trainer.released(call), **({} if self.param_chain.steps else s.passive_tensors)}
        return ReleasedParams(disclosed, offset, tensors, self.param_chain.describe())

    def _disclosed_blocks(
        self, session_id: str, s: CoordinatorSession
    ) -> tuple[dict[str, np.ndarray | None], np.ndarray | None]:
        if not self.param_chain.steps:
            return dict(s.passive_weights), None
        disclosed: dict[str, np.ndarray | None] = {}
        offset: np.ndarray | None = None
        for party, true_block in s.passive_weights.items():
            block: np.ndarray | None = true_block
            results = self._peer(party).disclose(session_id, self.param_chain.specs)
            for step, (name, result) in zip(self.param_chain.steps, results, strict=False):
                if name != step.name:
                    raise FailedPrecondition(f"{party} ran step {name!r} where {step.name!r} was due")
                try:
                    step.check(block, result)
                except ValueError as exc:
                    raise FailedPrecondition(f"{party}'s disclosure failed the coordinator's check: {exc}") from exc
                block = result.disclosed
                if block is not None and result.bias_offset is not None:
                    offset = result.bias_offset if offset is None else offset + result.bias_offset
            disclosed[party] = block
        return disclosed, offset

    def close(self, session_id: str) -> None:
        s = self.sessions.close(session_id)
        for epoch in [] if s is None else list(s.epochs):
            self.epoch_keys.remove(_epoch_file(session_id, epoch))


def _epoch_file(session_id: str, epoch: int) -> str:
    # One name per (session, epoch): the epoch is the digits after the last ".e".
    return f"{session_id}.e{epoch}"


def _request_error(check: Callable[..., Any], *args: Any) -> Any:
    """``check(*args)``'s result, or the ServiceError it raised (an entry of a batched call refused in its place)."""
    try:
        return check(*args)
    except ServiceError as exc:
        return exc


def _one(outcomes: Sequence[Any]) -> Any:
    """The single entry of a batched call's outcomes, raised when it is a refusal."""
    (outcome,) = outcomes
    if isinstance(outcome, ServiceError):
        raise outcome
    return outcome


def _check_replayed_scores(keys: he.Backend, replay: TrainingStep) -> None:
    """A step's [[p]] as a checkpoint kept it, before it is given again: one an earlier version made (before session
    19 in the fresh form, he.FRESH) no party accepts now, so its replay is refused, the step's answers staying spent
    (a new [[p]] for the step would be a second sample of it). Decided from the bytes, not the checkpoint's version."""
    try:
        keys.check_form(he.deserialize_all(keys, replay.scores, replay.layout.ct_size), product=False, form=he.LOWERED)
    except ValueError as exc:
        raise FailedPrecondition(
            f"step {replay.step}'s training scores were kept by an earlier coordinator version in a form no party "
            f"accepts now ({exc}); the step cannot be replayed: open a new session"
        ) from None


def _share_words(share: bytes, rows: int, width: int) -> np.ndarray:
    """A share's words (inference, or the owner's of a training step), (rows, width), else INVALID_ARGUMENT naming the
    field."""
    if rows < 1:
        raise InvalidArgument("sample_index is empty")
    return families.share_words(share, rows, width)


def _flood(sums: np.ndarray, sigma: float, rng: entropy.CryptoRandom) -> np.ndarray:
    """Released block sums: plus Gaussian noise far above the CKKS decoding error, on a fixed grid. ``rng`` is
    keyed by the answer's seed (from OS entropy), so a re-decryption after a restart releases the same sums."""
    if sigma == 0:
        return sums
    noisy = sums + rng.normal(0.0, sigma, sums.shape)
    return np.round(noisy / he.BLOCK_SUM_GRID) * he.BLOCK_SUM_GRID

