"""Trained LR on real sklearn data, released through a score chain: the setting of the issue-10 acceptance tests."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.datasets import load_breast_cancer, load_digits, load_wine

from vflsec.services.attacks import Observations
from vflsec.services.defenses.params import DataStats, make_distortion
from vflsec.services.defenses.release import ReleaseContext, ScoreReleaseChain, parse_spec
from vflsec.services.models import lr
from vflsec.services.models.lr import confidence_scores

LOADERS = {"digits": load_digits, "wine": load_wine, "breast_cancer": load_breast_cancer}


@dataclass(frozen=True)
class RealTask:
    x_active: np.ndarray  # held-out rows the attack did not fit
    x_passive: np.ndarray
    w_active: np.ndarray
    w_passive: np.ndarray
    bias: np.ndarray
    logits: np.ndarray
    n_classes: int

    def observe(self, score_release: tuple[str, ...] = (), param_release: tuple[str, ...] = ()) -> Observations:
        """What the active party receives: the scores through the chain (fresh OS entropy), the model, the chains."""
        chain = ScoreReleaseChain.from_specs(score_release)
        context = ReleaseContext(
            rng=np.random.default_rng(), n_classes=self.n_classes, passive_weights={"passive": self.w_passive}
        )
        scores = chain(confidence_scores(self.logits), self.logits, context)
        w_passive, bias = self.w_passive, self.bias
        for spec in param_release:  # the passive party's distortion, as the coordinator discloses it
            distorted = make_distortion(spec).distort(
                w_passive, DataStats.from_features(self.x_passive), self.n_classes, context.rng
            )
            w_passive = distorted.disclosed
            if distorted.bias_offset is not None:
                bias = bias + distorted.bias_offset
        return Observations(
            x_active=self.x_active,
            scores=scores,
            n_classes=self.n_classes,
            d_passive=self.x_passive.shape[1],
            w_active=self.w_active,
            bias=bias,
            w_passive=w_passive,
            release=tuple(step.name for step in chain.steps),
            score_chain=tuple(chain.describe()),
            param_chain=tuple(parse_spec(spec) for spec in param_release),
        )


def train_lr(
    x: np.ndarray, y: np.ndarray, n_classes: int, l2: float = 1e-4, epochs: int = 30, batch: int = 64, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """The services' LR training in plain numpy: Adam, lr 0.1, 30 epochs (`vflsec attack`'s defaults; l2 1e-4)."""
    config = lr.OptimizerConfig("adam", 0.1, l2)
    k = lr.n_logits(n_classes)
    w, b = np.zeros((k, x.shape[1])), np.zeros(k)
    opt_w, opt_b = lr.BlockOptimizer(config, w.shape), lr.BlockOptimizer(config, b.shape, penalised=False)
    t, rng = lr.targets(y, n_classes), np.random.default_rng(seed)
    for _ in range(epochs):
        for rows in lr.batches(rng.permutation(len(x)), batch):
            err = (lr.link(x[rows] @ w.T + b) - t[rows]) / len(rows)
            w, b = opt_w.step(w, err.T @ x[rows]), opt_b.step(b, err.sum(axis=0))
    return w, b


def real_task(name: str, d_passive: int | float, n_query: int = 300, seed: int = 0, l2: float = 1e-4) -> RealTask:
    """Min-max scaled features, the last ``d_passive`` columns passive; LR fitted on the rows not queried."""
    data = LOADERS[name]()
    x = data.data.astype(float)
    span = x.max(axis=0) - x.min(axis=0)
    x = (x - x.min(axis=0)) / np.where(span > 0, span, 1.0)
    d_p = d_passive if isinstance(d_passive, int) else max(1, round(d_passive * x.shape[1]))
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(x))
    query, train = order[:n_query], order[n_query:]
    n_classes = int(data.target.max()) + 1
    w, b = train_lr(x[train], data.target[train], n_classes, l2=l2, seed=seed)
    xq = x[query]
    return RealTask(
        x_active=xq[:, :-d_p],
        x_passive=xq[:, -d_p:],
        w_active=w[:, :-d_p],
        w_passive=w[:, -d_p:],
        bias=b,
        logits=xq @ w.T + b,
        n_classes=n_classes,
    )
