"""Parameter-release distortions (issue 5): what a passive party discloses of its weight block, and its risk forecast.

Only the **disclosed** copy of a passive block W_p (K_logits × d) changes; inference keeps the true W_p, so released
scores never change. Every distortion is a parameter-release step (a plug-in of :data:`release.PARAM_STEPS`) with a
single implementation, :meth:`Distortion.distort`, which runs at the passive party: it needs the party's own block,
its own data statistics (:class:`DataStats`) and the number of classes (public). The coordinator verifies each
result against the true block it holds with :meth:`Distortion.check`.

* ``ppsa`` — rassouli §VII-A (Proposition 4, Remark 6, Theorem 3): disclose W_p H⁻¹ for an orthonormal H.
  ``H=flip`` is H = −I with renormalisation: the disclosed model is the one trained on x′ = 1 − x, so the passive
  logit contribution W_p x = (−W_p) x′ + W_p 1 moves W_p 1 into the disclosed bias (:attr:`Distorted.bias_offset`).
  ``H=orthonormal`` is a secret Haar-random H; ``H=theorem3`` is H* = −V Uᵀ from svd(A⁺A K_0) = U S Vᵀ, the
  maximiser of the LS attack's MSE (81).
* ``varasteh`` — varasteh §V-B: the disclosed W_n is the one that maximises the attack MSE at interpretability
  loss g(W_n) = ε (eq. 33), by case: i (d ≥ k) W_n = W_p R, R on the Stiefel manifold, against Half* (39);
  ii (1 < d < k) likewise against LS (46); iii (d = 1) any W_n against LS (48) — Remark 11's closed form for k = 2,
  SciPy trust-constr for k > 2; iv (k = 2, d > 1, opt-in) any W_n against Half* (52). Remarks 10 and 13's secrecy
  options: a secret ε′ ~ U[0, ε] and hiding whether the scheme was applied at all.
* ``withhold`` — the block is not disclosed (black box for that party).
* ``thresholds`` — trees only: the passive thresholds are disclosed (luo's setting); without it they stay home.

The risk forecast (:func:`forecast`; rassouli Theorem 2 and Remark 3, varasteh eqs. 13, 21, 38, 45, 47, 51) is the
closed-form MSE of the unclipped LS and Half* attacks on exact scores, computed from the passive party's data
statistics and the block it is about to disclose. All of those formulas are instances of one identity: an attack
whose estimate is affine in the true features, x̂ = M x + m, has MSE (1/d)[Tr((I−M)K_0(I−M)ᵀ) − 2mᵀ(I−M)μ + mᵀm].
"""

from __future__ import annotations

import importlib
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from vflsec.services.defenses.release import PARAM_STEPS, DataStats, Distorted, Distortion
from vflsec.services.models.lr import PassiveSystem, difference_operator


class _OnFirstUse:
    """A module imported when first used: only the optimising defenses need torch and scipy, which cost a party
    ~3 CPU-s at start-up (every party imports this module through the release chains)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)


if TYPE_CHECKING:
    import torch
    from scipy import optimize
else:
    torch = _OnFirstUse("torch")
    optimize = _OnFirstUse("scipy.optimize")

__all__ = [
    "DEFAULT_WARN_FRACTION",
    "DataStats",
    "Distorted",
    "Distortion",
    "Ppsa",
    "Varasteh",
    "Withhold",
    "flip_gap",
    "forecast",
    "interpretability_loss",
    "make_distortion",
]

# Warn when a forecast attack MSE falls below this fraction of the blind Half baseline.
DEFAULT_WARN_FRACTION = 0.5

Estimator = Literal["ls", "half_star"]
Array = Any  # numpy array or torch tensor: the MSE algebra below is written once for both


# ------------------------------------------------------------------------------------------- statistics


# ------------------------------------------------------------------------------------ attack MSE algebra


def _affine_mse(m_mat: Array, m_vec: Array, eye: Array, k0: Array, mu: Array) -> Array:
    """MSE per feature of x̂ = M x + m: (1/d)[Tr((I−M)K_0(I−M)ᵀ) − 2mᵀ(I−M)μ + mᵀm] (numpy or torch)."""
    err = eye - m_mat
    total = ((err @ k0) * err).sum() - 2.0 * (m_vec * (err @ mu)).sum() + (m_vec * m_vec).sum()
    return total / eye.shape[0]


def _estimator_map(
    pinv: Array, a_true: Array, a_disc: Array, shift: Array, ones: Array, estimator: Estimator
) -> tuple[Array, Array]:
    """(M, m) of the attack run on the disclosed system A_n x = A x − shift (shift = D · bias offset).

    LS: x̂ = A_n⁺(A x − shift); Half*: the same plus ½(I − A_n⁺A_n)1 (rassouli Prop. 1).
    """
    m_mat = pinv @ a_true
    m_vec = -(pinv @ shift)
    if estimator == "half_star":
        m_vec = m_vec + 0.5 * (ones - pinv @ (a_disc @ ones))
    return m_mat, m_vec


def _np_attack_mse(
    a_true: np.ndarray, disclosed: PassiveSystem, shift: np.ndarray, stats: DataStats, estimator: Estimator
) -> float:
    d = stats.d
    ones = np.ones(d)
    m_mat, m_vec = _estimator_map(disclosed.pinv, a_true, disclosed.a, shift, ones, estimator)
    return float(_affine_mse(m_mat, m_vec, np.eye(d), stats.k0, stats.mu))


def interpretability_loss(w_true: np.ndarray, w_disclosed: np.ndarray) -> float:
    """varasteh eq. (33): g = ‖W_p − W_n‖²_F / (d · K_logits), the mean squared parameter distortion."""
    w_true = np.asarray(w_true, dtype=np.float64)
    w_disclosed = np.asarray(w_disclosed, dtype=np.float64)
    if w_true.shape != w_disclosed.shape:
        raise ValueError(f"disclosed block shape {w_disclosed.shape} differs from the true {w_true.shape}")
    return float(np.sum((w_true - w_disclosed) ** 2) / w_true.size)


# ------------------------------------------------------------------------------------------ the results


def _system(w: np.ndarray, n_classes: int) -> tuple[np.ndarray, PassiveSystem]:
    dop = difference_operator(w.shape[0], n_classes)
    return dop, PassiveSystem(dop @ w)


def _check_block(w_passive: np.ndarray, stats: DataStats | None) -> np.ndarray:
    w = np.asarray(w_passive, dtype=np.float64)
    if w.ndim != 2 or not np.isfinite(w).all():
        raise ValueError(f"a passive block must be a finite (K_logits, d) matrix, got shape {w.shape}")
    if stats is not None and stats.d != w.shape[1]:
        raise ValueError(f"block has {w.shape[1]} features but the data statistics have {stats.d}")
    return w


def forecast(
    w_passive: np.ndarray,
    stats: DataStats,
    n_classes: int,
    distorted: Distorted | None = None,
    *,
    warn_fraction: float = DEFAULT_WARN_FRACTION,
) -> dict[str, Any]:
    """Predicted MSE per feature of the unclipped LS and Half* attacks on exact scores, before release.

    ``distorted`` is what will be disclosed (None: the true block). Keys: ``half`` (the blind baseline
    Tr(K_½)/d), ``ls`` and ``half_star`` (None when withheld), ``rank``, ``rank_condition`` (d ≤ C − 1 and A
    of full column rank: an undistorted block is then reconstructed exactly), ``zero_error``, ``warnings``,
    ``undone``. The forecast is for a Kerckhoffs attacker: an ``undoable`` distortion is forecast as the true
    block (``undone`` True, with a warning); ``naive_ls`` / ``naive_half_star`` are then the MSEs of the
    attacker that takes the disclosed block at face value.
    """
    w = _check_block(w_passive, stats)
    if not 0.0 <= warn_fraction <= 1.0:
        raise ValueError(f"warn_fraction must lie in [0, 1], got {warn_fraction}")
    dop, true_system = _system(w, n_classes)
    d = stats.d
    half = float(np.trace(stats.k_half) / d)
    rank_condition = d <= n_classes - 1 and true_system.rank == d
    result: dict[str, Any] = {"d": d, "n_classes": n_classes, "rank": true_system.rank, "half": half}
    result["rank_condition"] = rank_condition
    disclosed = w if distorted is None else distorted.disclosed
    undone = distorted is not None and distorted.disclosed is not None and distorted.undoable
    warnings: list[str] = []
    if disclosed is None:
        result.update(ls=None, half_star=None, zero_error=False, withheld=True)
    else:
        offset = None if distorted is None else distorted.bias_offset
        shift = np.zeros(dop.shape[0]) if offset is None else dop @ np.asarray(offset, dtype=np.float64)
        disclosed_system = PassiveSystem(dop @ _check_block(disclosed, stats))
        for estimator in ("ls", "half_star"):
            mse = _np_attack_mse(true_system.a, disclosed_system, shift, stats, estimator)
            result["naive_" + estimator if undone else estimator] = mse
            if undone:  # the attacker maps the disclosure back to the true block first
                result[estimator] = _np_attack_mse(true_system.a, true_system, np.zeros_like(shift), stats, estimator)
        unchanged = undone or (np.array_equal(disclosed, w) and not np.any(shift))
        result.update(zero_error=bool(rank_condition and unchanged), withheld=False)
        if undone:
            warnings.append(
                "the disclosed block is undone from what the active party is told (the announced mechanism and "
                "parameters, the bias offset): this distortion protects nothing; forecast for the true block"
            )
    result["undone"] = undone
    if result["zero_error"]:
        warnings.append(f"d = {d} ≤ C − 1 = {n_classes - 1} with a full-rank system: LS reconstructs exactly")
    for estimator in ("ls", "half_star"):
        value = result[estimator]
        if value is not None and value < warn_fraction * half:
            warnings.append(
                f"forecast {estimator} MSE {value:.4g} is below {warn_fraction:g} × the Half baseline {half:.4g}"
            )
    result["warnings"] = warnings
    return result


def flip_gap(w_passive: np.ndarray, stats: DataStats, n_classes: int) -> float:
    """LS MSE added by ``ppsa:H=flip`` (x → 1 − x): (4/d) Tr(A⁺A K_½)."""
    w = _check_block(w_passive, stats)
    _, system = _system(w, n_classes)
    basis = system.row_basis
    return float(4.0 * np.sum((basis.T @ stats.k_half) * basis.T) / stats.d)


# ------------------------------------------------------------------------------------------ distortions


def make_distortion(spec: str) -> Distortion:
    """Build a distortion from a spec such as ``"varasteh:epsilon=0.01"`` (ReleaseConfigError on a bad spec)."""
    return PARAM_STEPS.parse(spec)


@PARAM_STEPS.register("withhold")
class Withhold(Distortion):
    """Disclose nothing: the active party gets no block for this party (every white-box attack is inapplicable).
    For trees (and forests) it keeps every passive party's thresholds and bins with their owner, for split-NN
    every passive bottom."""

    families = frozenset({"lr", "splitnn", "tree", "forest"})
    needs_stats = False

    def distort(
        self, w_passive: np.ndarray, stats: DataStats | None, n_classes: int, rng: np.random.Generator
    ) -> Distorted:
        _check_block(w_passive, stats)
        return Distorted(None, public={"step": self.name}, private={"withheld": True})


@PARAM_STEPS.register("thresholds")
class Thresholds(Distortion):
    """Trees: disclose every passive party's split thresholds and bins (luo's PRA / GRN-RF setting). A tree keeps
    them with their owners by default (docs/trees.md); this step is the one explicit option that releases them,
    so that the attacks of that setting can be measured. Each passive party discloses its own
    (services/models/tree/trainers.py ``_thresholds``)."""

    families = frozenset({"tree", "forest"})
    needs_stats = False

    def distort(
        self, w_passive: np.ndarray, stats: DataStats | None, n_classes: int, rng: np.random.Generator
    ) -> Distorted:
        return Distorted(w_passive, public={"step": self.name})


def _haar_orthonormal(d: int, rng: np.random.Generator) -> np.ndarray:
    """A Haar-distributed orthonormal matrix (QR of a Gaussian matrix with the sign ambiguity removed)."""
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    return q * np.where(np.diag(r) < 0, -1.0, 1.0)


@PARAM_STEPS.register("ppsa")
class Ppsa(Distortion):
    """rassouli PPS-A: disclose W_p H⁻¹ (= W_p Hᵀ) for an orthonormal H; see the module docstring."""

    def __init__(self, H: Literal["flip", "orthonormal", "theorem3"] = "theorem3") -> None:
        self.H = H

    @property
    def needs_stats(self) -> bool:
        return self.H == "theorem3"

    def distort(
        self, w_passive: np.ndarray, stats: DataStats | None, n_classes: int, rng: np.random.Generator
    ) -> Distorted:
        w = _check_block(w_passive, stats)
        public = {"step": self.name, "H": self.H}
        if self.H == "flip":
            # Trained on x′ = 1 − x: W x = (−W) x′ + W 1, so W 1 joins the bias of the disclosed model. H = −I is
            # announced and the active party, which trains the bias, sees the offset: it negates back.
            return Distorted(-w, bias_offset=w.sum(axis=1), public=public, private={"h": "-I"}, undoable=True)
        if self.H == "orthonormal":
            h = _haar_orthonormal(w.shape[1], rng)
        else:
            if stats is None:
                raise ValueError("ppsa:H=theorem3 needs the passive party's data statistics (K_0)")
            _, system = _system(w, n_classes)
            projector = system.row_basis @ system.row_basis.T
            u, _, vt = np.linalg.svd(projector @ stats.k0)
            h = -vt.T @ u.T  # rassouli Theorem 3: H* = −V Uᵀ
            if system.rank == w.shape[1]:
                # d ≤ C − 1 with full column rank: A⁺A = I, so H* = −I whatever K_0 — and the active party can
                # tell (d, C and the rank of the disclosed system are public), so it negates back.
                return Distorted(w @ h.T, public=public, private={"h": h}, undoable=True)
        return Distorted(w @ h.T, public=public, private={"h": h})


# -------------------------------------------------------------------------------------- varasteh's PPS

VarastehCase = Literal["i", "ii", "iii", "iv"]
_CASE_ESTIMATOR: dict[str, Estimator] = {"i": "half_star", "ii": "ls", "iii": "ls", "iv": "half_star"}


def _tensor(value: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(np.asarray(value, dtype=np.float64))


@dataclass(frozen=True)
class _Problem:
    """Everything the optimisers need about one block, as float64 torch tensors."""

    w: torch.Tensor  # (K, d) true block
    a: torch.Tensor  # (C − 1, d) = D W
    a_pinv: torch.Tensor  # (d, C − 1)
    dop: torch.Tensor  # (C − 1, K)
    k0: torch.Tensor
    mu: torch.Tensor
    eye: torch.Tensor
    ones: torch.Tensor
    no_shift: torch.Tensor
    scale: float  # the Half baseline, to make the objective O(1)

    @classmethod
    def build(cls, w: np.ndarray, stats: DataStats, n_classes: int) -> _Problem:
        dop, system = _system(w, n_classes)
        t = _tensor
        d = stats.d
        return cls(
            w=t(w), a=t(system.a), a_pinv=t(system.pinv), dop=t(dop), k0=t(stats.k0), mu=t(stats.mu),
            eye=torch.eye(d, dtype=torch.float64), ones=torch.ones(d, dtype=torch.float64),
            no_shift=torch.zeros(dop.shape[0], dtype=torch.float64),
            scale=max(float(np.trace(stats.k_half)) / d, 1e-12),
        )  # fmt: skip

    def attack_mse(self, pinv: torch.Tensor, a_disc: torch.Tensor, estimator: Estimator) -> torch.Tensor:
        m_mat, m_vec = _estimator_map(pinv, self.a, a_disc, self.no_shift, self.ones, estimator)
        return _affine_mse(m_mat, m_vec, self.eye, self.k0, self.mu)

    def rotation_mse(self, r: torch.Tensor, estimator: Estimator) -> torch.Tensor:
        """Attack MSE for W_n = W R with R orthonormal, where (A R)⁺ = Rᵀ A⁺ (varasteh eqs. 38, 45)."""
        return self.attack_mse(r.T @ self.a_pinv, self.a @ r, estimator)

    def vector_mse(self, w_n: torch.Tensor, estimator: Estimator) -> torch.Tensor:
        """Attack MSE for a rank-one disclosed system (d = 1 or one log-ratio), whose A_n⁺ = A_nᵀ / ‖A_n‖²."""
        a_n = self.dop @ w_n
        return self.attack_mse(a_n.T / (a_n * a_n).sum(), a_n, estimator)

    def g(self, w_n: torch.Tensor) -> torch.Tensor:
        diff = self.w - w_n
        return (diff * diff).sum() / diff.numel()


def _value_and_grad(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> tuple[float, torch.Tensor]:
    x = x.detach().requires_grad_(True)
    value = fn(x)
    (grad,) = torch.autograd.grad(value, x)
    return float(value.detach()), grad


def _cayley(r: torch.Tensor, skew: torch.Tensor, step: float) -> torch.Tensor:
    """(I + t/2 S)⁻¹ (I − t/2 S) R: orthonormal for skew-symmetric S."""
    eye = torch.eye(r.shape[0], dtype=r.dtype)
    return torch.linalg.solve(eye + 0.5 * step * skew, (eye - 0.5 * step * skew) @ r)


def _tangent(r: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """Riemannian gradient on {R : RᵀR = I} for the embedded metric: G − R sym(RᵀG).

    varasteh eq. (23), G − R Gᵀ R, is the same direction for the canonical metric; the embedded one makes the
    projection onto a level set below a plain orthogonal projection.
    """
    inner = r.T @ grad
    return grad - 0.5 * r @ (inner + inner.T)


def _retract(r: torch.Tensor, direction: torch.Tensor, step: float, kind: str) -> torch.Tensor:
    """Move from R along the tangent vector −direction and return to the manifold (QR or Cayley retraction)."""
    if kind == "cayley":
        # For a tangent ξ = RΩ (Ω skew), S = ξRᵀ is skew and the Cayley curve's velocity at t = 0 is −S R = −ξ.
        skew = direction @ r.T
        return _cayley(r, 0.5 * (skew - skew.T), step)  # skew-symmetrised so rounding cannot accumulate
    # numpy's QR: torch's costs ~0.7 ms per small matrix on CPU, which dominated the whole optimisation.
    q, upper = np.linalg.qr((r - step * direction).detach().numpy())
    return torch.as_tensor(q * np.where(np.diag(upper) < 0, -1.0, 1.0))


def _restore(constraint: Callable[[torch.Tensor], torch.Tensor], r: torch.Tensor, kind: str) -> torch.Tensor:
    """Newton steps on h(R) = 0 along h's Riemannian gradient (h(R − tξ) ≈ h − t‖ξ‖²)."""
    for _ in range(30):
        value, grad = _value_and_grad(constraint, r)
        if abs(value) < 1e-11:
            break
        direction = _tangent(r, grad)
        norm2 = float((direction * direction).sum())
        if norm2 < 1e-30:
            break
        r = _retract(r, direction, value / norm2, kind)
    return r


def _level_set_descent(
    loss: Callable[[torch.Tensor], torch.Tensor],
    constraint: Callable[[torch.Tensor], torch.Tensor],
    r: torch.Tensor,
    kind: str,
    max_iter: int,
) -> torch.Tensor:
    """Minimise loss on {R : RᵀR = I, h(R) = 0}: the Riemannian gradient with its component along ∇h removed,
    a retraction, Newton restoration of h = 0, and Armijo backtracking on the restored point."""
    r = _restore(constraint, r, kind)
    value = float(loss(r))
    step = 1.0
    for _ in range(max_iter):
        _, grad = _value_and_grad(loss, r)
        _, grad_h = _value_and_grad(constraint, r)
        direction, normal = _tangent(r, grad), _tangent(r, grad_h)
        normal_norm2 = float((normal * normal).sum())
        if normal_norm2 > 1e-30:
            direction = direction - (float((direction * normal).sum()) / normal_norm2) * normal
        rate = float((direction * direction).sum())  # −d/dt loss along −direction
        if rate < 1e-12:
            break
        step = min(step * 2.0, 10.0)
        while step > 1e-12:
            candidate = _restore(constraint, _retract(r, direction, step, kind), kind)
            with torch.no_grad():
                candidate_value = float(loss(candidate))
            if candidate_value <= value - 1e-4 * step * rate:
                break
            step *= 0.5
        else:
            break
        improvement, r, value = value - candidate_value, candidate, candidate_value
        if improvement < 1e-10 * max(1.0, abs(value)):
            break
    return r.detach()


@PARAM_STEPS.register("varasteh")
class Varasteh(Distortion):
    """varasteh's PPS at interpretability level g = ε (eq. 33); see the module docstring for the cases."""

    def __init__(
        self,
        epsilon: float,
        case: Literal["auto", "i", "ii", "iii", "iv"] = "auto",
        retraction: Literal["qr", "cayley"] = "cayley",
        secret_epsilon: bool = False,
        hide_presence: bool = False,
        tolerance: float = 1e-3,
        starts: int = 3,
        max_iter: int = 400,
    ) -> None:
        self.epsilon = float(epsilon)
        if not (math.isfinite(self.epsilon) and self.epsilon > 0.0):
            raise ValueError(f"epsilon must be positive, got {epsilon!r}")
        self.case = case
        self.retraction = retraction
        self.secret_epsilon = secret_epsilon
        self.hide_presence = hide_presence
        self.tolerance = float(tolerance)
        if not 0.0 < self.tolerance < 0.1:
            raise ValueError(f"tolerance (relative error of g) must lie in (0, 0.1), got {tolerance!r}")
        self.starts = starts
        self.max_iter = max_iter
        if self.starts < 1 or self.max_iter < 1:
            raise ValueError("starts and max_iter must be positive integers")

    def public_params(self) -> dict[str, str]:
        params = {"epsilon": repr(self.epsilon), "case": self.case}
        if self.secret_epsilon:
            params["secret_epsilon"] = "true"  # that ε′ is secret is public; its value is not
        if self.hide_presence:
            params["hide_presence"] = "true"
        return params

    @staticmethod
    def select_case(d: int, n_classes: int, requested: str = "auto") -> VarastehCase:
        """The case for (d, k); ``auto`` picks i, ii or iii (case iv overlaps case i and is opt-in)."""
        applies = {"i": d >= n_classes, "ii": 1 < d < n_classes, "iii": d == 1, "iv": n_classes == 2 and d > 1}
        if requested == "auto":
            return next(case for case in ("iii", "ii", "i") if applies[case])  # type: ignore[return-value]
        if not applies[requested]:
            raise ValueError(f"varasteh case {requested} does not apply to d = {d}, k = {n_classes}")
        return requested  # type: ignore[return-value]

    def distort(
        self, w_passive: np.ndarray, stats: DataStats | None, n_classes: int, rng: np.random.Generator
    ) -> Distorted:
        if stats is None:
            raise ValueError("varasteh needs the passive party's data statistics (K_0, μ)")
        w = _check_block(w_passive, stats)
        case = self.select_case(w.shape[1], n_classes, self.case)
        problem = _Problem.build(w, stats, n_classes)
        self._check_reachable(case, problem, self.epsilon)
        target = float(rng.uniform(0.0, self.epsilon)) if self.secret_epsilon else self.epsilon
        applied = not (self.hide_presence and rng.random() < 0.5)
        private: dict[str, Any] = {"case": case, "estimator": _CASE_ESTIMATOR[case], "applied": applied}
        if self.secret_epsilon:
            private["epsilon_prime"] = target
        if not applied or target == 0.0:
            w_n, target = w.copy(), 0.0
        elif case in ("i", "ii"):
            w_n, private["r"] = self._solve_stiefel(problem, case, target, rng)
        elif case == "iii" and n_classes == 2:
            w_n = self._solve_remark11(problem, target)
        else:
            w_n = self._solve_vector(problem, case, target, rng)
        achieved = interpretability_loss(w, w_n)
        private.update(target_g=target, achieved_g=achieved)
        result = Distorted(w_n, public={"step": self.name, **self.public_params()}, private=private)
        self.check(w, result)
        private["forecast_mse"] = forecast(w, stats, n_classes, result)[_CASE_ESTIMATOR[case]]
        return result

    def check(self, w_passive: np.ndarray, result: Distorted) -> None:
        """The coordinator's check: the disclosed block's g matches the level the passive party reports."""
        if result.disclosed is None:
            raise ValueError("varasteh never withholds a block")
        target = float(result.private["target_g"])
        achieved = interpretability_loss(w_passive, result.disclosed)
        if abs(achieved - target) > self.tolerance * max(target, 1e-300) + 1e-15:
            raise ValueError(f"varasteh: achieved g = {achieved:.6g} but the target is g = {target:.6g}")
        if target > self.epsilon * (1.0 + self.tolerance):
            raise ValueError(f"varasteh: g = {target:.6g} exceeds the agreed ε = {self.epsilon:.6g}")

    @staticmethod
    def _check_reachable(case: VarastehCase, problem: _Problem, epsilon: float) -> None:
        w = problem.w.numpy()
        if case in ("i", "ii"):
            # g(R) = (2/(dK)) Tr((I − R) WᵀW) is largest at R = −I.
            limit = 4.0 * float(np.sum(w * w)) / w.size
            if epsilon > limit:
                raise ValueError(
                    f"varasteh: g = ε = {epsilon:g} cannot be met: an orthonormal transform of this block reaches "
                    f"at most g = {limit:.6g} (R = −I)"
                )
            return
        if case == "iii" and problem.dop.shape[0] == 1:
            return  # Remark 11: the constraint set is two points, A_n = A ± √(εK)‖D‖ never both zero
        # Blocks with D W_n = 0 carry no information and make the unclipped attack MSE unbounded near them.
        dop = problem.dop.numpy()
        informative = np.linalg.pinv(dop) @ dop @ w
        limit = float(np.sum(informative * informative)) / w.size
        if epsilon >= limit:
            raise ValueError(
                f"varasteh: g = ε = {epsilon:g} cannot be met meaningfully: from g = {limit:.6g} on, the ε-sphere "
                "holds blocks that carry no information (D W_n = 0) and the attack MSE is unbounded; use withhold"
            )

    def _solve_stiefel(
        self, problem: _Problem, case: VarastehCase, target: float, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """Cases i and ii: maximise the attack MSE over W_n = W R, RᵀR = I, subject to g(W R) = ε exactly.

        The paper's penalty λ(g − ε)² (39, 46) needs a huge λ to hold the equality, which makes small ε badly
        conditioned; here the constraint h = g/ε − 1 = 0 is kept by projection and Newton restoration instead.
        """
        estimator = _CASE_ESTIMATOR[case]

        def h(r: torch.Tensor) -> torch.Tensor:
            return problem.g(problem.w @ r) / target - 1.0

        def loss(r: torch.Tensor) -> torch.Tensor:
            return -problem.rotation_mse(r, estimator) / problem.scale

        best: tuple[float, torch.Tensor] | None = None
        for r0 in self._stiefel_starts(problem, h, rng):
            r = _level_set_descent(loss, h, r0, self.retraction, self.max_iter)
            if abs(float(h(r))) > self.tolerance:
                continue
            value = float(problem.rotation_mse(r, estimator))
            if best is None or value > best[0]:
                best = (value, r)
        if best is None:
            raise ValueError(f"varasteh: no orthonormal transform met g = {target:.6g} within {self.tolerance:g}")
        r = best[1].numpy()
        return problem.w.numpy() @ r, r

    def _stiefel_starts(
        self, problem: _Problem, h: Callable[[torch.Tensor], torch.Tensor], rng: np.random.Generator
    ) -> list[torch.Tensor]:
        """Feasible starts: Cayley curves from I (and from a reflection) along random skew directions, at g = ε."""
        d = problem.eye.shape[0]
        # The reflection across the weakest direction of WᵀW costs the least g: 4 vᵀWᵀWv / (dK).
        _, eigvecs = np.linalg.eigh(problem.w.numpy().T @ problem.w.numpy())
        weakest = torch.as_tensor(eigvecs[:, 0])
        reflection = torch.eye(d, dtype=torch.float64) - 2.0 * torch.outer(weakest, weakest)
        starts = []
        for index in range(self.starts):
            skew = torch.as_tensor(rng.standard_normal((d, d)))
            skew = (skew - skew.T) / torch.linalg.norm(skew - skew.T)
            # The last start lies in the other component of O(d) (det −1), which no curve from I reaches.
            base = reflection if index == self.starts - 1 and self.starts > 1 else problem.eye
            starts.append(self._bisect_on_curve(h, base, skew))
        return starts

    @staticmethod
    def _bisect_on_curve(
        h: Callable[[torch.Tensor], torch.Tensor], base: torch.Tensor, skew: torch.Tensor
    ) -> torch.Tensor:
        """The point of the Cayley curve t ↦ cay(tS)·base where h crosses 0 (or the farthest point tried)."""
        low, high = 0.0, 1.0
        while float(h(_cayley(base, skew, high))) < 0.0 and high < 1e6:
            low, high = high, high * 4.0
        if float(h(_cayley(base, skew, low))) >= 0.0:
            return base
        for _ in range(60):
            mid = 0.5 * (low + high)
            low, high = (mid, high) if float(h(_cayley(base, skew, mid))) < 0.0 else (low, mid)
        return _cayley(base, skew, high)

    @staticmethod
    def _solve_remark11(problem: _Problem, target: float) -> np.ndarray:
        """Case iii with k = 2: move W along D's row by ±√(εK)·(unit), the better sign for LS (varasteh Remark 11)."""
        w = problem.w.numpy()
        direction = problem.dop.numpy().T / np.linalg.norm(problem.dop.numpy())  # (K, 1)
        radius = math.sqrt(target * w.size)
        candidates = [w + sign * radius * direction for sign in (1.0, -1.0)]
        return max(candidates, key=lambda w_n: float(problem.vector_mse(torch.as_tensor(w_n), "ls")))

    def _solve_vector(
        self, problem: _Problem, case: VarastehCase, target: float, rng: np.random.Generator
    ) -> np.ndarray:
        """Cases iii (k > 2) and iv: any W_n with g(W_n) = ε, by SciPy trust-constr (varasteh Remark 12)."""
        estimator = _CASE_ESTIMATOR[case]
        w = problem.w.numpy()
        size = w.size
        radius = math.sqrt(target * size)

        def objective(flat: np.ndarray) -> tuple[float, np.ndarray]:
            value, grad = _value_and_grad(
                lambda delta: -problem.vector_mse(problem.w + delta.reshape(w.shape), estimator) / problem.scale,
                torch.as_tensor(flat),
            )
            return value, grad.numpy()

        constraint = optimize.NonlinearConstraint(
            lambda flat: float(flat @ flat) / size,
            target,
            target,
            jac=lambda flat: (2.0 / size) * flat[None, :],
            hess=lambda flat, v: (2.0 * v[0] / size) * np.eye(size),
        )
        dop = problem.dop.numpy()
        toward_uninformative = -(np.linalg.pinv(dop) @ dop @ w).ravel()
        guesses = [toward_uninformative] + [rng.standard_normal(size) for _ in range(self.starts)]
        best: tuple[float, np.ndarray] | None = None
        for guess in guesses:
            x0 = radius * guess / np.linalg.norm(guess)
            with warnings.catch_warnings():
                # BFGS reports a zero gradient change once the iterate sits on the optimum; nothing to act on.
                warnings.filterwarnings("ignore", message="delta_grad == 0.0")
                solution = optimize.minimize(
                    objective, x0, jac=True, hess=optimize.BFGS(), method="trust-constr", constraints=[constraint],
                    options={"maxiter": self.max_iter, "gtol": 1e-10, "xtol": 1e-12},
                )  # fmt: skip
            delta = solution.x * (radius / np.linalg.norm(solution.x))  # land exactly on the sphere
            value = objective(delta)[0]
            if np.isfinite(value) and (best is None or value < best[0]):
                best = (value, delta)
        if best is None:
            raise ValueError(f"varasteh: trust-constr found no block with g = {target:.6g}")
        return w + best[1].reshape(w.shape)
