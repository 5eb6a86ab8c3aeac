"""Label inference by a passive party that knows the active party's gradient defense (Kerckhoffs): the attacks each
defense of services/defenses/gradients.py is held to, beside Li et al.'s norm and direction scoring (labels.py).

* :class:`AxisProjection` — against fresh noise (``max_norm``, ``marvell``, ``dp_gaussian``, ``discrete_sgd``'s
  unbiased rounding): the noise is zero-mean and drawn anew at every step, while a row's label, and so the side of
  the class axis its gradient lies on, is the same in every epoch. Each row's signed projection on the axis (not its
  cosine: the noise's norm would divide it), in units of its step's spread, averaged over the steps the row was
  seen in: k epochs shrink independent noise by √k. The axis is the top eigenvector of the gradients' second
  moment pooled over the last ``window`` steps (the top model moves little in a few steps; one noisy batch would
  estimate it poorly).
* :class:`NoiseResidual` — against ``max_norm`` in particular: it adds N(0, σ_j² I) with σ_j² = (M² − ‖g_j‖²)/E, so
  the energy a row has outside the few directions the gradients live in measures σ_j², hence ‖g_j‖² = M² − E σ_j²:
  norm scoring with the rescaling undone. Rows with less residual energy had larger gradients (the rarer class).

Both report a score for the rarer class (the projection's sign, an axis's, is set as the direction scoring's is: the
smaller cluster of rows on the positive side). ``positive`` names the class the attacker takes for the rarer one.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from scipy.stats import rankdata

from .base import Observations, Reconstruction, register
from .labels import _GradientLabelAttack, larger_cluster_above

__all__ = ["AxisProjection", "NoiseResidual"]


class _SignedByClusters(_GradientLabelAttack):
    """A gradient label attack whose scores' sign is arbitrary (an axis), set by the cluster sizes as direction
    scoring's is: the smaller cluster of rows is the rarer class."""

    def reconstruct(self, obs: Observations) -> Reconstruction:
        result = super().reconstruct(obs)
        rare = np.asarray(result.label_scores) * (1 if self.positive == 1 else -1)
        seen = np.bincount(np.asarray(obs.gradient_rows), minlength=obs.n_samples) > 0
        if larger_cluster_above(rare[seen]):
            result.meta["gradient_scores"] = -result.meta["gradient_scores"]
            result.label_scores = -np.asarray(result.label_scores)
        return result


def _pooled_axes(batches: list[np.ndarray], window: int) -> Iterator[np.ndarray]:
    """Per step, the top eigenvector of Σ gᵀg over the last ``window`` steps, its sign chained to the step before."""
    moments: list[np.ndarray] = []
    previous: np.ndarray | None = None
    for g in batches:
        moments.append(g.T @ g / max(len(g), 1))
        del moments[:-window]
        u = np.linalg.eigh(sum(moments))[1][:, -1]
        if previous is not None and u @ previous < 0:
            u = -u
        previous = u
        yield u


@register("axis_projection")
class AxisProjection(_SignedByClusters):
    """Kerckhoffs attacker against fresh gradient noise: signed projections on a pooled class axis, each in units of
    its step's spread, averaged over a row's steps (the noise shrinks by √steps; the label does not change)."""

    def __init__(self, positive: int = 1, window: int = 8) -> None:
        super().__init__(positive)
        if window < 1:
            raise ValueError(f"window must be >= 1 step, got {window}")
        self.window = window

    def _scores(self, batches: list[np.ndarray]) -> Iterator[np.ndarray]:
        for g, u in zip(batches, _pooled_axes(batches, self.window), strict=True):
            projection = g @ u
            spread = projection.std()
            yield projection / spread if spread > 0 else np.zeros(len(g))


@register("noise_residual")
class NoiseResidual(_GradientLabelAttack):
    """Kerckhoffs attacker against max-norm: a row's energy outside the gradients' top ``rank`` directions (pooled
    over ``window`` steps) estimates its noise variance, which max-norm makes M² − ‖g‖²: less residual, a larger
    gradient. Ranked within the step, averaged over the row's steps."""

    def __init__(self, positive: int = 1, rank: int = 1, window: int = 8) -> None:
        super().__init__(positive)
        if rank < 1 or window < 1:
            raise ValueError(f"rank and window must be >= 1, got {rank}, {window}")
        self.rank, self.window = rank, window

    def _scores(self, batches: list[np.ndarray]) -> Iterator[np.ndarray]:
        moments: list[np.ndarray] = []
        for g in batches:
            moments.append(g.T @ g / max(len(g), 1))
            del moments[:-self.window]
            top = np.linalg.eigh(sum(moments))[1][:, -self.rank :]
            residual = np.einsum("ij,ij->i", g, g) - np.sum((g @ top) ** 2, axis=1)
            yield rankdata(-residual) / len(g)
