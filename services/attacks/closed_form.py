"""Closed-form attacks: the blind baselines and the pseudo-inverse family (luo §IV-A, rassouli §V).

All are O(n · d_p · (C − 1)) after one SVD of A, vectorised over the queried samples.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

import numpy as np

from vflsec.services.models.lr import PassiveSystem
from vflsec.services.registry import ANY_SCORES

from .base import WHITE_BOX_NEEDS, Attack, Observations, Reconstruction, register
from .linear import RobustSystem, robust_system


class LinearSystemAttack(Attack):
    """A white-box LR attack that only needs the system A x = b (one row of b per sample).

    It runs on the robust system (:func:`~.linear.robust_system`): per sample, the largest released score is
    the reference and zero or negative scores are dropped (``meta["dropped"]`` counts them per sample).
    """

    needs = WHITE_BOX_NEEDS
    families = frozenset({"lr"})

    def reconstruct(self, obs: Observations) -> Reconstruction:
        return self.reconstruct_system(robust_system(obs), obs.d_passive)

    def reconstruct_system(self, robust: RobustSystem, d_passive: int) -> Reconstruction:
        """Solve every group of a robust system (also used by the defense-aware attacks on de-biased scores)."""
        x, meta = robust.solve(self.solve, d_passive)
        return Reconstruction(x_passive=x, meta=meta)

    @abstractmethod
    def solve(self, system: PassiveSystem, b: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        """Estimate x for every row of b."""


class Esa(LinearSystemAttack):
    """Equation solving attack x̂ = A⁺b (luo Eq. 3–8; rassouli's LS), optionally clamped to [0, 1].

    Exact on exact scores iff A has full column rank — generically d_p ≤ C − 1 (C − 1 log-ratio equations;
    a binary model gives one equation whether it has one sigmoid or two softmax logits).
    """

    def __init__(self, clamp: bool = False) -> None:
        self.clamp = clamp

    def solve(self, system: PassiveSystem, b: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        x = system.least_squares(b)
        if self.clamp:
            x = np.clip(x, 0.0, 1.0)
        return x, {"exact": system.determined}


class HalfStar(LinearSystemAttack):
    """The point of the solution space nearest to ½·1 (rassouli Prop. 1); beats Half for every sample."""

    def __init__(self, clamp: bool = False) -> None:
        self.clamp = clamp

    def solve(self, system: PassiveSystem, b: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        x = system.half_star(b)
        return (np.clip(x, 0.0, 1.0) if self.clamp else x), {"exact": system.determined}


class Constant(Attack):
    """A blind estimate: the same value for every passive feature (Half = Chebyshev centre of [0, 1]^d)."""

    needs = frozenset()
    families = ANY_SCORES  # a blind guess needs nothing from the model

    def __init__(self, value: float) -> None:
        self.value = value

    def reconstruct(self, obs: Observations) -> Reconstruction:
        return Reconstruction(np.full((obs.n_samples, obs.d_passive), self.value), {})


class RandomGuess(Attack):
    """Uniform random guess on [0, 1]^d; by rassouli Lemma 1 its MSE exceeds Half's by Var(U) = 1/12."""

    needs = frozenset()
    families = ANY_SCORES  # a blind guess needs nothing from the model

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def reconstruct(self, obs: Observations) -> Reconstruction:
        rng = np.random.default_rng(self.seed)
        return Reconstruction(rng.uniform(size=(obs.n_samples, obs.d_passive)), {"seed": self.seed})


register("esa", Esa)
register("ls", Esa)
register("ls_clamped", Esa, clamp=True)
register("half_star", HalfStar)
register("half", Constant, value=0.5)
register("zero", Constant, value=0.0)
register("rg", RandomGuess)
