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

__all__ = ["DirectionScoring", "NormScoring", "per_row"]


class _GradientLabelAttack(Attack):
    families = frozenset({"splitnn"})
    needs = frozenset({"gradients", "gradient_rows", "gradient_steps"})
    metric = "auc"
    target = "labels"

    def __init__(self, positive: int = 1) -> None:
        if positive not in (0, 1):
            raise ValueError(f"positive must be the class taken for the rarer one, 0 or 1, got {positive}")
        self.positive = positive

    def _batch_scores(self, g: np.ndarray) -> np.ndarray:
        """One step's rows (b, E) -> a score per row, higher for the rarer class."""
        raise NotImplementedError

    def reconstruct(self, obs: Observations) -> Reconstruction:
        if obs.n_classes != 2:
            raise NotApplicable(f"{self.name} scores binary labels (Li et al.); this task has {obs.n_classes} classes")
        g = np.asarray(obs.gradients, dtype=np.float64)
        scores = np.zeros(len(g))
        for rows in _steps(np.asarray(obs.gradient_steps)):
            scores[rows] = self._batch_scores(g[rows])
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


def per_row(scores: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    """The mean of each row's scores over the steps it was seen in; 0 (no evidence) for a row never seen."""
    total = np.bincount(rows, weights=scores, minlength=n)
    seen = np.bincount(rows, minlength=n)
    return np.divide(total, seen, out=np.zeros(n), where=seen > 0)


@register("norm")
class NormScoring(_GradientLabelAttack):
    """Li et al.'s norm scoring: ||∂L/∂h_i||₂, as its rank within the step's batch (in (0, 1]), so that steps late in
    training, whose gradients are small, count as much as the first ones. Larger: the rarer class."""

    def _batch_scores(self, g: np.ndarray) -> np.ndarray:
        return rankdata(np.linalg.norm(g, axis=1)) / len(g)


@register("cosine")
class DirectionScoring(_GradientLabelAttack):
    """Li et al.'s direction scoring without a labelled row: the cosine of ∂L/∂h_i with the batch's first principal
    direction u (top right singular vector of the uncentred batch: the axis the two classes' gradients lie on, on
    opposite sides). The paper's reference is the gradient of a row known to be positive; lacking one, u's sign is
    set so that fewer rows have a positive cosine (the rarer class's side)."""

    def _batch_scores(self, g: np.ndarray) -> np.ndarray:
        norms = np.linalg.norm(g, axis=1)
        unit = np.divide(g, norms[:, None], out=np.zeros_like(g), where=norms[:, None] > 0)
        u = np.linalg.svd(g, full_matrices=False)[2][0]
        cosine = unit @ u
        return -cosine if (cosine > 0).sum() > (cosine < 0).sum() else cosine
