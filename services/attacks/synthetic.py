"""LR prediction tasks with known ground truth, for tests, benchmarks and demos.

:func:`lr_task`: features from a Gaussian copula: z ~ N(0, (1 − ρ) I + ρ 11ᵀ), x = Φ(z), so every feature is
Uniform[0, 1] (already "min-max scaled") and pairs are positively dependent with strength ρ; the model's
weights are random. On such data Half is the best blind guess by construction (every marginal is uniform),
so it is no test of whether a learned attack finds structure — :func:`trained_lr_task` is: a logistic
regression trained on real data, attacked on held-out rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import expit, ndtr, softmax

from .base import Observations

SKLEARN_TASKS = ("breast_cancer", "wine", "digits")


@dataclass(frozen=True)
class SyntheticTask:
    obs: Observations  # what the adversary sees
    x_passive: np.ndarray  # ground truth, only for scoring reconstructions
    weights: np.ndarray  # full model (K_logits, d_a + d_p)
    bias: np.ndarray


def correlated_uniform_features(n: int, d: int, rho: float, rng: np.random.Generator) -> np.ndarray:
    """n rows of d Uniform[0, 1] features with equicorrelated Gaussian-copula dependence ρ ∈ [0, 1)."""
    if not 0.0 <= rho < 1.0:
        raise ValueError(f"rho must lie in [0, 1), got {rho}")
    shared = rng.standard_normal((n, 1))
    own = rng.standard_normal((n, d))
    return ndtr(np.sqrt(rho) * shared + np.sqrt(1.0 - rho) * own)


def model_scores(x: np.ndarray, weights: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Released-score layout: ``[1 − p, p]`` for one sigmoid logit, softmax otherwise."""
    logits = x @ weights.T + bias
    if weights.shape[0] == 1:
        p = expit(logits[:, 0])
        return np.stack([1.0 - p, p], axis=1)
    return softmax(logits, axis=1)


def lr_task(
    n: int,
    d_active: int,
    d_passive: int,
    n_classes: int = 2,
    *,
    sigmoid: bool | None = None,
    rho: float = 0.5,
    weight_scale: float = 2.0,
    n_train: int = 0,
    seed: int = 0,
) -> SyntheticTask:
    """A random LR model over correlated features; ``n_train`` labelled active rows for agnostic attacks.

    ``sigmoid`` defaults to True for two classes (one logit) and must be False for more.
    """
    sigmoid = n_classes == 2 if sigmoid is None else sigmoid
    if sigmoid and n_classes != 2:
        raise ValueError("a sigmoid model has two classes")
    rng = np.random.default_rng(seed)
    k_logits = 1 if sigmoid else n_classes
    weights = rng.normal(scale=weight_scale, size=(k_logits, d_active + d_passive))
    bias = rng.normal(size=k_logits)
    x = correlated_uniform_features(n + n_train, d_active + d_passive, rho, rng)
    scores = model_scores(x, weights, bias)
    train_x = train_y = None
    if n_train:
        cumulative = np.cumsum(scores[n:], axis=1)
        train_y = (rng.uniform(size=(n_train, 1)) > cumulative).sum(axis=1).clip(max=n_classes - 1)
        train_x = x[n:, :d_active]
    obs = Observations(
        x_active=x[:n, :d_active],
        scores=scores[:n],
        n_classes=n_classes,
        d_passive=d_passive,
        w_active=weights[:, :d_active],
        bias=bias,
        w_passive=weights[:, d_active:],
        train_x_active=train_x,
        train_y=train_y,
    )
    return SyntheticTask(obs=obs, x_passive=x[:n, d_active:], weights=weights, bias=bias)


def trained_lr_task(dataset: str, passive_fraction: float = 0.4, *, seed: int = 0) -> SyntheticTask:
    """scikit-learn's ``dataset`` min-max scaled to [0, 1], a random ``passive_fraction`` of the columns
    passive, an LR (sklearn, L2, C = 1) trained on a random half of the rows; the other half are the queried
    rows (``obs``) and the training half is the active party's labelled rows (``train_x_active``)."""
    from sklearn import datasets as skd  # imported lazily: sklearn takes a while to import
    from sklearn.linear_model import LogisticRegression

    if dataset not in SKLEARN_TASKS:
        raise ValueError(f"dataset must be one of {SKLEARN_TASKS}, got {dataset!r}")
    x, y = getattr(skd, f"load_{dataset}")(return_X_y=True)
    low, span = x.min(axis=0), np.ptp(x, axis=0)
    x = (x - low) / np.where(span > 0, span, 1.0)
    rng = np.random.default_rng(seed)
    rows, columns = rng.permutation(len(y)), rng.permutation(x.shape[1])
    train, query = rows[: len(y) // 2], rows[len(y) // 2 :]
    d_passive = round(passive_fraction * x.shape[1])
    passive, active = np.sort(columns[:d_passive]), np.sort(columns[d_passive:])
    model = LogisticRegression(max_iter=5000).fit(x[train], y[train])
    weights, bias = model.coef_, model.intercept_
    obs = Observations(
        x_active=x[query][:, active],
        scores=model_scores(x[query], weights, bias),
        n_classes=len(model.classes_),
        d_passive=d_passive,
        w_active=weights[:, active],
        bias=bias,
        w_passive=weights[:, passive],
        train_x_active=x[train][:, active],
        train_y=y[train],
    )
    full = np.hstack([weights[:, active], weights[:, passive]])
    return SyntheticTask(obs=obs, x_passive=x[query][:, passive], weights=full, bias=bias)
