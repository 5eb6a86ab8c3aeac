"""The linear system an LR model puts on one block of features: A = D·W, its rank, pseudo-inverse and projectors.

D is the difference operator on logits (log-ratios against class 0), so ``A x = b`` is what released scores
say about the features behind a weight block W. The attacks solve it (services/attacks/) and the parameter
defenses forecast and maximise the attacks' error through it (services/defenses/params.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

# Singular values below RANK_RTOL · σ_max count as zero: rassouli's rank(A) and Null(A) must be numerical.
RANK_RTOL = 1e-9


def difference_operator(k_logits: int, n_classes: int) -> np.ndarray:
    """D with D z = (logit log-ratios against class 0); (C − 1) × K_logits."""
    if k_logits == 1:
        if n_classes != 2:
            raise ValueError("a single sigmoid logit implies n_classes == 2")
        return np.ones((1, 1))
    if k_logits != n_classes:
        raise ValueError(f"K_logits must be 1 or C; got {k_logits} for C = {n_classes}")
    return np.hstack([-np.ones((n_classes - 1, 1)), np.eye(n_classes - 1)])


@dataclass(frozen=True)
class PassiveSystem:
    """A (shared by all samples) and its SVD-derived projectors; b is per sample (rows)."""

    a: np.ndarray  # (m, d_p)

    @cached_property
    def _svd(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return np.linalg.svd(self.a, full_matrices=True)

    @cached_property
    def rank(self) -> int:
        s = self._svd[1]
        if s.size == 0 or s[0] == 0.0:
            return 0
        return int(np.sum(s > RANK_RTOL * s[0]))

    @property
    def d(self) -> int:
        return int(self.a.shape[1])

    @cached_property
    def pinv(self) -> np.ndarray:
        """A⁺ built from the numerically non-zero singular values only; (d_p, m)."""
        u, s, vt = self._svd
        r = self.rank
        return (vt[:r].T / s[:r]) @ u[:, :r].T

    @cached_property
    def null_basis(self) -> np.ndarray:
        """W = [v_{r+1} … v_d] with orthonormal columns, I − A⁺A = W Wᵀ; (d_p, d_p − r), possibly empty."""
        return self._svd[2][self.rank :].T.copy()

    @cached_property
    def row_basis(self) -> np.ndarray:
        """V_r = [v_1 … v_r]: orthonormal basis of Row(A), the complement of :attr:`null_basis`; (d_p, r)."""
        return self._svd[2][: self.rank].T.copy()

    @property
    def determined(self) -> bool:
        """Full column rank: the system has one solution, so LS is exact on exact scores (luo's d_p ≤ C − 1)."""
        return self.rank == self.d

    def least_squares(self, b: np.ndarray) -> np.ndarray:
        """x_LS = A⁺ b for every row of b: the minimum-norm point of the solution space S."""
        return b @ self.pinv.T

    def half_star(self, b: np.ndarray) -> np.ndarray:
        """x_Half* = A⁺ b + ½ (I − A⁺A) 1: the point of S nearest to ½·1 (rassouli Prop. 1)."""
        w = self.null_basis
        return self.least_squares(b) + 0.5 * (w @ (w.T @ np.ones(self.d)))
