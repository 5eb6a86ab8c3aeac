"""A coordinator session's state: the key epochs, the training step in progress and the answers given for it, the
queries in flight, and its checkpoint form (:meth:`CoordinatorSession.to_state` / ``from_state``). The engine that
runs the calls on it is coordinator.py."""

from __future__ import annotations

import functools
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vflsec.services.crypto import entropy, he
from vflsec.services.defenses.release import ReleaseContext
from vflsec.services.engines import checkpoint
from vflsec.services.engines.sessions import RowSet
from vflsec.services.errors import FailedPrecondition, InvalidArgument
from vflsec.services.models import family as families


@dataclass
class Answer:
    """A party's one block-sums request of a step, checkpointed before any byte of it is parsed.

    In progress (neither ``sums`` nor ``refused``) is seen only after a restart: the same request is then
    decrypted again, flooded from the same ``seed`` (drawn from OS entropy at admission), so the party gets the
    very sums it would have had, never a second independent flooding sample.
    """

    digest: str  # of the request's ciphertexts
    seed: bytes  # key of the flooding noise's stream
    sums: np.ndarray | None = None  # the released sums
    refused: str | None = None  # the refusal's message (INVALID_ARGUMENT), replayed to every repeat
    tag: str | None = None  # the request's mask_tag (hex): repeats under another are refused; None: kept by none


@dataclass
class TrainingStep:
    """The [[p]] the coordinator issued for one step, and the block sums it answered for it.

    A replay of the step (after a crash) gets the same [[p]] bytes back, so honest parties rebuild products of
    the same masks (keyed by step and δ; re-randomised, so not the same bytes); each party gets one decryption per
    step, and every repeat of its request is answered again from ``answers``.
    """

    step: int
    layout: he.MatrixLayout
    sample_index: np.ndarray
    scores: list[bytes]  # serialized [[p]] ciphertexts (LR)
    answers: dict[str, Answer] = field(default_factory=dict)  # per party (LR)
    gradient: np.ndarray | None = None  # a family step's answer (split-NN: ∂L/∂h), checkpointed as current/gradient
    loss: float = 0.0


@dataclass
class Query:
    """An admitted query: rows still to release, and the passive shares received for them (rows -> party)."""

    remaining: Counter[int]
    shares: dict[tuple[int, ...], dict[str, np.ndarray]] = field(default_factory=dict)  # words of Z_2^64
    spent: int = 0  # the owner's admitted count with this query: the ledger holds at least it before any release

    def check_rows(self, index: np.ndarray) -> tuple[int, ...]:
        rows = tuple(index.tolist())
        if not rows:
            raise InvalidArgument("sample_index is empty")
        extra = Counter(rows) - self.remaining
        if extra:
            raise FailedPrecondition(
                f"row {min(extra)} is not an unreleased row of this query (admit every row with AdmitQuery)"
            )
        return rows


class MeteredKeys:
    """A key epoch's keys as a family step gets them (family.MeteredKeys): every decryption is charged, slot by slot,
    to the key's budget before it happens; past he.KEY_BUDGET it is refused and nothing is decrypted. The keys are
    fetched (made, when the step opens an epoch) only when the step first uses them: a step that decrypts nothing
    (split-NN's masked sum) costs no key generation."""

    def __init__(self, keys: Callable[[], he.Backend], charge: Callable[[int], None]) -> None:
        self._fetch, self._charge = keys, charge

    @functools.cached_property
    def _keys(self) -> he.Backend:
        return self._fetch()

    @property
    def slots(self) -> int:
        return self._keys.slots

    @property
    def name(self) -> str:
        return self._keys.name

    def check_form(self, cts: Sequence[Any], *, product: bool, form: he.Form = he.FRESH) -> None:
        self._keys.check_form(cts, product=product, form=form)

    def deserialize(self, data: bytes) -> Any:
        return self._keys.deserialize(data)

    def size(self, ct: Any) -> int:
        return self._keys.size(ct)

    def decrypt(self, ct: Any) -> np.ndarray:
        self._charge(self._keys.size(ct))
        return self._keys.decrypt(ct)


@dataclass
class CoordinatorSession:
    # Training keys per epoch: step s runs under epoch s // rotation (docs/protocol.md, "Key epochs"). Only the
    # epochs a step can still need are kept: the last step's (a replay) and possibly the next step's.
    epochs: dict[int, he.Backend]
    rotation: int  # T, the key epoch length in steps, from the approved widths (he.key_rotation_steps)
    public_context: bytes  # epoch 0's, as OpenSession returned it (parties parse ciphertexts with it)
    n_classes: int
    passive_parties: tuple[str, ...]
    owner: str  # the active party that opened the session
    release: ReleaseContext
    family: str  # the model family (services/models/family.py), chosen at OpenSession
    trainer: families.KeyHolderTrainer  # the family's maths (and state) at the key holder
    # Block width per party (columns of its gradient products), as the active party reported them at the
    # first training step; each party must declare the same width for itself when it fetches block sums.
    widths: dict[str, int] = field(default_factory=dict)
    current: TrainingStep | None = None
    last_step: int = 0
    # Slots decrypted for family steps under each training key epoch still held (rule 2): charged before decryption
    spent: dict[int, int] = field(default_factory=dict)
    passive_weights: dict[str, np.ndarray] | None = None
    # Named passive tensors pulled at FinishTraining (split-NN: bottom/<p>/...), released unless the chain withholds
    passive_tensors: dict[str, np.ndarray] = field(default_factory=dict)
    trained_index: RowSet = field(default_factory=RowSet)  # common indices seen in training batches
    # Rows every passive party aligned, in their own word (the coordinator runs no PSI): every family's training rows
    # lie below it. Asked at the first training step and kept (a session aligns once); None until then.
    aligned: int | None = None
    scored: int = 0  # samples released so far in this session (the budget is per owner: Coordinator.scored)
    finished_step: int | None = None  # last_step at FinishTraining: scores are released only at this step
    passive_trained: RowSet = field(default_factory=RowSet)  # rows the passive parties say they trained on
    queries: dict[str, Query] = field(default_factory=dict)  # in flight; lost on restart (budget stays spent)
    # Why every call on this session is refused (FAILED_PRECONDITION) but CloseSession: set at restore when the
    # configuration changed under it ([policy] allowed_backends, [schema], [limits] key_rotation_steps).
    refused: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def model(self) -> families.ModelFamily:
        return families.get(self.family)

    @property
    def backend(self) -> he.Backend:
        """The newest training keys: parsing, form checks and sizes are the same under every epoch."""
        return self.epochs[max(self.epochs)]

    def epoch(self, step: int) -> int:
        return step // self.rotation

    def check_releasable(self) -> None:
        """Scores come from a finished model: after FinishTraining, and not while training again."""
        if self.finished_step is None:
            raise FailedPrecondition("no score release before training is finished (FinishTraining)")
        if self.last_step != self.finished_step:
            raise FailedPrecondition(
                f"the session is training (step {self.last_step}): no score release until FinishTraining"
            )

    def to_state(self) -> tuple[dict[str, np.ndarray], dict]:
        trainer_arrays, trainer_meta = self.trainer.to_state()
        arrays = {
            **trainer_arrays,
            "trained_index_bits": self.trained_index.packed(),
            "passive_trained_bits": self.passive_trained.packed(),
            **{f"passive/{p}": w for p, w in (self.passive_weights or {}).items()},
            **{f"pulled/{name}": t for name, t in self.passive_tensors.items()},
        }
        current = self.current
        if current is not None:
            arrays["current/index"] = current.sample_index
            arrays.update({f"current/score/{i}": checkpoint.from_bytes(b) for i, b in enumerate(current.scores)})
            arrays.update({f"current/answer/{p}": a.sums for p, a in current.answers.items() if a.sums is not None})
            if current.gradient is not None:
                arrays["current/gradient"] = current.gradient
        meta = {
            **trainer_meta,
            "family": self.family,
            "backend": self.backend.name,
            "n_classes": self.n_classes,
            "passive_parties": list(self.passive_parties),
            "owner": self.owner,
            "last_step": self.last_step,
            "scored": self.scored,
            "aligned": self.aligned,
            "finished_step": self.finished_step,
            "has_weights": self.passive_weights is not None,
            "widths": self.widths,
            "rotation": self.rotation,
            "epochs": sorted(self.epochs),
            "spent": {str(e): n for e, n in self.spent.items()},
            # No RNG state: release noise is drawn from OS entropy afresh, never replayed after a restart.
            "current": None
            if current is None
            else {
                "step": current.step,
                "layout": [list(current.layout.shape), current.layout.replicas, current.layout.rows_per_ct],
                "n_scores": len(current.scores),
                "loss": current.loss,
                "answers": {
                    party: {"digest": a.digest, "seed": a.seed.hex(), "refused": a.refused, "tag": a.tag}
                    for party, a in current.answers.items()
                },
            },
        }
        return arrays, meta

    @classmethod
    def from_state(
        cls,
        arrays: dict[str, np.ndarray],
        meta: dict,
        epoch_keys: Mapping[int, bytes],
        public_context: bytes,
    ) -> CoordinatorSession:
        weights = (
            # The blocks pulled at FinishTraining: every passive party's for LR, none for a family that keeps them
            {p: np.array(arrays[f"passive/{p}"]) for p in meta["passive_parties"] if f"passive/{p}" in arrays}
            if meta["has_weights"]
            else None
        )
        family = meta.get("family", families.DEFAULT)  # a checkpoint from before the family layer is LR's
        s = cls(
            epochs={e: he.restore_keyholder(meta["backend"], keys) for e, keys in epoch_keys.items()},
            rotation=meta["rotation"],
            public_context=public_context,
            n_classes=meta["n_classes"],
            passive_parties=tuple(meta["passive_parties"]),
            owner=meta["owner"],
            release=ReleaseContext(
                rng=entropy.os_entropy(), n_classes=meta["n_classes"], passive_weights=weights or {}
            ),
            family=family,
            trainer=families.get(family).restore_key_holder((arrays, meta)),
            widths=meta["widths"],
            last_step=meta["last_step"],
            spent={int(e): n for e, n in meta.get("spent", {}).items()},
            passive_weights=weights,
            scored=meta["scored"],
            aligned=meta.get("aligned"),
            trained_index=RowSet.restore(arrays, "trained_index"),
            finished_step=meta.get("finished_step"),
            passive_trained=RowSet.restore(arrays, "passive_trained"),
            passive_tensors={k[len("pulled/") :]: np.array(v) for k, v in arrays.items() if k.startswith("pulled/")},
        )
        current = meta["current"]
        if current is not None:
            shape, replicas, rows_per_ct = current["layout"]
            s.current = TrainingStep(
                current["step"],
                he.MatrixLayout(tuple(shape), replicas, rows_per_ct),
                np.array(arrays["current/index"]),
                [checkpoint.as_bytes(arrays[f"current/score/{i}"]) for i in range(current["n_scores"])],
                {
                    p: Answer(
                        a["digest"],
                        bytes.fromhex(a["seed"]),
                        np.array(arrays[f"current/answer/{p}"]) if f"current/answer/{p}" in arrays else None,
                        a["refused"],
                        a.get("tag"),
                    )
                    for p, a in current.get("answers", {}).items()
                }
                # A checkpoint of the previous format kept (digest, sums); NaN sums were the spent placeholder of
                # a refusal or a crash: decrypting those same bytes again gives that refusal, or their first answer.
                | {
                    p: Answer(d, entropy.new_key(), None if np.isnan(sums).all() else sums)
                    for p, d in current.get("digests", {}).items()
                    for sums in [np.array(arrays[f"current/answer/{p}"])]
                },
                np.array(arrays["current/gradient"]) if "current/gradient" in arrays else None,
                current.get("loss", 0.0),
            )
        return s
