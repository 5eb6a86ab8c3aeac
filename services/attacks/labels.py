"""Label inference by a curious passive party from the split-NN gradients it receives (Li et al., "Label Leakage and
Protection in Two-party Split Learning", ICLR 2022).

With softmax cross-entropy over two classes, ∂L/∂logits of row i is (p_i − e_{y_i}): its size is 1 − p_{y_i} and its
direction (1, −1) or (−1, 1) by the label. ∂L/∂h_i = J_iᵀ(p_i − e_{y_i}) carries both: while the model leans to the
prior, rows of the rarer class get the larger gradients (norm scoring), and the two classes' gradients point to
opposite sides of one axis (direction scoring). Both attacks score each row at each step where it arrived, within
that step's batch (gradients shrink as training goes on, and the top model's J changes), then average a row's scores
over its steps. Neither reads a label: their score is for "the rarer class", which the attacker names with
``positive`` (Li et al.'s setting: the positive class, 1, is the rare one).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from scipy.stats import rankdata

from .base import Attack, NotApplicable, Observations, Reconstruction, register

__all__ = ["DirectionScoring", "NormScoring", "larger_cluster_above", "per_row"]


class _GradientLabelAttack(Attack):
    families = frozenset({"splitnn"})
    needs = frozenset({"gradients", "gradient_rows", "gradient_steps"})
    metric = "auc"
    target = "labels"

    def __init__(self, positive: int = 1) -> None:
        if positive not in (0, 1):
            raise ValueError(f"positive must be the class taken for the rarer one, 0 or 1, got {positive}")
        self.positive = positive

    def _scores(self, batches: list[np.ndarray]) -> Iterator[np.ndarray]:
        """Each step's rows (b, E), in step order -> a score per row, higher for the rarer class."""
        raise NotImplementedError

    def reconstruct(self, obs: Observations) -> Reconstruction:
        if obs.n_classes != 2:
            raise NotApplicable(f"{self.name} scores binary labels (Li et al.); this task has {obs.n_classes} classes")
        g = np.asarray(obs.gradients, dtype=np.float64)
        steps = list(_steps(np.asarray(obs.gradient_steps)))
        scores = np.zeros(len(g))
        for rows, batch_scores in zip(steps, self._scores([g[rows] for rows in steps]), strict=True):
            scores[rows] = batch_scores
        rare = per_row(scores, np.asarray(obs.gradient_rows), obs.n_samples)
        # label_scores are for class 1: the rarer class's score if the attacker takes class 1 for it, else its negation
        return Reconstruction(
            None,
            {"gradient_scores": scores if self.positive == 1 else -scores, "steps": len(np.unique(obs.gradient_steps))},
            label_scores=rare if self.positive == 1 else -rare,
        )


def _steps(steps: np.ndarray) -> Iterator[np.ndarray]:
    """The gradient rows of each step, step by step."""
    order = np.argsort(steps, kind="stable")
    bounds = np.flatnonzero(np.diff(steps[order])) + 1
    yield from np.split(order, bounds)


def larger_cluster_above(values: np.ndarray) -> bool:
    """Split ``values`` in two at the threshold of least within-cluster variance (1-D two-means, Otsu's); True if the
    upper cluster holds more of them."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    if len(v) < 2:
        return False
    k = np.arange(1, len(v))  # the lower cluster is v[:k]
    total, squares = np.cumsum(v), np.cumsum(v * v)
    low = squares[:-1] - total[:-1] ** 2 / k
    high = (squares[-1] - squares[:-1]) - (total[-1] - total[:-1]) ** 2 / (len(v) - k)
    lower = int(k[np.argmin(low + high)])
    return len(v) - lower > lower


def per_row(scores: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    """The mean of each row's scores over the steps it was seen in; 0 (no evidence) for a row never seen."""
    total = np.bincount(rows, weights=scores, minlength=n)
    seen = np.bincount(rows, minlength=n)
    return np.divide(total, seen, out=np.zeros(n), where=seen > 0)


@register("norm")
class NormScoring(_GradientLabelAttack):
    """Label inference (Li et al.): norm scoring of the ∂L/∂h rows a passive party receives.

    ||∂L/∂h_i||₂ as its rank within the step's batch (in (0, 1]), so that steps late in training, whose gradients are
    small, count as much as the first ones. Larger: the rarer class."""

    def _scores(self, batches: list[np.ndarray]) -> Iterator[np.ndarray]:
        for g in batches:
            yield rankdata(np.linalg.norm(g, axis=1)) / len(g)


@register("cosine")
class DirectionScoring(_GradientLabelAttack):
    """Label inference (Li et al.): direction scoring of the ∂L/∂h rows a passive party receives, with no labelled row.

    The cosine of ∂L/∂h_i with its batch's first principal direction u_t (top right singular vector of the
    uncentred batch: the axis the two classes' gradients lie on, on opposite sides). The paper's reference is the
    gradient of a row known to be positive; lacking one, each u_t takes the sign that agrees with u_{t−1} (the top
    model, hence the axis, moves little in a step), and the whole chain the sign that puts the smaller of the two
    clusters of rows (two-means on the rows' mean cosines) on the positive side: the rarer class's. (A sign set per
    batch by its own count flips on batches where the classes are near even; and the classes' cosines need not
    straddle 0 when their directions are not opposite, so the split is the clusters'.)"""

    def reconstruct(self, obs: Observations) -> Reconstruction:
        result = super().reconstruct(obs)
        rare = np.asarray(result.label_scores) * (1 if self.positive == 1 else -1)  # the rarer side's, so far
        seen = np.bincount(np.asarray(obs.gradient_rows), minlength=obs.n_samples) > 0
        if larger_cluster_above(rare[seen]):
            result.meta["gradient_scores"] = -result.meta["gradient_scores"]
            result.label_scores = -rare if self.positive == 1 else rare
        return result

    def _scores(self, batches: list[np.ndarray]) -> Iterator[np.ndarray]:
        previous: np.ndarray | None = None
        for g in batches:
            norms = np.linalg.norm(g, axis=1, keepdims=True)
            unit = np.divide(g, norms, out=np.zeros_like(g), where=norms > 0)
            u = np.linalg.svd(g, full_matrices=False)[2][0]
            if previous is not None and u @ previous < 0:
                u = -u
            previous = u
            yield unit @ u
