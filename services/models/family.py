"""The model-family layer: what an engine hands a family's trainers, and the registry of families.

Flower's split: a server owns rounds, clients and history, a strategy owns the maths of a round. Here the
engines (services/engines/) own sessions, PSI, batches/epochs/resume, checkpoints, plugins, policy (minimum
batch, budgets, schema widths, key epochs, answer/replay bookkeeping) and release; a family owns the maths of
each training and inference step, at each role:

* :class:`ActiveTrainer` — drives one training step from the active party (talks to peers only through its
  :class:`ActiveContext`), gives the active party's plaintext part of an inference aggregate;
* :class:`PassiveTrainer` — answers the family's training messages at a passive party (LR: its masked share of z,
  backward [[δ]]; split-NN: bottom forward / backward), gives its part of an inference aggregate;
* :class:`KeyHolderTrainer` — the coordinator's side (LR: the masked sum z -> [[p]] and block sums; split-NN
  coordinator-top: the top model on the masked sum h = Σ h_p -> ∂L/∂h), and ``scores`` of an inference sum.

Family-specific messages travel through family links: plain-Python objects (protobuf stays in the links,
services/transport/, and the servicers, services/rpc/) that the engine hands over as ``ActiveContext.key_holder`` /
``passives`` and ``PassiveContext.key_holder``. A family's trainer state is ``to_state() -> (arrays, meta)``,
restored by its family's ``restore_*``; the engines checkpoint it beside their own fields.

Inference is family-agnostic: every party's additive share (``share_width`` columns: LR's logits, split-NN
coordinator-top's embedding) is masked and summed at the key holder, whose trainer turns the sum into scores;
the score-release chain then runs on them, so every score defense works for every family.

The vflsec.v1 services still carry LR's training messages (passive ShareTrainingLogits/Backward, the coordinator's
SubmitTrainingShare/ComputeTrainingScores/DecryptBlockSums; the two share RPCs run LR's declared steps): the
engines keep their policy checks (step order, replay, answers) and hand the maths to the trainer's family-specific
methods; a family's own service is the vflsec.v2 step.

A family's own messages (its proto service: split-NN's TopStep, a tree's NextNode, ...) are the
:class:`FamilyStep` objects it declares in :attr:`ModelFamily.steps`, per hosting role, each naming the roles
that may call it. An engine runs them through one method, ``family_call(session_id, caller, name, **payload)``:
it checks the caller against the declaration, takes the session lock, runs the step on the session's trainer
with a context of the engine's own services (:class:`KeyHolderContext`, :class:`PassiveContext`: admission of a
training step, training rows, a peer's link, ...) and checkpoints. The servicers derive their authorization
policy from the same declaration: a new family adds its package, proto service and servicer, never an engine edit.

Families are loaded by name (:func:`get`): the engines never import a family's package, a family registers
itself (:func:`register`) when its module in :data:`PACKAGES` is imported.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

from vflsec.services.common import distinct_rows
from vflsec.services.crypto import ring_mask
from vflsec.services.errors import FailedPrecondition, InvalidArgument

if TYPE_CHECKING:  # annotations only: a family's plain maths (and its users) need not load the HE backend
    from vflsec.services.crypto import he

T = TypeVar("T")
_Config = TypeVar("_Config")
State = tuple[dict[str, np.ndarray], dict[str, Any]]  # a checkpoint's named arrays and JSON document

DEFAULT = "lr"
# Families the registry can load by name: importing the module named registers the family.
PACKAGES: dict[str, str] = {
    "lr": "vflsec.services.models.lr.trainers",
    "splitnn": "vflsec.services.models.splitnn.trainers",
    "tree": "vflsec.services.models.tree.trainers",  # one module registers both: a tree and a forest
    "forest": "vflsec.services.models.tree.trainers",
}


@dataclass(frozen=True)
class TrainingConfig:
    """A session's training settings as its operator asked for them; unset ("" or 0): the family's default."""

    optimizer: str = ""
    learning_rate: float = 0.0
    l2: float = 0.0
    batch_size: int = 0  # 0: the family's default for the parties' widths
    seed: int = 0  # batch order and initial weights; never a secret draw

    def optimizer_values(self) -> dict[str, object]:
        """The optimiser's settings as plain values, for a family whose settings are only these."""
        return {"optimizer": self.optimizer, "learning_rate": self.learning_rate, "l2": self.l2}


@dataclass(frozen=True)
class ReleasedModel:
    """A trained model as released to the active party: named tensors, tagged with the family that reads them."""

    family: str
    tensors: dict[str, np.ndarray]


class Emit(Protocol):
    """Offer a received message to the receiving party's plugins (kinds: services/kinds.py)."""

    def __call__(self, kind: str, source: str, **fields: Any) -> None: ...


@dataclass(frozen=True)
class Received:
    """Ciphertexts as a link delivered them: parsed, as the bytes that arrived (what plugins record), and their
    fingerprint (masks of a step are keyed by it, so a replayed step rebuilds the same bytes)."""

    matrix: he.EncryptedMatrix
    blobs: list[bytes]
    digest: bytes


@dataclass
class ActiveContext:
    """What the active engine hands its trainer for one training step (``step`` >= 1, common row ``index``)."""

    session_id: str
    step: int
    epoch: int  # the step's epoch in its Train call, from 0 (split-NN's learning-rate schedule)
    backend: he.Backend  # the session's public keys (epoch 0): parsing and plaintext arithmetic only
    n_classes: int
    mask_key: bytes  # the session's mask-stream key (services/crypto/entropy.py keyed_stream)
    key_holder: Any  # the family's link to the coordinator
    passives: Mapping[str, Any]  # the family's link to each passive party, in party order
    emit: Emit
    features: Callable[[np.ndarray], np.ndarray]  # own feature rows of common indices
    labels: Callable[[np.ndarray], np.ndarray]  # own labels of common indices
    widths: Mapping[str, int]  # every party's block width, as the engine checks it against the schema
    spawn: Callable[..., Future]  # run fn(*args) beside the calls to the passive parties
    training_keys: Callable[[], he.Backend]  # the public keys of this step's key epoch (fetched when needed)
    sample_ids: Callable[[np.ndarray], list[str]] = lambda index: []  # own sample IDs of common indices
    # Per passive party, the key of its zero-sum masks, its own draw sent at JoinSession (split-NN's embeddings)
    share_mask_keys: Mapping[str, bytes] = field(default_factory=dict)
    # The session's gradient defenses (split-NN coordinator-top; services/defenses/gradients.py GradientChain): the
    # labels sent for training and the ∂L/∂h forwarded to the passive parties pass through it. None: none.
    gradient_defense: Any = None

    def each_passive(self, fn: Callable[[str, Any], T]) -> list[T]:
        """``fn(party, link)`` for every passive party concurrently; results in party order."""
        futures = [self.spawn(fn, party, link) for party, link in self.passives.items()]
        return [f.result() for f in futures]

    def passive_mask_keys(self) -> list[bytes]:
        """Every passive party's share-mask key, in party order (the owner's share subtracts each party's mask), else
        FAILED_PRECONDITION naming the parties that sent none at JoinSession."""
        missing = [party for party in self.passives if party not in self.share_mask_keys]
        if missing:
            raise FailedPrecondition(f"{', '.join(missing)} sent no share-mask key at JoinSession: open a new session")
        return [self.share_mask_keys[party] for party in self.passives]


def share_words(share: bytes, rows: int, width: int) -> np.ndarray:
    """A masked share's words in Z_2^64, (rows, width), else INVALID_ARGUMENT naming the field ``share``."""
    try:
        return ring_mask.from_bytes(share, (rows, width), "share")
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from exc


def _unavailable(*args: Any, **kwargs: Any) -> Any:
    raise FailedPrecondition("this engine service is not offered to a training message")


def _no_plugins(kind: str, source: str, **fields: Any) -> None:
    """The emit of a party that runs no plugins."""


@dataclass
class PassiveContext:
    """What the passive engine hands its trainer for one training message of step ``step``, or a family step."""

    session_id: str
    step: int
    backend: he.Backend  # the session's public keys (epoch 0): parsing and plaintext arithmetic only
    mask_key: bytes
    key_holder: Any  # the coordinator's link (a family's service on it: the attribute its family names)
    training_keys: Callable[[], he.Backend]  # the public keys of this step's key epoch (fetched when needed)
    features: Callable[[np.ndarray], np.ndarray] | None = None  # own feature rows of common indices (family messages)
    # Family steps only (the engine's services, under the session lock):
    # rows trained at step ``step``, now the session's last completed step
    completed: Callable[[np.ndarray, int], None] = _unavailable
    # this party's output for rows at training step ``step`` (0: inference) of a Train call's epoch, sent in the
    # clear: only on a plain session of a family that does so by design (PassiveTrainer.output_in_the_clear), under
    # the answer budget
    output_in_the_clear: Callable[[int, np.ndarray, int], np.ndarray] = _unavailable
    # this party's output for rows at training step ``step`` >= 1 (in order) of a Train call's epoch, to be sent
    # masked or encrypted: training_output(step, rows, epoch)
    training_output: Callable[[int, np.ndarray, int], np.ndarray] = _unavailable
    share_mask_key: bytes = b""  # this party's key of its zero-sum masks (split-NN's embeddings), its own draw
    defer: Callable[[Callable[[], Any]], None] = _unavailable  # run after the lock is released and the checkpoint
    # a deferred call's follow-up: run under the session lock again, then checkpoint (state that must wait for a peer)
    locked: Callable[[Callable[[], Any]], None] = _unavailable
    aligned_rows: int = 0  # this party's aligned rows (common indices 0..aligned_rows-1; 0 before PSI)
    # every row this party holds, aligned or not (scaled): what it fits a disclosed statistic on (rows it chose)
    shard: Callable[[], np.ndarray] | None = None
    min_training_rows: int = 2  # [policy] min_training_rows: a statistic this party discloses covers at least these
    min_node_rows: int = 1  # [policy] min_node_rows: a partition this party discloses leaves each side at least these
    # Offer what this party received to its own plugins (a curious passive party records what Backward carried)
    emit: Emit = _no_plugins
    sample_ids: Callable[[np.ndarray], list[str]] = lambda index: []  # own sample IDs of common indices
    owner: str = ""  # the session's active party: the sender of Backward
    index: np.ndarray | None = None  # Backward: the common rows of the step


# The answer a key holder's training step gives (split-NN: ∂L/∂h and the batch loss), kept for a replay.
StepAnswer = tuple[np.ndarray, float]


class MeteredKeys(Protocol):
    """One key epoch's keys as the coordinator engine lends them to a family (rule 2, docs/protocol.md): a family
    parses, checks and decrypts through them (``he.decrypt_matrix(keys, ...)``), and the engine charges every
    decrypted slot to the key's budget (he.KEY_BUDGET) before the slot is decrypted, durably, refusing
    (RESOURCE_EXHAUSTED) a decryption past it. No family counts for itself."""

    slots: int

    def check_form(self, cts: Sequence[Any], *, product: bool) -> None: ...

    def decrypt(self, ct: Any) -> np.ndarray: ...

    def deserialize(self, data: bytes) -> Any: ...


@dataclass
class KeyHolderContext:
    """What the coordinator engine hands a family step it hosts (under the session lock)."""

    session_id: str
    caller: int  # the caller's position: 0 the active party (the session's owner), 1..P its passive parties
    # Rule 2 for answers that are decisions (a tree node's split, one of O outcomes): decision(bits) charges
    # ``bits`` (>= log2 O) to the newest key epoch, or to fresh keys when that one cannot take them, and names the
    # epoch; a decision above the whole budget is refused (RESOURCE_EXHAUSTED). held_keys(epoch) are its keys (only
    # an epoch still held; nothing else of a decryption may leave), public_keys(epoch) their public context.
    decision: Callable[[int], int]
    held_keys: Callable[[int], he.Backend]
    public_keys: Callable[[int], bytes]
    peer: Callable[[int], Any]  # the link to the passive party at a position (its family's service: an attribute)
    # Rows below every passive party's aligned count (the engine asks once), else INVALID_ARGUMENT (nothing changed)
    check_rows: Callable[[np.ndarray], np.ndarray]
    trained: Callable[[np.ndarray], None]  # rows used in training (the training-ID refusal reads them)
    # One training step, admitted as every family's is (rows, widths, minimum batch, order; a repeat of the last
    # step gets its recorded answer): train(step, rows, widths, layout, compute) runs compute(the step's keys,
    # metered) once.
    train: Callable[
        [int, np.ndarray, Mapping[str, int], he.MatrixLayout, Callable[[MeteredKeys], StepAnswer]], StepAnswer
    ]
    min_training_rows: int = 2  # [policy] min_training_rows: a session trains on at least these rows
    min_node_rows: int = 1  # [policy] min_node_rows: no node of fewer (weighted) rows is split off
    last_step: int = 0  # the session's last admitted training step (0: none yet)
    # Checkpoint the session now (the step is checkpointed again when it ends): before a peer learns a decision
    save: Callable[[], None] = lambda: None

    def share_rows(self, sample_index: np.ndarray) -> np.ndarray:
        """The rows of a passive party's masked share (LR's training logits, split-NN's embeddings): aligned and
        distinct, else INVALID_ARGUMENT naming ``sample_index`` (on the request's own field)."""
        if not len(sample_index):
            raise InvalidArgument("sample_index is empty")
        rows = self.check_rows(sample_index)
        if not distinct_rows(rows):
            raise InvalidArgument("sample_index repeats a row")
        return rows


@dataclass(frozen=True)
class ReleaseCall:
    """What the coordinator hands its trainer at ReleaseModel: the parameter-release chain's steps (a passive party
    runs them on what it releases itself) and each passive party's link by position (1..P)."""

    session_id: str
    specs: Sequence[str]
    peer: Callable[[int], Any]


class Release(Protocol):
    """What the coordinator released (services/defenses/release.py ReleasedParams), as the active trainer reads it."""

    passive: Mapping[str, np.ndarray | None]  # each passive party's disclosed block (LR), None if withheld
    bias_offset: np.ndarray | None  # the parameter chain's offset to the bias (LR: PPS-A's flip)
    tensors: Mapping[str, np.ndarray]  # the key holder's named tensors (split-NN: the top model, pulled bottoms)


@dataclass(frozen=True)
class FamilyStep:
    """One of a family's own messages, hosted by an engine: ``run(trainer, ctx, **payload)`` -> the answer."""

    run: Callable[..., Any]
    callers: frozenset[str]  # certificate roles (services/common.py) that may call it: the owner is "active"
    # False: the step changes the session only through the engine's services, which checkpoint themselves
    checkpoint: bool = True


class ActiveTrainer(Protocol):
    # True when this party computes its own scores (split-NN active-top: the top model is here) instead of the
    # key holder releasing them: the trainer then has ``output_widths()`` (each passive party's output, sizing the
    # engine's chunks) and ``local_scores(ctx, index)``, which asks each passive party for its output in the clear.
    scores_locally: bool

    @property
    def share_width(self) -> int:
        """Columns of a party's inference share and of the aggregate the key holder sums."""
        ...

    def train_step(self, ctx: ActiveContext, index: np.ndarray) -> None:
        """One training step on common rows ``index``; its update is applied only once every party applied it."""
        ...

    def inference_share(self, x: np.ndarray) -> np.ndarray:
        """The active party's plaintext part of the inference aggregate for its feature rows ``x``."""
        ...

    def released(self, release: Release) -> ReleasedModel:
        """The model as this party holds it after the coordinator's release (its own part filled in)."""
        ...

    def to_state(self) -> State: ...


class PassiveTrainer(Protocol):
    # True when the family sends this party's output to the active party in the clear by design (split-NN
    # active-top's z_B): the engine then answers PlainForward, on a plain session only.
    output_in_the_clear: bool

    @property
    def share_width(self) -> int:
        """Columns of a party's inference share and of the aggregate the key holder sums."""
        ...

    def inference_share(self, x: np.ndarray) -> np.ndarray:
        """This party's plaintext part of the inference aggregate (masked and encrypted by the engine)."""
        ...

    def releasable(self) -> dict[str, np.ndarray]:
        """The named tensors the coordinator may pull at FinishTraining (and run through the parameter chain)."""
        ...

    def to_state(self) -> State: ...


class KeyHolderTrainer(Protocol):
    @property
    def share_width(self) -> int:
        """Columns of a party's inference share and of the aggregate the key holder sums."""
        ...

    def scores(self, aggregate: np.ndarray) -> np.ndarray:
        """Confidence scores (n, n_classes) of an inference aggregate: what the release chain gets."""
        ...

    def released(self, call: ReleaseCall) -> dict[str, np.ndarray]:
        """The named tensors this role releases to the active party at ReleaseModel (split-NN: the top model; a
        tree: its skeleton with the thresholds each passive party discloses through ``call``)."""
        ...

    def to_state(self) -> State: ...


class ModelFamily(Protocol):
    """One model family: its name, its protocol's sizes and bounds, and its per-role trainers."""

    name: str

    # Whether the coordinator pulls each passive party's block at FinishTraining for the parameter-release chain
    # (LR); a family that releases no passive parameters keeps them with their owners.
    releases_passive_blocks: bool

    # Optional ``selects_share_columns`` (default False): the key holder reads every party's inference share
    # apart and takes each column from the party its trainer's ``column_owners()`` names (a tree: a split node's
    # bit from its owner only, so no party's share can move, or have refused, another party's answer); the
    # shares then carry no zero-sum masks (:func:`masks_shares`).

    # The family's own messages: hosting role ("coordinator", "passive") -> step name -> its declaration.
    steps: Mapping[str, Mapping[str, FamilyStep]]

    def block_width(self, n_features: int, *, active: bool) -> int:
        """Columns of a party's block in the batch bound and the key-epoch count (LR: + the active bias column)."""
        ...

    def min_batch_size(self, widths: Iterable[int]) -> int: ...

    def default_batch_size(self, widths: Iterable[int]) -> int: ...

    def answers_per_step(self, widths: Iterable[int], n_classes: int) -> int:
        """Decrypted values the key holder answers per training step over all parties (sizes key epochs)."""
        ...

    def settings(self, values: Mapping[str, Any]) -> Any:
        """The family's training settings from plain values (defaults filled in); ValueError if invalid."""
        ...

    def new_active(
        self, n_classes: int, n_features: int, settings: Any, passive_features: Sequence[int] = ()
    ) -> ActiveTrainer: ...

    def restore_active(self, state: State) -> ActiveTrainer: ...

    def new_passive(self, n_classes: int, n_features: int, settings: Any) -> PassiveTrainer: ...

    def restore_passive(self, state: State) -> PassiveTrainer: ...

    def new_key_holder(self, n_classes: int, passive_parties: Sequence[str], settings: Any) -> KeyHolderTrainer: ...

    def restore_key_holder(self, state: State) -> KeyHolderTrainer: ...


class DictForm:
    """JSON-ready dict round trip for a frozen settings dataclass (session creation, checkpoints)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[_Config], data: dict[str, Any]) -> _Config:
        unknown = set(data) - {f.name for f in fields(cls)}  # type: ignore[arg-type]
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown field(s) {', '.join(sorted(unknown))}")
        return cls(**data)  # sequences come back as lists; __post_init__ makes them tuples again


def masks_shares(family_name: str) -> bool:
    """Whether a family's inference shares carry zero-sum masks: not for a family whose key holder takes each share
    column from its owner's share alone (``ModelFamily.selects_share_columns``: a tree's node bits), where masks
    would not cancel and the owner's column is what the key holder learns anyway."""
    return not getattr(get(family_name), "selects_share_columns", False)


def positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def batches(order: np.ndarray, batch_size: int, min_size: int | None = None) -> list[np.ndarray]:
    """An epoch's mini-batches: consecutive slices of its shuffled order. A last slice shorter than
    ``min_size`` (default ``batch_size``; the trainer passes the coordinator's minimum batch) joins the one before
    it, so that no batch falls below the bound; a shorter-than-``batch_size`` slice above it stays a step."""
    floor = batch_size if min_size is None else min_size
    cuts = list(range(0, len(order), batch_size))
    if len(cuts) > 1 and len(order) - cuts[-1] < floor:
        cuts.pop()
    return [order[a:b] for a, b in zip(cuts, [*cuts[1:], len(order)], strict=True)]


_FAMILIES: dict[str, ModelFamily] = {}


def register(family: ModelFamily) -> ModelFamily:
    if family.name in _FAMILIES and _FAMILIES[family.name] is not family:
        raise ValueError(f"model family {family.name!r} is registered twice")
    _FAMILIES[family.name] = family
    return family


def get(name: str = DEFAULT) -> ModelFamily:
    """The family registered as ``name``, importing its package on first use; ValueError if there is none."""
    if name not in _FAMILIES and name in PACKAGES:
        importlib.import_module(PACKAGES[name])
    try:
        return _FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown model family {name!r}; known: {sorted(PACKAGES)}") from None
