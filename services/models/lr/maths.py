"""Logistic-regression math shared by every party: links, targets and per-block optimisers.

A C-class model has K_logits = 1 logit for C = 2 (sigmoid) and K_logits = C otherwise (softmax). Each party
owns one weight block W_q (K_logits x d_q); the active party also owns the bias. With
L = mean cross-entropy + (l2/2)·||W||², the gradient of a block is δᵀX_q / n + l2·W_q where δ = p − Y.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

# Re-exported: the activations score defenses share, and the engines' batching, which LR's reference trainers
# (tests, attacks' curves) share.
from vflsec.services.models.activations import sigmoid as sigmoid
from vflsec.services.models.activations import softmax as softmax
from vflsec.services.models.family import batches as batches


def n_logits(n_classes: int) -> int:
    if n_classes < 2:
        raise ValueError(f"a classifier needs at least 2 classes, got {n_classes}")
    return 1 if n_classes == 2 else n_classes


def link(z: np.ndarray) -> np.ndarray:
    """Training probabilities in logit layout: σ(z) for one logit, softmax otherwise."""
    return sigmoid(z) if z.shape[1] == 1 else softmax(z)


def softmax_layout(k_logits: int) -> np.ndarray:
    """LR's released-score layout as a (k, C) matrix L: the released scores of logits z are softmax(z L). A sigmoid
    model's one logit z is the softmax pair [0, z], so it releases [1 − σ(z), σ(z)], as in the papers; K logits are
    softmax logits already. Weights (rows = logits) take the same layout as Lᵀ W. The one place this is written:
    the release (:func:`confidence_scores`), the score defenses and the attacks all use it."""
    if k_logits == 1:
        return np.array([[0.0, 1.0]])
    return np.eye(k_logits)


def confidence_scores(z: np.ndarray) -> np.ndarray:
    """The released form (n, C) of logits z (n, k): softmax(z L) (:func:`softmax_layout`)."""
    return softmax(z @ softmax_layout(z.shape[1]))


def targets(y: np.ndarray, n_classes: int) -> np.ndarray:
    """Labels in logit layout: y itself for a sigmoid model, one-hot for softmax."""
    y = np.asarray(y, dtype=np.int64)
    if n_classes == 2:
        return y.astype(np.float64)[:, None]
    out = np.zeros((y.size, n_classes))
    out[np.arange(y.size), y] = 1.0
    return out


@dataclass
class OptimizerConfig:
    name: str = "adam"
    learning_rate: float = 0.05
    l2: float = 1e-4

    def __post_init__(self) -> None:
        if self.name not in ("sgd", "adam"):
            raise ValueError(f"optimizer must be 'sgd' or 'adam', got {self.name!r}")
        if not (self.learning_rate > 0 and np.isfinite(self.learning_rate)):
            raise ValueError(f"learning rate must be positive, got {self.learning_rate}")
        if not (self.l2 >= 0 and np.isfinite(self.l2)):
            raise ValueError(f"l2 must be non-negative, got {self.l2}")


@dataclass
class BlockOptimizer:
    """SGD or Adam on one party's parameter array; ``penalised`` is False for the bias."""

    config: OptimizerConfig
    shape: tuple[int, ...]
    penalised: bool = True
    _m: np.ndarray = field(init=False, repr=False)
    _v: np.ndarray = field(init=False, repr=False)
    _t: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self._m = np.zeros(self.shape)
        self._v = np.zeros(self.shape)

    def state(self) -> tuple[dict[str, np.ndarray], int]:
        return {"m": self._m.copy(), "v": self._v.copy()}, self._t

    def load_state(self, arrays: dict[str, np.ndarray], t: int) -> None:
        self._m, self._v, self._t = np.array(arrays["m"]), np.array(arrays["v"]), int(t)

    def step(self, params: np.ndarray, data_gradient: np.ndarray) -> np.ndarray:
        grad = data_gradient + (self.config.l2 * params if self.penalised else 0.0)
        lr = self.config.learning_rate
        if self.config.name == "sgd":
            return params - lr * grad
        beta1, beta2, eps = 0.9, 0.999, 1e-8
        self._t += 1
        self._m = beta1 * self._m + (1 - beta1) * grad
        self._v = beta2 * self._v + (1 - beta2) * grad * grad
        m_hat = self._m / (1 - beta1**self._t)
        v_hat = self._v / (1 - beta2**self._t)
        return params - lr * m_hat / (np.sqrt(v_hat) + eps)


# Minimum batch (docs/protocol.md, "Batch bound"). A party's gradient of one step is δᵀX_q: k·w_q linear
# equations in the n·k unknowns of δ, where w_q is its block width (d_p for a passive party, d_a + 1 with the
# bias column for the active party). n > w_q keeps δ underdetermined; the margin (a factor 2) leaves at least
# as many free dimensions per class as the equations pin down.
BATCH_MARGIN_FACTOR = 2
DEFAULT_BATCH_SIZE = 64


def min_batch_size(widths: Iterable[int]) -> int:
    """The smallest batch the coordinator admits for parties of these block widths: 2 · max width."""
    return BATCH_MARGIN_FACTOR * max(widths, default=1)


def default_batch_size(widths: Iterable[int]) -> int:
    """The default batch: DEFAULT_BATCH_SIZE, raised to the minimum when the parties are wide."""
    return max(DEFAULT_BATCH_SIZE, min_batch_size(widths))
