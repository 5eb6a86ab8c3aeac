"""Agnostic inference attacks (varasteh §IV): estimate the target's scores instead of receiving them.

The adversary model (AM) is a softmax LR f_θa on the active features only, trained on the active party's own
labelled training rows (Eq. 8). Its scores ĉ replace the released ones in the white-box system
A x = b(ĉ); the estimate is LS when the system is determined (d_p < C, Eq. 10–11) and Half* otherwise
(Eq. 16), clipped to [0, 1] (varasteh's strategy i). Any sample — one never queried included — can be
attacked this way.

The refined AM (RAM, Eq. 9) adds the delivered scores c_j of the n_p queried rows to the training loss:

    (1 / (n_t + n_p)) [Σ_t H(f(y_t), u_t) + β Σ_j H(f(y_j), argmax c_j)] + (α / n_p) Σ_j S(f(y_j), c_j) + ω(θ)

with S(x, y) = Σ_k (ln x_k − ln y_k)², (α, β) = (1, 0) for exact scores and (0, 1) for label-only releases.

Held-out scoring (varasteh scores rows the model never saw): RAM cross-fits — the queried rows are split
into ``folds`` and each fold's scores are estimated by a model refined on the other folds' delivered scores
only. AM and RAM both drop from their training set any row whose active features equal a queried row's
(the harness may query rows the model was trained on), so no reconstructed row was fitted; ``held_out=False``
keeps them, as varasteh's "average over time" attacks the training rows in-sample (harness MSE scope ``all``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from scipy.special import softmax

from .base import Attack, Observations, Reconstruction, register
from .gradient import torch_threads
from .linear import SCORE_FLOOR, passive_system


def fit_adversary_model(
    x_train: np.ndarray,
    y_train: np.ndarray,
    n_classes: int,
    *,
    x_delivered: np.ndarray | None = None,
    delivered_scores: np.ndarray | None = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    weight_decay: float = 1e-4,
    max_iter: int = 300,
) -> tuple[np.ndarray, np.ndarray]:
    """Train the (refined) adversary model; returns its softmax weights (C, d_a) and bias (C,).

    The objective is convex in (W, b), so full-batch L-BFGS reaches the optimum deterministically.
    """
    # np.array copies: recorded observations may be read-only views, which torch refuses to wrap.
    xt = torch.from_numpy(np.array(x_train, dtype=np.float64))
    yt = torch.from_numpy(np.array(y_train, dtype=np.int64))
    if yt.min() < 0 or yt.max() >= n_classes:
        raise ValueError(f"train_y must hold class indices in [0, {n_classes})")
    refine = x_delivered is not None and delivered_scores is not None and len(x_delivered) > 0
    if refine:
        xp = torch.from_numpy(np.array(x_delivered, dtype=np.float64))
        c_delivered = torch.from_numpy(np.array(delivered_scores, dtype=np.float64))
        log_c = torch.log(c_delivered.clamp_min(max(SCORE_FLOOR, torch.finfo(torch.float64).tiny)))
        labels_p = c_delivered.argmax(dim=1)
    weight = torch.zeros((n_classes, xt.shape[1]), dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(n_classes, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS(
        [weight, bias], lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe", tolerance_grad=1e-9
    )

    def objective() -> torch.Tensor:
        optimizer.zero_grad()
        ce = torch.nn.functional.cross_entropy(xt @ weight.T + bias, yt, reduction="sum")
        n_total = xt.shape[0]
        loss = torch.zeros((), dtype=torch.float64)
        if refine:
            logits_p = xp @ weight.T + bias
            n_total += xp.shape[0]
            if beta:
                ce = ce + beta * torch.nn.functional.cross_entropy(logits_p, labels_p, reduction="sum")
            if alpha:
                log_f = torch.log_softmax(logits_p, dim=1)
                loss = loss + alpha * ((log_f - log_c) ** 2).sum(dim=1).mean()
        loss = loss + ce / n_total + weight_decay * (weight**2).sum()
        loss.backward()
        return loss

    optimizer.step(objective)
    return weight.detach().numpy(), bias.detach().numpy()


def _not_queried(train_x: np.ndarray, queried_x: np.ndarray) -> np.ndarray:
    """Mask of the training rows whose features equal no queried row's (exact match, as stored)."""
    queried = {row.tobytes() for row in np.ascontiguousarray(queried_x, dtype=np.float64)}
    return np.array([row.tobytes() not in queried for row in np.ascontiguousarray(train_x, dtype=np.float64)])


class AdversaryModelAttack(Attack):
    """AM (``refine=False``) or RAM (``refine=True``); ``n_refine`` caps how many delivered scores RAM uses
    per fold; ``folds`` (≥ 2) is RAM's cross-fitting; ``held_out`` drops the attacked rows from the training
    set (see the module docstring)."""

    families = frozenset({"lr"})

    def __init__(
        self,
        refine: bool = False,
        alpha: float = 1.0,
        beta: float = 0.0,
        n_refine: int | None = None,
        folds: int = 2,
        weight_decay: float = 1e-4,
        threads: int | None = 1,
        held_out: bool = True,
    ) -> None:
        if folds < 2:
            raise ValueError(f"folds must be >= 2 (scores are estimated for rows the model did not see), got {folds}")
        self.folds = folds
        self.held_out = held_out
        self.refine = refine
        self.threads = threads
        self.alpha = alpha
        self.beta = beta
        self.n_refine = n_refine
        self.weight_decay = weight_decay
        base = {"w_active", "w_passive", "bias", "train_x_active", "train_y"}
        self.needs = frozenset(base | {"scores"} if refine else base)

    def reconstruct(self, obs: Observations) -> Reconstruction:
        assert obs.train_x_active is not None and obs.train_y is not None
        keep = (
            _not_queried(obs.train_x_active, obs.x_active)
            if self.held_out
            else np.ones(len(obs.train_x_active), dtype=bool)
        )
        x_train, y_train = obs.train_x_active[keep], obs.train_y[keep]
        x_queried = np.asarray(obs.x_active, float)
        n = obs.n_samples
        estimated = np.empty((n, obs.n_classes))
        n_refine = 0
        # AM never sees the queried rows: one fit serves them all. RAM refines fold by fold.
        fold_of = np.arange(n) % self.folds if self.refine else np.zeros(n, dtype=int)
        for fold in np.unique(fold_of):
            delivered: dict[str, Any] = {}
            if self.refine:
                assert obs.scores is not None
                others = np.flatnonzero(fold_of != fold)[: self.n_refine]
                delivered = {"x_delivered": x_queried[others], "delivered_scores": obs.scores[others]}
                n_refine = len(others)
            with torch_threads(self.threads):
                weight, bias = fit_adversary_model(
                    x_train,
                    y_train,
                    obs.n_classes,
                    alpha=self.alpha,
                    beta=self.beta,
                    weight_decay=self.weight_decay,
                    **delivered,
                )
            scored = fold_of == fold
            estimated[scored] = softmax(x_queried[scored] @ weight.T + bias, axis=1)
        system, b = passive_system(obs, scores=estimated)
        x = system.least_squares(b) if system.determined else system.half_star(b)
        meta: dict[str, Any] = {
            "method": "ls" if system.determined else "half_star",
            "n_refine": n_refine,
            "n_train_excluded": int(np.count_nonzero(~keep)),
            "estimated_scores": estimated,
        }
        return Reconstruction(x_passive=np.clip(x, 0.0, 1.0), meta=meta)


register("am", AdversaryModelAttack)
register("ram", AdversaryModelAttack, refine=True)
