"""An attacker with auxiliary labels: k queried rows whose passive features it already knows.

The blind attackers of this package know only what was released. The field's standard attacker with auxiliary
knowledge (model completion: a few labelled rows and a supervised model fitted on what the adversary holds) knows
more, so it is opt-in and reported apart: ``labelled_rows`` is given the true passive features of k of the queried
rows, fits one gradient-boosting model per passive column on the k rows and predicts the others; the harness scores
it on those others only.

Its inputs per row are the recorded embeddings z_B of an active-top split NN and the active party's own columns.
Under an announced masquerade (Kerckhoffs: m is public) the fabricated bits are first peeled off the span with
:func:`~.binary.peel_search` (``ye_peel``'s search) and projected out of z_B, so the learner is not handed m
coin-flip directions. Beside it, the same learner on the same k rows fitted on the active party's own columns alone
(``meta["own_columns"]``): what the attacker would know with its labels but without z_B. The gap between the two is
what z_B adds; the gap between the own-columns figure and the majority rate is what the labels and the active
party's own columns give whatever the passive party releases.
"""

from __future__ import annotations

import math

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
from threadpoolctl import threadpool_limits

from .base import Attack, NotApplicable, Observations, Reconstruction, register
from .binary import _embeddings, _strip, peel_search

__all__ = ["DEFAULT_K", "LabelledRows", "fit_columns"]

DEFAULT_K = 2000  # labelled rows when k is not given: this many, at most half the queried rows


def fit_columns(
    features: np.ndarray, rows: np.ndarray, known: np.ndarray, *, seed: int | None = 0, max_iter: int = 100
) -> np.ndarray:
    """Per passive column, a gradient-boosting model fitted on ``features[rows]`` → ``known`` and applied to every
    row: a column whose known values are exactly {0, 1} is a classifier's probability of 1, any other a regression
    clipped to [0, 1] (the passive features' scaled range); a column constant on the known rows is that constant.
    One OpenMP thread: on small fits the pool's start-up and contention cost more than it gains (0.34 s → 0.06 s for
    1,500 rows on the 2 shared cores)."""
    with threadpool_limits(1):
        return _fit_columns(features, rows, known, seed, max_iter)


def _fit_columns(
    features: np.ndarray, rows: np.ndarray, known: np.ndarray, seed: int | None, max_iter: int
) -> np.ndarray:
    n, d = len(features), known.shape[1]
    out = np.empty((n, d))
    x_fit = features[rows]
    for j in range(d):
        y = known[:, j]
        values = np.unique(y)
        if len(values) == 1:
            out[:, j] = values[0]
        elif set(values.tolist()) == {0.0, 1.0}:
            model = HistGradientBoostingClassifier(max_iter=max_iter, random_state=seed)
            out[:, j] = model.fit(x_fit, y.astype(int)).predict_proba(features)[:, 1]
        else:
            model = HistGradientBoostingRegressor(max_iter=max_iter, random_state=seed)
            out[:, j] = np.clip(model.fit(x_fit, y).predict(features), 0.0, 1.0)
    return out


def _masquerade_m(obs: Observations) -> int | None:
    """m of an announced masquerade step, None if none is announced (log2n: ⌈log₂ n⌉ of the recorded rows)."""
    for step, params in (*obs.embedding_chain, *obs.param_chain, *obs.score_chain):
        if step == "masquerade":
            m = params.get("m", "log2n")
            return math.ceil(math.log2(obs.n_samples)) if m == "log2n" else int(m)
    return None


@register("labelled_rows")
class LabelledRows(Attack):
    """k labelled rows (auxiliary knowledge): gradient boosting from [z_B (masquerade's bits stripped), own columns]
    to each passive column, and the same from the own columns alone (``meta["own_columns"]``).

    ``k``: labelled rows, default min(DEFAULT_K, half the queried rows); an explicit k must leave a row to score.
    ``strip``: peel an announced masquerade's fabricated bits off z_B first. ``seed``: the learner's and the peel's
    own randomness (None draws fresh)."""

    families = frozenset({"splitnn"})
    needs = frozenset({"embeddings"})
    metric = "column_accuracy"

    def __init__(self, k: int | None = None, strip: bool = True, max_iter: int = 100, seed: int | None = 0) -> None:
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 2):
            raise ValueError(f"k must be an integer >= 2 (labelled rows), got {k!r}")
        if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
            raise ValueError(f"max_iter must be an integer >= 1, got {max_iter!r}")
        self.k, self.strip, self.max_iter, self.seed = k, strip, max_iter, seed

    def auxiliary_rows(self, n_samples: int) -> int:
        if self.k is None:
            return min(DEFAULT_K, n_samples // 2)
        if self.k >= n_samples:
            raise NotApplicable(
                f"k={self.k} labelled rows leave none of the {n_samples} queried rows to score "
                f"(at most {n_samples - 1})"
            )
        return self.k

    def reconstruct(self, obs: Observations) -> Reconstruction:
        if obs.labelled_rows is None or obs.labelled_passive is None:
            raise NotApplicable(f"{self.name} needs labelled rows of the passive features (auxiliary knowledge)")
        z = _embeddings(obs, self.name)
        m = _masquerade_m(obs) if self.strip else None
        meta: dict[str, object] = {"labelled_rows": len(obs.labelled_rows)}
        if m is not None:
            peeled = peel_search(z, obs.d_passive, m, rng=np.random.default_rng(self.seed))
            z = _strip(z, peeled.bits)
            meta["fabricated_m"] = int(peeled.bits.shape[1])  # the bits found and stripped (at most m)
        own = np.asarray(obs.x_active, dtype=np.float64)
        rows, known = np.asarray(obs.labelled_rows), np.asarray(obs.labelled_passive, dtype=np.float64)
        x = fit_columns(np.hstack([z, own]), rows, known, seed=self.seed, max_iter=self.max_iter)
        meta["own_columns"] = (
            fit_columns(own, rows, known, seed=self.seed, max_iter=self.max_iter)
            if own.shape[1]
            else np.tile(known.mean(axis=0), (len(z), 1))  # no own column: the labelled rows' means
        )
        return Reconstruction(x, meta)
