"""The linear system an LR model's released scores put on the passive features (rassouli §III, luo Eq. 3–8).

For softmax, ln c_m − ln c_ref = z_m − z_ref removes the unknown normaliser; for a binary sigmoid model
(scores ``[1 − p, p]``) the same log-ratio is the logit ln(p / (1 − p)). Writing D for the difference operator
on logits (``[[1]]`` for one sigmoid logit, ``[−1 | I]`` against reference class 0 for C softmax logits):

    A x_pas = b,   A = D W_pas  ((C − 1) × d_p),   b = r − D W_act x_act − D bias,

with r the (C − 1) released log-ratios. Every white-box attack reduces to this system, so the SVD of A is
computed once per model and every per-sample quantity is a batched matrix product.

Defended scores need the *robust* form of that system (:func:`robust_system`): per sample, the largest usable
score is the reference (its log is the best-conditioned), and equations of zero or negative scores are dropped
(rounding down releases 0, PRIVEE's Householder basis releases negative values) instead of flooring ln 0, which
would make every equation of the sample wrong. Samples sharing a reference and a set of usable classes share
one A, so the attacks still run batched per group. A and its SVD (:class:`PassiveSystem`) belong to the LR
family package (services/models/lr/system.py), which the parameter defenses share.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from vflsec.services.models.lr import PassiveSystem, difference_operator, softmax_layout

from .base import NotApplicable, Observations

# Rounded-down scores can be exactly 0 (luo §VII), and PRIVEE releases can be negative: the log is taken of
# max(c, floor). The floor only has to keep ln finite — the resulting equations are then (rightly) poor — and
# must stay far below genuine tiny probabilities (a confident softmax gives 1e-20 and the log-ratio is exact).
SCORE_FLOOR = 1e-300


def log_ratios(scores: np.ndarray) -> np.ndarray:
    """ln c_m − ln c_0 for m = 1..C−1, guarded against ln 0; shape (n, C − 1)."""
    logs = np.log(np.maximum(np.asarray(scores, dtype=float), SCORE_FLOOR))
    return logs[:, 1:] - logs[:, :1]


def passive_system(obs: Observations, scores: np.ndarray | None = None) -> tuple[PassiveSystem, np.ndarray]:
    """(A, b) from the disclosed model and the released (or, for agnostic attacks, estimated) scores."""
    if obs.w_active is None or obs.w_passive is None or obs.bias is None:
        raise NotApplicable("the linear system needs w_active, w_passive and bias")
    scores = obs.scores if scores is None else scores
    if scores is None:
        raise NotApplicable("the linear system needs scores")
    dop = difference_operator(obs.k_logits, obs.n_classes)
    a = dop @ np.asarray(obs.w_passive, dtype=float)
    x_act = np.asarray(obs.x_active, dtype=float)
    b = log_ratios(scores) - x_act @ (dop @ np.asarray(obs.w_active, dtype=float)).T - dop @ obs.bias
    return PassiveSystem(a), b


def class_rows(obs: Observations) -> tuple[np.ndarray, np.ndarray]:
    """(W (C, d_p), k (n, C)) with ln c_m = W_m·x_p + k_m − ln Z per sample; a sigmoid logit z becomes [0, z]."""
    if obs.w_active is None or obs.w_passive is None or obs.bias is None:
        raise NotApplicable("the linear system needs w_active, w_passive and bias")
    w_pas = np.asarray(obs.w_passive, dtype=float)
    known = np.asarray(obs.x_active, dtype=float) @ np.asarray(obs.w_active, dtype=float).T + obs.bias
    difference_operator(obs.k_logits, obs.n_classes)  # validates the layout
    layout = softmax_layout(obs.k_logits)
    return layout.T @ w_pas, known @ layout


@dataclass(frozen=True)
class SystemGroup:
    """Samples ``rows`` that share one system: A x = b[j] for the j-th of them."""

    rows: np.ndarray
    system: PassiveSystem
    b: np.ndarray


@dataclass(frozen=True)
class RobustSystem:
    """The per-sample linear systems of :func:`robust_system`, grouped by shared A."""

    groups: list[SystemGroup]
    n: int
    reference: np.ndarray  # (n,) the reference class of each sample
    dropped: np.ndarray  # (n,) equations dropped (unusable scores)

    def solve(self, solver: Callable[[PassiveSystem, np.ndarray], tuple[np.ndarray, dict[str, Any]]], d: int) -> tuple[
        np.ndarray, dict[str, Any]
    ]:
        """Run ``solver`` on every group and put the answers back in sample order (meta merged per sample)."""
        x = np.full((self.n, d), 0.5)
        parts: list[tuple[np.ndarray, dict[str, Any]]] = []
        for group in self.groups:
            x_group, meta = solver(group.system, group.b)
            meta.setdefault("rank", group.system.rank)
            x[group.rows] = x_group
            parts.append((group.rows, meta))
        meta = _merge_meta(self.n, parts)
        meta["reference"] = self.reference
        meta["dropped"] = self.dropped
        meta["dropped_total"] = int(self.dropped.sum())
        return x, meta


def _merge_meta(n: int, parts: list[tuple[np.ndarray, dict[str, Any]]]) -> dict[str, Any]:
    """Per-group meta → per-sample arrays; a value every group reports identically stays a scalar."""
    merged: dict[str, Any] = {}
    for key in {k for _, meta in parts for k in meta}:
        values = [(rows, meta.get(key)) for rows, meta in parts]
        scalars = [v for _, v in values if np.ndim(v) == 0]
        if len(scalars) == len(values) and all(_same(v, scalars[0]) for v in scalars):
            merged[key] = scalars[0]
            continue
        column = np.full(n, None, dtype=object)
        for rows, value in values:
            if np.ndim(value) >= 1 and len(value) == len(rows):
                for row, item in zip(rows, value, strict=True):
                    column[row] = item
            else:
                column[rows] = [value] * len(rows)
        merged[key] = column if any(v is None for v in column) else np.array(column.tolist())
    return merged


def _same(a: Any, b: Any) -> bool:
    return bool(a == b) if type(a) is type(b) else False


def robust_system(
    obs: Observations,
    log_scores: np.ndarray | None = None,
    weights: np.ndarray | None = None,
    prior_precision: float = 0.0,
) -> RobustSystem:
    """The log-ratio equations against each sample's largest usable score, unusable scores dropped.

    ``log_scores`` (n, C) are ln c up to a per-sample constant (default: ln of the released scores) and
    ``weights`` (n, C) their inverse variances, 0 for an unusable score (default: 1 where the released score is
    positive). With weights, each equation ln c_m − ln c_r is scaled by √(1 / (1/ω_m + 1/ω_r)) (weighted LS),
    and ``prior_precision`` λ > 0 appends the rows √λ·(x − ½·1) = 0: least squares then gives the linear MMSE
    estimate under a prior of variance 1/λ around the cube's centre (λ = 12: uniform on [0, 1]), which falls back
    to Half as the evidence fades instead of amplifying noise.
    """
    w_rows, known = class_rows(obs)
    if log_scores is None:
        if obs.scores is None:
            raise NotApplicable("the linear system needs scores")
        scores = np.asarray(obs.scores, dtype=float)
        usable = np.isfinite(scores) & (scores > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            log_scores = np.where(usable, np.log(np.where(usable, scores, 1.0)), -np.inf)
        weighted = None
    else:
        usable = np.isfinite(log_scores) & (weights > 0 if weights is not None else True)
        weighted = weights
    n, c = usable.shape
    reference = np.argmax(np.where(usable, log_scores, -np.inf), axis=1)
    rows_all = np.arange(n)
    usable = usable.copy()
    has_reference = usable[rows_all, reference]
    usable[rows_all, reference] = False  # the reference is not an equation of its own
    dropped = (c - 1) - usable.sum(axis=1)
    dropped[~has_reference] = c - 1
    usable[~has_reference] = False
    key = np.hstack([reference[:, None], usable]) if weighted is None else np.arange(n)[:, None]
    _, inverse = np.unique(key, axis=0, return_inverse=True)
    groups = []
    for g in range(int(inverse.max()) + 1 if n else 0):
        rows = np.flatnonzero(inverse.ravel() == g)
        ref, eqs = reference[rows[0]], np.flatnonzero(usable[rows[0]])
        a = w_rows[eqs] - w_rows[ref]
        b = (log_scores[rows][:, eqs] - log_scores[rows][:, [ref]]) - (known[rows][:, eqs] - known[rows][:, [ref]])
        if weighted is not None and eqs.size:
            scale = np.sqrt(1.0 / (1.0 / weighted[rows[0], eqs] + 1.0 / weighted[rows[0], ref]))
            a, b = a * scale[:, None], b * scale
        if prior_precision > 0:
            root = np.sqrt(prior_precision)
            a = np.vstack([a, root * np.eye(w_rows.shape[1])])
            b = np.hstack([b, np.full((len(rows), w_rows.shape[1]), 0.5 * root)])
        groups.append(SystemGroup(rows, PassiveSystem(a), b))
    return RobustSystem(groups, n, reference, dropped)
