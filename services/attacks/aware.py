"""Defense-aware attacks: the Kerckhoffs attacker knows every mechanism and the public parameters it announces.

The active party receives the release chains as (name, public params) steps (:attr:`Observations.score_chain`,
:attr:`Observations.param_chain`). From them and the released scores each defense yields *evidence* about the
true log-scores ln c_m = W_m·x + k_m − ln Z (design/attacker-model.md):

* a point estimate of ln c_m up to a per-sample constant, with inverse-variance weights (0 = unusable), on which
  the robust linear attacks (:func:`~.linear.robust_system`) run as weighted least squares;
* bounds lo_m ≤ ln c_m ≤ hi_m and order constraints z_a ≤ z_b, a polytope in (x, ln Z) whose projection of ½·1
  (RCC2 over intervals) is a small QP per sample.

Per defense (one score step per chain; several steps in sequence are not modelled):

* ``rounding`` b: c ∈ [r, r + 10^-b); point ln(r + 10^-b/2); a released 0 is still the bound c < 10^-b.
* ``gaussian`` σ: point ln p, delta-method weights p²/σ², for p > 4σ only; bounds c ∈ [p − 4σ, p + 4σ]
  (each holds with probability 1 − 6e-5).
* ``privee`` / ``privee_pp``: the Householder basis first gets the public 2/K back; the entry at ascending
  position i was multiplied by m_i ∈ [1 + σ_i·i·U/K, 1 + σ_i·(i + 1)·U/K] (ranks are preserved, so i is seen),
  so ln c = ln p − ln m_i: point with E[ln m_i] in closed form, bounds from the interval.
* ``pps_b``: schemes 1–2 add the deterministic √α·v₁ part (v₁ = Theorem 4's direction, computed from the
  disclosed passive block as the coordinator does), subtracted exactly; the top class of scheme 2 is dropped
  where it was lifted (its lead is then exactly the public gap); scheme 3 divides the log-scores by 1 − α.
* ``label_only`` / ``rank_only``: only the order is released: z_top ≥ z_m (label) or the full ranking (rank), a
  polytope without point estimates; the projection of ½·1 onto it is the estimate (Half where ½·1 fits).
* parameter chain ``ppsa``: ``flip`` is undone exactly (W = −W_disclosed, bias = released − W·1);
  ``theorem3`` gives H* = −I whenever the disclosed system has full column rank (d_p ≤ C − 1), undone the same
  way without a bias offset; with a larger d_p H* depends on the passive party's K_0 and ``orthonormal`` draws
  a secret H: those are not applicable (the block then only fixes W Wᵀ; black-box attacks still apply).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from vflsec.services.defenses.release import SCORE_STEPS
from vflsec.services.models.lr import PassiveSystem

from .base import WHITE_BOX_NEEDS, Attack, NotApplicable, Observations, Reconstruction, register
from .chebyshev import Cls, Rcc2
from .closed_form import Esa, HalfStar, LinearSystemAttack
from .gradient import Gia, Grn
from .linear import class_rows, robust_system

SCORE_DEFENSES = frozenset({"rounding", "gaussian", "privee", "privee_pp", "pps_b", "label_only", "rank_only"})
PARAM_DEFENSES = frozenset({"ppsa"})
# Gaussian bounds at ±GAUSSIAN_BOUND σ: each holds with probability 1 − 6.3e-5.
GAUSSIAN_BOUND = 4.0
# Noisy evidence is combined with the prior x ~ U[0, 1]^d (variance 1/12 per feature): the linear MMSE estimate.
PRIOR_PRECISION = 12.0
# Bounds are widened by this much in log space so that float round-off cannot exclude the truth.
LOG_SLACK = 1e-9


@dataclass(frozen=True)
class Evidence:
    """What a score defense leaves of the true log-scores; any field may be None (not available)."""

    log_scores: np.ndarray | None = None  # (n, C) ln c + per-sample constant; −inf = unusable
    weights: np.ndarray | None = None  # (n, C) inverse variances of log_scores; None = exact
    lower: np.ndarray | None = None  # (n, C) bounds on ln c (−inf / +inf = none)
    upper: np.ndarray | None = None
    order: np.ndarray | None = None  # (n, P, 2) class pairs (a, b) with z_a ≤ z_b; −1 = padding


def _step(name: str, params: dict[str, str]) -> Any:
    """Rebuild the announced score step from its public parameters (the same validation as the coordinator).

    Announced facts that are not constructor arguments (PRIVEE's U, a class constant) are left out.
    """
    accepted = SCORE_STEPS.entry(name).parameters()
    return SCORE_STEPS.build(name, {k: v for k, v in params.items() if k in accepted})


def _safe_log(values: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(values > 0, np.log(np.where(values > 0, values, 1.0)), -np.inf)


def _rounding(scores: np.ndarray, step: Any) -> Evidence:
    width = 10.0 ** (-step.decimals)
    low, high = _safe_log(scores), np.log(scores + width)
    point = np.where(scores > 0, np.log(scores + 0.5 * width), -np.inf)
    with np.errstate(divide="ignore"):
        weights = np.where(scores > 0, 12.0 / (high - low) ** 2, 0.0)
    return Evidence(point, weights, low, np.minimum(high, 0.0))


def _gaussian(scores: np.ndarray, step: Any) -> Evidence:
    sigma = step.sigma
    # The delta method needs c ≫ σ: a score within GAUSSIAN_BOUND·σ of 0 may be pure noise, and its log is then
    # biased without limit; such scores only bound c from above (the interval attack keeps that).
    usable = scores > GAUSSIAN_BOUND * sigma
    point = np.where(usable, _safe_log(scores), -np.inf)
    weights = np.where(usable, scores**2 / sigma**2, 0.0)
    return Evidence(
        point,
        weights,
        _safe_log(scores - GAUSSIAN_BOUND * sigma),
        np.minimum(np.log(np.maximum(scores + GAUSSIAN_BOUND * sigma, 1e-300)), 0.0),
    )


def _ascending_group_start(values: np.ndarray) -> np.ndarray:
    """Per entry, the ascending position where its tie group starts (PRIVEE's tied entries share it)."""
    n, k = values.shape
    order = np.argsort(values, axis=1, kind="stable")
    ordered = np.take_along_axis(values, order, axis=1)
    first = np.ones((n, k), dtype=bool)
    first[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    start = np.maximum.accumulate(np.where(first, np.arange(k), 0), axis=1)
    positions = np.empty_like(order)
    np.put_along_axis(positions, order, start, axis=1)
    return positions


def _privee(scores: np.ndarray, step: Any) -> Evidence:
    k = scores.shape[1]
    # Householder: p = c(1 + s) − (2/K)·Σc with Σc = 1 (PRIVEE acts on the confidence scores).
    p = scores + 2.0 / k if step.basis == "householder" else scores
    slope = step.sigma_ascending(k) * step.upper / k
    positions = _ascending_group_start(p)
    s = slope[positions]
    base = 1.0 + s * positions  # multiplier m ∈ [base, base + s] (u uniform in the position's sub-interval)
    log_low, log_high = np.log(base), np.log(base + s)
    tiny = s < 1e-8 * base
    safe = np.where(tiny, 1.0, s)
    mean = np.where(tiny, np.log(base + 0.5 * s), ((base + s) * log_high - base * log_low) / safe - 1.0)
    log_p = _safe_log(p)
    spread = np.maximum(log_high - log_low, 1e-12)
    weights = np.where(np.isfinite(log_p), 12.0 / spread**2, 0.0)
    return Evidence(log_p - mean, weights, log_p - log_high, log_p - log_low)


def _pps_b(obs: Observations, step: Any) -> Evidence:
    from vflsec.services.defenses.scores import pps_b_direction

    scores = np.asarray(obs.scores, dtype=float)
    log_p = _safe_log(scores)
    if step.scheme == 3:
        return Evidence(log_p / (1.0 - step.alpha))
    if obs.w_passive is None:
        raise NotApplicable("pps_b schemes 1-2: v1 is computed from the passive weights, which were withheld")
    v1 = pps_b_direction({"passive": np.asarray(obs.w_passive, dtype=float)})
    top = scores == scores.max(axis=1, keepdims=True)
    root_alpha = np.sqrt(step.alpha)
    if step.scheme == 1:
        n_tilde = np.where(top, v1.max(), v1)
        shift = root_alpha * n_tilde / np.linalg.norm(n_tilde, axis=1, keepdims=True)
        return Evidence(log_p - shift)
    # Scheme 2 lifts the top to best other + √α(max v − min v) when the shift would cost it the argmax: such a
    # top carries no equation; otherwise it got the same √α·v₁ shift as every class.
    gap = root_alpha * (v1.max() - v1.min())
    other = np.where(top, -np.inf, log_p).max(axis=1, keepdims=True)
    top_lead = np.where(top, log_p, -np.inf).max(axis=1, keepdims=True) - other
    lifted = top & np.isclose(top_lead, gap, rtol=1e-9, atol=1e-9)
    return Evidence(np.where(lifted, -np.inf, log_p - root_alpha * v1))


def _order(scores: np.ndarray, label_only: bool) -> Evidence:
    n, k = scores.shape
    pairs = np.full((n, k - 1, 2), -1)
    if label_only:
        top = np.argmax(scores, axis=1)
        others = np.array([[m for m in range(k) if m != t] for t in range(k)])[top]
        pairs[:, :, 0], pairs[:, :, 1] = others, top[:, None]
    else:
        order = np.argsort(scores, axis=1, kind="stable")
        ordered = np.take_along_axis(scores, order, axis=1)
        strict = ordered[:, 1:] > ordered[:, :-1]  # tied ranks give no order
        pairs[:, :, 0] = np.where(strict, order[:, :-1], -1)
        pairs[:, :, 1] = np.where(strict, order[:, 1:], -1)
    return Evidence(order=pairs)


def score_evidence(obs: Observations) -> Evidence | None:
    """The evidence of the announced score chain (None: no score defense, the released scores are exact)."""
    if not obs.score_chain:
        return None
    if len(obs.score_chain) > 1:
        names = [name for name, _ in obs.score_chain]
        raise NotApplicable(f"defense-aware attacks model one score step; the chain has {names}")
    name, params = obs.score_chain[0]
    if name not in SCORE_DEFENSES:
        raise NotApplicable(f"no defense-aware model of score step {name!r}")
    scores = np.asarray(obs.scores, dtype=float)
    if name in ("label_only", "rank_only"):
        return _order(scores, label_only=name == "label_only")
    step = _step(name, dict(params))
    if name == "rounding":
        return _rounding(scores, step)
    if name == "gaussian":
        return _gaussian(scores, step)
    if name in ("privee", "privee_pp"):
        return _privee(scores, step)
    return _pps_b(obs, step)


def undo_param_chain(obs: Observations) -> tuple[Observations, list[str]]:
    """The true passive block (and bias) where an announced PPS-A transform can be inverted; the undone steps."""
    undone: list[str] = []
    for name, params in obs.param_chain:
        if name != "ppsa":
            continue  # other parameter steps leave the attacker the disclosed block, as the naive attacks use it
        transform = dict(params).get("H", "theorem3")
        if obs.w_passive is None:
            raise NotApplicable("ppsa: the passive block was withheld")
        w_disclosed = np.asarray(obs.w_passive, dtype=float)
        if transform == "orthonormal":
            raise NotApplicable(
                "ppsa:H=orthonormal draws a secret H: the disclosed block fixes only W Wᵀ and the scores only H·x; "
                "attacks that do not use the passive block (black-box, agnostic) remain"
            )
        if transform == "theorem3":
            w_rows, _ = class_rows(obs)
            if PassiveSystem(np.diff(w_rows, axis=0)).rank < obs.d_passive:
                raise NotApplicable(
                    "ppsa:H=theorem3 with d_p > rank(A): H* = −V Uᵀ depends on the passive party's K_0, which is "
                    "never sent; attacks that do not use the passive block remain"
                )
            obs = replace(obs, w_passive=-w_disclosed)  # H* = −I, no bias offset (rassouli Theorem 3)
        else:  # flip: the disclosed model was trained on 1 − x and carries W·1 in its bias
            obs = replace(obs, w_passive=-w_disclosed, bias=np.asarray(obs.bias, float) + w_disclosed.sum(axis=1))
        undone.append(f"ppsa:{transform}")
    return obs, undone


class AwareAttack(Attack):
    """A robust linear attack on the evidence the announced chains leave (see the module docstring).

    ``method``: ``ls`` (weighted LS with the prior x ~ U[0, 1]^d, the linear MMSE estimate, clamped; Half* on
    exact evidence), ``cls`` (the same, box-constrained), ``rcc2`` (RCC2 on the de-biased system) or
    ``interval`` (the projection of ½·1 onto the polytope of the bounds and order constraints: RCC2 over
    intervals; the only one left for label-/rank-only releases). A sample whose polytope is empty (possible
    only for the Gaussian bounds) gets the ``cls`` estimate.
    """

    needs = WHITE_BOX_NEEDS
    families = frozenset({"lr"})
    # On weighted evidence the prior rows make A full rank, so Half* is plain (MMSE) least squares there.
    # ``ls_min_norm``: the aware counterpart of the naive ls_clamped (the minimum-norm solution of the de-biased,
    # weighted system, no ½ prior), where the data sit far from ½ (digits' pixels: mostly 0).
    _INNER: ClassVar[dict[str, LinearSystemAttack]] = {"ls": HalfStar(clamp=True), "cls": Cls(), "rcc2": Rcc2(),
                                                       "ls_min_norm": Esa(clamp=True)}  # fmt: skip
    _TARGETS: ClassVar[dict[str, frozenset[str]]] = {
        "point": SCORE_DEFENSES - {"label_only", "rank_only"} | PARAM_DEFENSES,
        "interval": frozenset({"rounding", "gaussian", "privee", "privee_pp", "label_only", "rank_only"}),
    }

    def __init__(self, method: str = "ls") -> None:
        if method not in (*self._INNER, "interval"):
            raise ValueError(f"method must be one of ls, ls_min_norm, cls, rcc2, interval; got {method!r}")
        self.method = method
        self.targets = self._TARGETS["interval" if method == "interval" else "point"]

    def reconstruct(self, obs: Observations) -> Reconstruction:
        obs, undone = undo_param_chain(obs)
        evidence = score_evidence(obs)
        if evidence is None and not undone:
            raise NotApplicable("no defense in the announced release chains for an aware attack to undo")
        meta: dict[str, Any] = {"undone": undone, "defense": [n for n, _ in obs.score_chain]}
        if self.method == "interval":
            if evidence is None or (evidence.order is None and evidence.lower is None):
                raise NotApplicable("the release leaves exact equations, no intervals: aware_rcc2 uses them")
            fallback = None
            if evidence.log_scores is not None:
                fallback = self._point(obs, evidence, self._INNER["cls"]).x_passive
            x, feasible = project_half_onto_polytope(obs, evidence, fallback)
            return Reconstruction(x, meta | {"feasible": feasible})
        if evidence is not None and evidence.log_scores is None:
            raise NotApplicable(f"{obs.score_chain[0][0]} releases only an order; aware_interval uses it")
        result = self._point(obs, evidence, self._INNER[self.method])
        return Reconstruction(result.x_passive, result.meta | meta)

    @staticmethod
    def _point(obs: Observations, evidence: Evidence | None, inner: LinearSystemAttack) -> Reconstruction:
        if evidence is None:
            evidence = Evidence()
        # Exact evidence (PPS-B, PPS-A, no score step) has infinite weight: the prior's limit is Half* itself.
        # RCC2 keeps its equality system (the prior rows would make its feasible set a point).
        # The minimum-norm variant takes no prior either: the prior rows are what centre the estimate on ½.
        prior = PRIOR_PRECISION if evidence.weights is not None and not isinstance(inner, Rcc2 | Esa) else 0.0
        system = robust_system(obs, evidence.log_scores, evidence.weights, prior)
        return inner.reconstruct_system(system, obs.d_passive)


def project_half_onto_polytope(
    obs: Observations, evidence: Evidence, fallback: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """argmin ‖x − ½·1‖ over {x ∈ [0,1]^d, ∃t: lo_m ≤ W_m x + k_m − t ≤ hi_m, z_a ≤ z_b}, one QP per sample."""
    import warnings

    import cvxpy as cp  # lazily: cvxpy takes ~1 s to import

    w_rows, known = class_rows(obs)
    n, d, c = obs.n_samples, obs.d_passive, obs.n_classes
    pairs = evidence.order.shape[1] if evidence.order is not None else 0
    rows = (2 * c if evidence.lower is not None else 0) + pairs
    x, t = cp.Variable(d), cp.Variable()
    g, e, h = cp.Parameter((rows, d)), cp.Parameter(rows), cp.Parameter(rows)
    problem = cp.Problem(
        cp.Minimize(cp.sum_squares(x - 0.5) + 1e-9 * cp.square(t)),
        [x >= 0, x <= 1, g @ x + cp.multiply(e, t) <= h],
    )
    out = np.full((n, d), 0.5) if fallback is None else np.clip(fallback, 0.0, 1.0)
    feasible = np.zeros(n, dtype=bool)
    for i in range(n):
        g_i, e_i, h_i = np.zeros((rows, d)), np.zeros(rows), np.ones(rows)
        if evidence.lower is not None and evidence.upper is not None:
            hi, lo = evidence.upper[i] + LOG_SLACK, evidence.lower[i] - LOG_SLACK
            up, down = np.isfinite(hi), np.isfinite(lo)
            g_i[:c][up], e_i[:c][up], h_i[:c][up] = w_rows[up], -1.0, (hi - known[i])[up]
            g_i[c : 2 * c][down], e_i[c : 2 * c][down] = -w_rows[down], 1.0
            h_i[c : 2 * c][down] = (known[i] - lo)[down]
        if evidence.order is not None:
            offset = rows - pairs
            for j, (a, b) in enumerate(evidence.order[i]):
                if a >= 0:
                    g_i[offset + j], h_i[offset + j] = w_rows[a] - w_rows[b], known[i, b] - known[i, a]
        g.value, e.value, h.value = g_i, e_i, h_i
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                problem.solve(solver="CLARABEL")
        except cp.error.SolverError:
            continue
        if problem.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) and x.value is not None:
            out[i], feasible[i] = np.clip(x.value, 0.0, 1.0), True
    return out, feasible


class AwareScores:
    """GIA or GRN on what the announced score step leaves of the true scores: its point estimates of ln c
    (de-biased PRIVEE, rounding midpoints, ...; the per-sample constant removed by renormalising). The inner
    attack brings the model, so this serves every family it does (LR blocks or a released split-NN model).
    Opt-in (not in :data:`AWARE_ATTACKS`): the linear aware attacks already undo these defenses for LR.
    """

    targets = SCORE_DEFENSES - {"label_only", "rank_only"}

    def reconstruct(self, obs: Observations) -> Reconstruction:
        evidence = score_evidence(obs)
        if evidence is None:
            raise NotApplicable("no score defense in the announced release chain for an aware attack to undo")
        if evidence.log_scores is None:
            raise NotApplicable(f"{obs.score_chain[0][0]} releases only an order, no scores to de-bias")
        log_scores = evidence.log_scores
        top = log_scores.max(axis=1, keepdims=True)
        usable = np.isfinite(top[:, 0])
        estimate = np.exp(log_scores - np.where(np.isfinite(top), top, 0.0))
        estimate = np.where(usable[:, None], estimate / estimate.sum(axis=1, keepdims=True), obs.scores)
        result = super().reconstruct(replace(obs, scores=estimate))  # type: ignore[misc]
        return Reconstruction(result.x_passive, result.meta | {"defense": [n for n, _ in obs.score_chain]})


class AwareGia(AwareScores, Gia):
    """GIA on the de-biased scores (same parameters as ``gia``)."""


class AwareGrn(AwareScores, Grn):
    """GRN on the de-biased scores (same parameters as ``grn``)."""


register("aware_gia", AwareGia)
register("aware_grn", AwareGrn)

AWARE_ATTACKS = ("aware_ls", "aware_cls", "aware_rcc2", "aware_interval", "aware_ls_min_norm")
for _method in ("ls", "cls", "rcc2", "interval", "ls_min_norm"):
    register(f"aware_{_method}", AwareAttack, method=_method)


def aware_attacks_for(score_chain: list[str], param_chain: list[str]) -> list[str]:
    """The aware attacks that target a defense of these chains (step names)."""
    chain = set(score_chain) | set(param_chain)
    return [name for name in AWARE_ATTACKS if chain & AwareAttack(name.removeprefix("aware_")).targets]
