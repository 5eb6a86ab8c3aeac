"""The one contract every attack implements: feature inference (the curious active party) and label inference (a
curious passive party).

An attack only ever sees an :class:`Observations` — what the adversary actually received (through the release chains,
or in training) plus its own data. Ground truth stays with the experiment harness, which compares a
:class:`Reconstruction` with the passive party's true features through :func:`mse` / :func:`mse_per_feature`, or its
``label_scores`` with the active party's true labels through :func:`auc`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from vflsec.services.registry import Plugin, PluginError, Registry

from .released import NotApplicable

if TYPE_CHECKING:
    from torch import nn

    from .released import ReleasedTree

__all__ = [
    "ATTACKS",
    "WHITE_BOX_NEEDS",
    "Attack",
    "NotApplicable",
    "Observations",
    "Reconstruction",
    "auc",
    "make_attack",
    "mse",
    "mse_per_feature",
    "register",
    "run_attack",
]


@dataclass(frozen=True)
class Observations:
    """Only what the active party received — never ground truth.

    ``w_active``/``bias``/``w_passive`` use the logit layout of the model: ``K_logits = 1`` rows for a binary
    sigmoid model (released scores are then ``[1 - p, p]``) and ``K_logits = C`` rows for a softmax model.

    Any other differentiable family (split NN) is released as ``score_model``, a float32 torch module with
    ``forward(x_active, x_passive) -> (rows, C)`` class probabilities on matching rows. In active-top split
    learning the active party also records the passive embeddings z_B (``embeddings``); the passive bottom
    model ``x_passive -> z_B`` is known only when released (``passive_bottom``).
    """

    x_active: np.ndarray  # (n, d_a) the adversary's own features for the queried samples
    scores: np.ndarray | None  # (n, C) released scores (possibly defended: noisy, rounded, ...)
    n_classes: int  # C
    d_passive: int  # number of passive features (the schema is known to the active party)
    w_active: np.ndarray | None = None  # (K_logits, d_a)
    bias: np.ndarray | None = None  # (K_logits,)
    w_passive: np.ndarray | None = None  # (K_logits, d_p) as disclosed; None when withheld
    train_x_active: np.ndarray | None = None  # the active party's own training rows (agnostic attacks)
    train_y: np.ndarray | None = None  # its labels for those rows
    release: tuple[str, ...] = ()  # names of the release steps that ran (informational)
    # The announced chains as (name, public params) steps — what a Kerckhoffs attacker knows of the defenses.
    score_chain: tuple[tuple[str, dict[str, str]], ...] = ()
    param_chain: tuple[tuple[str, dict[str, str]], ...] = ()
    embedding_chain: tuple[tuple[str, dict[str, str]], ...] = ()  # the passive parties' announced embedding defenses
    score_model: nn.Module | None = None  # the released model's scores (split NN); LR uses the blocks above
    embeddings: np.ndarray | None = None  # (n, width) recorded passive embeddings z_B (active-top)
    passive_bottom: nn.Module | None = None  # x_passive -> z_B, when the passive bottom model is released
    released_trees: tuple[ReleasedTree, ...] | None = None  # DT (one) or RF; passive thresholds None if withheld
    # A passive attacker (label inference): its n rows are the training rows it holds (``x_active`` is (n, 0): it has
    # no active features; ``d_passive`` its own width), and it received split-NN's ∂L/∂h in Backward, one row of
    # ``gradients`` per row and step: ``gradient_rows`` says which of the n rows, ``gradient_steps`` at which step.
    gradients: np.ndarray | None = None  # (m, E)
    gradient_rows: np.ndarray | None = None  # (m,) in 0..n-1
    gradient_steps: np.ndarray | None = None  # (m,)
    # The active party's gradient defenses as the session's settings name them (Kerckhoffs): (name, public params)
    gradient_chain: tuple[tuple[str, dict[str, str]], ...] = ()
    # Auxiliary knowledge, given by the harness only to an attack that asks (Attack.auxiliary_rows): the true passive
    # features (k, d_p) of k of the queried rows (their positions), which that attack is then not scored on.
    labelled_rows: np.ndarray | None = None
    labelled_passive: np.ndarray | None = None
    # A passive attacker's own side, in every family: its own feature rows (n, d_p); what its trained model makes of
    # them (``own_outputs``, (n, width): LR z_p = X_p W_pᵀ, split-NN h_p); LR: its own gradient δᵀX_p / b of each step
    # (``block_gradients``, (s, K, d_p)) with the positions of each step's batch (``block_rows``); trees: the positions
    # of the training rows of every node it saw (a node it searched, each side of a node it split), ``partitions``.
    x_own: np.ndarray | None = None
    own_outputs: np.ndarray | None = None
    block_gradients: np.ndarray | None = None
    block_rows: tuple[np.ndarray, ...] | None = None
    partitions: tuple[np.ndarray, ...] | None = None
    # Trees: the (tree, heap index) of each of ``partitions`` (a split's sides as its children), and the session's
    # public tree settings (kind, max_depth, n_trees, partition_defense, ...) — what a Kerckhoffs attacker knows.
    partition_nodes: tuple[tuple[int, int], ...] | None = None
    tree_settings: dict[str, Any] | None = None
    # Auxiliary labels, given only to a label attack that asks (Attack.auxiliary_rows): the true labels (k,) of the
    # rows ``labelled_rows``, which that attack is then not scored on.
    labelled_labels: np.ndarray | None = None

    def __post_init__(self) -> None:
        n, d_a = np.shape(self.x_active)
        if self.n_classes < 2:
            raise ValueError(f"n_classes must be >= 2, got {self.n_classes}")
        if self.d_passive < 1:
            raise ValueError(f"d_passive must be >= 1, got {self.d_passive}")
        if self.scores is not None and np.shape(self.scores) != (n, self.n_classes):
            raise ValueError(f"scores must have shape {(n, self.n_classes)}, got {np.shape(self.scores)}")
        k = self.k_logits
        for name, expected in (("w_active", (k, d_a)), ("w_passive", (k, self.d_passive)), ("bias", (k,))):
            value = getattr(self, name)
            if value is not None and np.shape(value) != expected:
                raise ValueError(f"{name} must have shape {expected}, got {np.shape(value)}")
        if (self.train_x_active is None) != (self.train_y is None):
            raise ValueError("train_x_active and train_y come together")
        if self.train_x_active is not None and np.shape(self.train_x_active)[1:] != (d_a,):
            raise ValueError(f"train_x_active must have {d_a} columns")
        if self.embeddings is not None and (np.ndim(self.embeddings) != 2 or len(self.embeddings) != n):
            raise ValueError(f"embeddings must have shape ({n}, width), got {np.shape(self.embeddings)}")
        if self.gradients is not None:
            m = len(self.gradients)
            if np.ndim(self.gradients) != 2:
                raise ValueError(f"gradients must have shape (m, width), got {np.shape(self.gradients)}")
            for name in ("gradient_rows", "gradient_steps"):
                if np.shape(getattr(self, name)) != (m,):
                    raise ValueError(f"{name} must have shape ({m},) beside the gradients")
            if m and not (np.min(self.gradient_rows) >= 0 and np.max(self.gradient_rows) < n):
                raise ValueError(f"gradient_rows must lie in 0..{n - 1}")
        given = (self.labelled_passive is not None) + (self.labelled_labels is not None)
        if (self.labelled_rows is None) != (given == 0) or given > 1:
            raise ValueError("labelled_rows come with either labelled_passive or labelled_labels")
        if self.labelled_rows is not None:
            rows = np.asarray(self.labelled_rows)
            if rows.ndim != 1 or len(np.unique(rows)) != len(rows) or np.any((rows < 0) | (rows >= n)):
                raise ValueError(f"labelled_rows must be distinct positions among the {n} queried rows")
            if self.labelled_labels is not None and np.shape(self.labelled_labels) != (len(rows),):
                got = np.shape(self.labelled_labels)
                raise ValueError(f"labelled_labels must have shape {(len(rows),)}, got {got}")
            if self.labelled_passive is not None and np.shape(self.labelled_passive) != (len(rows), self.d_passive):
                expected = (len(rows), self.d_passive)
                raise ValueError(f"labelled_passive must have shape {expected}, got {np.shape(self.labelled_passive)}")
        for name in ("x_own", "own_outputs"):
            value = getattr(self, name)
            if value is not None and (np.ndim(value) != 2 or len(value) != n):
                raise ValueError(f"{name} must have shape ({n}, width), got {np.shape(value)}")
        if self.partition_nodes is not None and len(self.partition_nodes) != len(self.partitions or ()):
            raise ValueError("partition_nodes must name the node of each partition")
        if (self.block_gradients is None) != (self.block_rows is None):
            raise ValueError("block_gradients and block_rows come together")
        if self.block_gradients is not None and (
            np.ndim(self.block_gradients) != 3 or len(self.block_gradients) != len(self.block_rows or ())
        ):
            raise ValueError("block_gradients must have shape (steps, K, d_p), one step per entry of block_rows")

    @property
    def n_samples(self) -> int:
        return int(np.shape(self.x_active)[0])

    @property
    def k_logits(self) -> int:
        """Rows of the weight blocks: taken from whichever block is present, else the softmax layout."""
        for value in (self.w_active, self.w_passive, self.bias):
            if value is not None:
                return int(np.shape(value)[0])
        return self.n_classes


@dataclass
class Reconstruction:
    """The adversary's estimate of the passive features (a feature attack) or of the labels (a label attack: binary
    labels, a score per row, higher for class 1, which the harness scores by AUC; more classes, a class per row, scored
    by accuracy); ``meta`` may hold per-sample arrays."""

    x_passive: np.ndarray | None  # (n, d_p); None from a label attack
    meta: dict[str, Any] = field(default_factory=dict)
    label_scores: np.ndarray | None = None  # (n,) label attacks
    label_predictions: np.ndarray | None = None  # (n,) a label attack's class per row (multi-class tasks)


# The LR white box: released scores plus every disclosed weight block.
WHITE_BOX_NEEDS = frozenset({"scores", "w_active", "w_passive", "bias"})


class Attack(Plugin, ABC):
    """A reconstruction algorithm; ``needs`` lists the :class:`Observations` fields that must be non-None and
    ``families`` the model families it can attack (services/registry.py); ``metric`` the figure its papers judge
    it by, which the harness scores beside the MSE: mse, accuracy (ye's binary recovery) or cbr (luo's trees).
    ``target`` is what it infers: "features" (the active party attacks) or "labels" (a passive party attacks; metric
    auc, and it returns ``label_scores``)."""

    needs: frozenset[str] = frozenset()
    metric: str = "mse"
    target: str = "features"

    def auxiliary_rows(self, n_samples: int) -> int:
        """How many of the ``n_samples`` queried rows' true passive features the attack is given: knowledge beyond
        the release (0 for every attack that knows only what it received). The harness draws that many rows, fills
        ``Observations.labelled_*`` and scores the attack on the other rows only."""
        return 0

    @abstractmethod
    def reconstruct(self, obs: Observations) -> Reconstruction:
        """Estimate ``x_passive`` (n, d_p) for the queried samples."""


_OBSERVATION_FIELDS = frozenset(f.name for f in fields(Observations))


def run_attack(attack: Attack, obs: Observations) -> Reconstruction:
    """Run ``attack`` after checking that every observation it needs was actually released."""
    unknown = attack.needs - _OBSERVATION_FIELDS
    if unknown:
        raise ValueError(f"{attack.name} declares unknown observation fields {sorted(unknown)}")
    missing = sorted(name for name in attack.needs if getattr(obs, name) is None)
    if missing:
        raise NotApplicable(f"{attack.name} needs {', '.join(missing)}, which the active party did not receive")
    result = attack.reconstruct(obs)
    if attack.target == "labels":  # binary tasks are scored by AUC (label_scores), others by accuracy (predictions)
        field_name = "label_scores" if obs.n_classes == 2 else "label_predictions"
        value = getattr(result, field_name)
        if value is None or np.shape(value) != (obs.n_samples,):
            got = None if value is None else np.shape(value)
            raise RuntimeError(f"{attack.name} returned {field_name} of shape {got}, expected {(obs.n_samples,)}")
        return result
    expected = (obs.n_samples, obs.d_passive)
    if result.x_passive is None or result.x_passive.shape != expected:
        got = None if result.x_passive is None else result.x_passive.shape
        raise RuntimeError(f"{attack.name} returned shape {got}, expected {expected}")
    return result


# Registered with ``@register("name")`` on the class or ``register("name", Class, **preset)`` for a variant.
ATTACKS: Registry[Attack] = Registry("attack")
register = ATTACKS.register


def make_attack(name: str, /, *, family: str | None = None, **options: Any) -> Attack:
    """Build the registered attack ``name`` with its keyword ``options`` (ValueError on an unknown name or option).

    ``family`` is the model family under attack: NotApplicable if the attack does not support it.
    """
    if family is not None and name in ATTACKS:
        try:
            ATTACKS.check_family(name, family)
        except PluginError as exc:
            raise NotApplicable(str(exc)) from None
    return ATTACKS.build(name, options)


def mse_per_feature(x_true: np.ndarray, x_hat: np.ndarray) -> np.ndarray:
    """Mean square error of each passive feature over the samples, shape (d_p,)."""
    x_true = np.asarray(x_true, dtype=float)
    x_hat = np.asarray(x_hat, dtype=float)
    if x_true.shape != x_hat.shape:
        raise ValueError(f"shape mismatch: {x_true.shape} vs {x_hat.shape}")
    return np.mean((x_hat - x_true) ** 2, axis=0)


def mse(x_true: np.ndarray, x_hat: np.ndarray) -> float:
    """MSE per feature, luo Eq. 10: (1 / (n d_p)) Σ_t Σ_i (x̂_ti − x_ti)²."""
    return float(np.mean(mse_per_feature(x_true, x_hat)))


def auc(y_true: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` for class 1 of binary ``y_true`` (ties count half): the chance that a
    random class-1 row scores above a random class-0 row. 0.5 is blind; 1 − AUC is the same ranking read upside down."""
    y = np.asarray(y_true).reshape(-1)
    s = np.asarray(scores, dtype=float).reshape(-1)
    if y.shape != s.shape:
        raise ValueError(f"shape mismatch: {y.shape} labels vs {s.shape} scores")
    positive = y == 1
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if not n_pos or not n_neg:
        raise ValueError("AUC needs rows of both classes")
    from scipy.stats import rankdata

    ranks = rankdata(s)  # average ranks: ties count half
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
