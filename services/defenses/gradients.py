"""Training-time gradient defenses: what the active party does to ∂L/∂h before it forwards it to a passive party.

In split-NN coordinator-top the key holder returns ∂L/∂h (batch × E) to the active party, which forwards it to every
passive party in ``Backward`` (docs/protocol.md, "Split neural networks"); ∂L/∂h carries the labels (norm and
direction scoring, services/attacks/labels.py). The active party owns the labels, holds them beside the gradient,
and is the last party the gradient passes before it leaves for a passive party, so it runs the chain (its own bottom
steps on the gradient it received, undefended). ``label_dp`` acts earlier: on the labels the active party sends to
the key holder in ``TopStep``, so every gradient of the session is computed from randomised labels.

Every step is a plug-in of :data:`GRADIENT_STEPS` (services/registry.py, the one convention: a spec such as
``max_norm`` or ``dp_gaussian:noise_multiplier=2,clip=0.05`` is parsed there). A session's chain is
``SplitNnModel.gradient_defense``: part of the session's settings, so every party of the session sees the specs
(Kerckhoffs: the mechanism and its public parameters are known; every draw is the active party's OS entropy,
:func:`vflsec.services.crypto.entropy.os_entropy`, never a seed another party chose).

* ``max_norm`` — Li et al. (ICLR 2022) §5.1: N(0, σ_j² I) added to row j with σ_j² = (M² − ‖g_j‖²)/E, M the
  batch's largest row norm, so every row's expected squared norm is M².
* ``marvell`` — Li et al. §5.2: class-dependent Gaussian noise against the symmetric KL between the two classes'
  perturbed-gradient distributions under a noise power budget P = scale · ‖ḡ₁ − ḡ₀‖² (a simplified solver that
  matches the classes' covariances first: :func:`marvell_noise`).
* ``dp_gaussian`` — each row clipped to ‖g‖ ≤ C, then N(0, (zC)² I): the Gaussian mechanism on the row's gradient
  with label-replacement sensitivity 2C, accounted by zCDP over the epochs (:func:`gaussian_epsilon`).
* ``sparsification`` — each row keeps its ``keep`` fraction of largest-magnitude entries, the others become 0.
* ``discrete_sgd`` — Fu et al. (USENIX Security 2022) §7: every entry rounded to one of ``levels`` equally spaced
  values over the batch's [min, max], stochastically and without bias.
* ``label_dp`` — Ghazi et al. (NeurIPS 2021): randomized response on the training labels, ε-label-DP; each row's
  label is drawn once per session (a fresh draw per epoch would let the trained model average the flips away).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vflsec.services.crypto.entropy import CryptoRandom, os_entropy
from vflsec.services.registry import Plugin, Registry

__all__ = [
    "GRADIENT_STEPS",
    "DiscreteSgd",
    "DpGaussian",
    "GradientChain",
    "GradientStep",
    "LabelDp",
    "Marvell",
    "MaxNorm",
    "Sparsification",
    "gaussian_epsilon",
    "marvell_noise",
    "rr_keep_probability",
]

GRADIENT_STEPS: Registry[GradientStep] = Registry("gradient defense step")
SPLITNN = frozenset({"splitnn"})


class GradientStep(Plugin):
    """A step of the gradient chain. ``defend`` maps a batch's ∂L/∂h (rows: samples) and the labels it was computed
    from to what the passive parties receive; ``train_labels`` maps the labels sent to the key holder. Both default to
    the identity. Every constructor parameter is public (announced with the session's settings)."""

    families = SPLITNN

    def defend(self, gradient: np.ndarray, labels: np.ndarray, rng: CryptoRandom) -> np.ndarray:
        return gradient

    def train_labels(self, labels: np.ndarray, rows: np.ndarray, n_classes: int, rng: CryptoRandom) -> np.ndarray:
        return labels

    def public_params(self) -> dict[str, str]:
        return {key: str(value) for key, value in self.get_params().items()}

    def accounting(self, releases: int) -> dict[str, Any] | None:
        """The formal guarantee after each row's gradient left ``releases`` times (None: the step has none)."""
        return None

    def state(self) -> dict[str, np.ndarray]:
        """Draws that must outlive a restart of the active party (checkpointed with the session)."""
        return {}

    def load_state(self, arrays: dict[str, np.ndarray]) -> None:
        pass


@GRADIENT_STEPS.register("max_norm")
class MaxNorm(GradientStep):
    """Li et al.'s max-norm: Gaussian noise lifts every row's expected squared norm to the batch's largest.

    So the norm no longer ranks the rows in expectation; the noise is isotropic and fresh every step."""

    def __init__(self) -> None:
        pass

    def defend(self, gradient: np.ndarray, labels: np.ndarray, rng: CryptoRandom) -> np.ndarray:
        g = np.asarray(gradient, dtype=np.float64)
        squared = np.einsum("ij,ij->i", g, g)
        sigma = np.sqrt(np.maximum(squared.max() - squared, 0.0) / g.shape[1])
        return g + sigma[:, None] * np.asarray(rng.standard_normal(g.shape))


@GRADIENT_STEPS.register("marvell")
class Marvell(GradientStep):
    """Li et al.'s Marvell: per-class Gaussian noise minimising the classes' KL under a power budget.

    Binary labels; the budget is ``scale`` · ‖ḡ₁ − ḡ₀‖² (the paper's s). A batch with one class gets the budget of
    the last batch with both, isotropic."""

    def __init__(self, scale: float = 4.0) -> None:
        if not scale > 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        self.scale = scale
        self._last_power = 0.0

    def defend(self, gradient: np.ndarray, labels: np.ndarray, rng: CryptoRandom) -> np.ndarray:
        g = np.asarray(gradient, dtype=np.float64)
        y = np.asarray(labels)
        if set(np.unique(y)) - {0, 1}:
            raise ValueError("marvell protects binary labels (Li et al.); this batch has other classes")
        if len(np.unique(y)) < 2:  # no class means to contrast: spend the last budget isotropically
            return g + math.sqrt(self._last_power / g.shape[1]) * np.asarray(rng.standard_normal(g.shape))
        noise, self._last_power = marvell_noise(g, y, self.scale, rng)
        return g + noise


def marvell_noise(
    g: np.ndarray, y: np.ndarray, scale: float, rng: CryptoRandom
) -> tuple[np.ndarray, float]:
    """Marvell's noise for one batch, and its power budget P = scale · ‖Δ‖², Δ = ḡ₁ − ḡ₀.

    Li et al. minimise the symmetric KL between N(ḡ₀, Σ₀ + W₀) and N(ḡ₁, Σ₁ + W₁) over the noise covariances W_k
    subject to p₀ tr W₀ + p₁ tr W₁ ≤ P. The simplified solver here (not the paper's numerical one) takes two
    steps. First each row of class k gets the deviation from its class mean of a row of the *other* class drawn at
    random from the batch: a class-k row is then ḡ_k + (its own deviation) + (a draw of the other class's), so both
    classes' rows are distributed alike about their means, covariance Σ̂₀ + Σ̂₁ (every covariance term of the KL
    vanishes, and no other moment tells them apart either). Then the rest of the budget goes along Δ̂ as Gaussian
    noise, for both classes alike, where it shrinks the remaining Δᵀ(Σ̂₀ + Σ̂₁ + W)⁻¹Δ the most. When the first step
    costs more than P, its draws are scaled down to fit and nothing goes along Δ̂. (Two earlier versions, each beaten
    by a Kerckhoffs attacker reading a row's energy off the class axis on Bank: Σ_k modelled as isotropic, AUC 0.985;
    Gaussian noise of covariance Σ̂_{1−k}, which matches the second moments but not the heavy tails of the rarer
    class's deviations, AUC 0.881 at scale 250.)"""
    classes = [np.flatnonzero(y == k) for k in (0, 1)]
    means = [g[rows].mean(axis=0) for rows in classes]
    delta = means[1] - means[0]
    distance = float(delta @ delta)
    power = scale * distance
    if distance == 0.0:
        return np.zeros_like(g), 0.0
    centred = [g[rows] - mean for rows, mean in zip(classes, means, strict=True)]
    spread = [float((c**2).sum()) / len(c) for c in centred]  # tr Σ̂_k
    share = [len(rows) / len(y) for rows in classes]
    matching = share[0] * spread[1] + share[1] * spread[0]
    fraction = min(1.0, power / matching) if matching > 0 else 1.0
    along = max(power - fraction * matching, 0.0)
    unit = delta / math.sqrt(distance)
    noise = math.sqrt(along) * np.asarray(rng.standard_normal(len(y)))[:, None] * unit
    for k, rows in enumerate(classes):
        other = centred[1 - k]
        drawn = np.minimum((np.asarray(rng.random(len(rows))) * len(other)).astype(np.int64), len(other) - 1)
        noise[rows] += math.sqrt(fraction) * other[drawn]
    return noise, power


@GRADIENT_STEPS.register("dp_gaussian")
class DpGaussian(GradientStep):
    """Gaussian mechanism: each row clipped to ‖g‖ ≤ clip, plus N(0, (noise_multiplier · clip)² I); ε accounted."""

    def __init__(self, noise_multiplier: float = 1.0, clip: float = 0.01, delta: float = 1e-5) -> None:
        if not noise_multiplier > 0:
            raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier}")
        if not clip > 0:
            raise ValueError(f"clip must be > 0, got {clip}")
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        self.noise_multiplier, self.clip, self.delta = noise_multiplier, clip, delta

    def defend(self, gradient: np.ndarray, labels: np.ndarray, rng: CryptoRandom) -> np.ndarray:
        g = np.asarray(gradient, dtype=np.float64)
        norms = np.linalg.norm(g, axis=1, keepdims=True)
        clipped = g * np.minimum(1.0, self.clip / np.maximum(norms, 1e-300))
        return clipped + self.noise_multiplier * self.clip * np.asarray(rng.standard_normal(g.shape))

    def accounting(self, releases: int) -> dict[str, Any]:
        return {
            "epsilon": gaussian_epsilon(self.noise_multiplier, releases, self.delta),
            "delta": self.delta,
            "releases_per_row": releases,
            "guarantee": "label DP of each row's own ∂L/∂h releases (sensitivity 2·clip, zCDP composition); the "
            "label's influence on the top model, hence on other rows' later gradients, is not covered",
        }


def gaussian_epsilon(noise_multiplier: float, releases: int, delta: float) -> float:
    """ε of ``releases`` Gaussian releases of one row's clipped gradient, noise σ = z·C, label-replacement
    sensitivity Δ = 2C: each is ρ = Δ²/(2σ²) = 2/z² zCDP, they add up, and ρ-zCDP gives
    (ρ + 2√(ρ ln(1/δ)), δ)-DP (Bun & Steinke 2016, Prop. 1.3)."""
    rho = releases * 2.0 / noise_multiplier**2
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


@GRADIENT_STEPS.register("sparsification")
class Sparsification(GradientStep):
    """Sparsification: each row keeps its ⌈keep · E⌉ largest-magnitude entries (ties: the first), zeroes the rest."""

    def __init__(self, keep: float = 0.25) -> None:
        if not 0 < keep <= 1:
            raise ValueError(f"keep must be a fraction in (0, 1], got {keep}")
        self.keep = keep

    def defend(self, gradient: np.ndarray, labels: np.ndarray, rng: CryptoRandom) -> np.ndarray:
        g = np.asarray(gradient, dtype=np.float64)
        k = max(1, math.ceil(self.keep * g.shape[1]))
        order = np.argsort(-np.abs(g), axis=1, kind="stable")[:, :k]
        out = np.zeros_like(g)
        np.put_along_axis(out, order, np.take_along_axis(g, order, axis=1), axis=1)
        return out


@GRADIENT_STEPS.register("discrete_sgd")
class DiscreteSgd(GradientStep):
    """Fu et al.'s DiscreteSGD: every entry stochastically rounded to one of ``levels`` values over the batch's range.

    The levels are equally spaced over [min, max]; an entry rounds up with probability equal to its position within
    its interval, so the rounding is unbiased (and its noise fresh every step)."""

    def __init__(self, levels: int = 3) -> None:
        if levels < 2:
            raise ValueError(f"levels must be >= 2, got {levels}")
        self.levels = levels

    def defend(self, gradient: np.ndarray, labels: np.ndarray, rng: CryptoRandom) -> np.ndarray:
        g = np.asarray(gradient, dtype=np.float64)
        low, high = float(g.min()), float(g.max())
        if high == low:
            return g.copy()
        step = (high - low) / (self.levels - 1)
        position = (g - low) / step
        below = np.minimum(np.floor(position), self.levels - 2)
        up = np.asarray(rng.random(g.shape)) < position - below
        return low + (below + up) * step


@GRADIENT_STEPS.register("label_dp")
class LabelDp(GradientStep):
    """Label DP by randomized response (Ghazi et al.): each training label drawn once per session, ε-label-DP.

    A row keeps its label with probability e^ε / (e^ε + K − 1), else takes one of the other K − 1 uniformly."""

    def __init__(self, epsilon: float = 1.0) -> None:
        if not epsilon > 0:
            raise ValueError(f"epsilon must be > 0, got {epsilon}")
        self.epsilon = epsilon
        self._drawn: dict[int, int] = {}  # common row -> its randomised label, drawn once

    def train_labels(self, labels: np.ndarray, rows: np.ndarray, n_classes: int, rng: CryptoRandom) -> np.ndarray:
        y = np.asarray(labels)
        new = [i for i, row in enumerate(rows) if int(row) not in self._drawn]
        if new:
            fresh = randomized_response(y[new], n_classes, self.epsilon, rng)
            self._drawn.update(zip((int(rows[i]) for i in new), (int(v) for v in fresh), strict=True))
        return np.array([self._drawn[int(row)] for row in rows], dtype=y.dtype)

    def accounting(self, releases: int) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "delta": 0.0, "guarantee": "ε-label-DP of the whole training (RR once)"}

    def state(self) -> dict[str, np.ndarray]:
        # a redraw after a restart would give the key holder a second randomised label of the row: 2ε
        rows = np.fromiter(self._drawn, dtype=np.int64, count=len(self._drawn))
        return {"rows": rows, "labels": np.array([self._drawn[int(r)] for r in rows], dtype=np.int64)}

    def load_state(self, arrays: dict[str, np.ndarray]) -> None:
        self._drawn = dict(zip(map(int, arrays["rows"]), map(int, arrays["labels"]), strict=True))


def rr_keep_probability(epsilon: float, n_classes: int) -> float:
    return math.exp(epsilon) / (math.exp(epsilon) + n_classes - 1)


def randomized_response(labels: np.ndarray, n_classes: int, epsilon: float, rng: CryptoRandom) -> np.ndarray:
    """Each label kept with :func:`rr_keep_probability`, else replaced by one of the other classes uniformly."""
    y = np.asarray(labels, dtype=np.int64)
    u = np.asarray(rng.random((2, len(y))))
    keep = u[0] < rr_keep_probability(epsilon, n_classes)
    other = (y + 1 + np.minimum((u[1] * (n_classes - 1)).astype(np.int64), n_classes - 2)) % n_classes
    return np.where(keep, y, other)


@dataclass
class GradientChain:
    """A session's gradient steps in order, their draws from the active party's OS entropy."""

    steps: list[GradientStep] = field(default_factory=list)
    rng: CryptoRandom = field(default_factory=os_entropy)

    @classmethod
    def from_specs(cls, specs: Sequence[str]) -> GradientChain:
        return cls([GRADIENT_STEPS.parse(spec, family="splitnn") for spec in specs])

    def __bool__(self) -> bool:
        return bool(self.steps)

    def train_labels(self, labels: np.ndarray, rows: np.ndarray, n_classes: int) -> np.ndarray:
        for step in self.steps:
            labels = step.train_labels(labels, rows, n_classes, self.rng)
        return labels

    def defend(self, gradient: np.ndarray, labels: np.ndarray) -> np.ndarray:
        out = np.asarray(gradient, dtype=np.float64)
        for step in self.steps:
            out = np.asarray(step.defend(out, labels, self.rng), dtype=np.float64)
            if out.shape != np.shape(gradient):
                raise RuntimeError(f"gradient defense step {step.name!r} changed the batch shape")
        return out

    def describe(self) -> list[tuple[str, dict[str, str]]]:
        return [(step.name, step.public_params()) for step in self.steps]

    def state(self, prefix: str = "gradient_defense") -> dict[str, np.ndarray]:
        """Every step's draws to checkpoint, under ``prefix/<position>/<name>``."""
        return {f"{prefix}/{i}/{k}": v for i, step in enumerate(self.steps) for k, v in step.state().items()}

    def load_state(self, arrays: dict[str, np.ndarray], prefix: str = "gradient_defense") -> None:
        for i, step in enumerate(self.steps):
            mine = {k.removeprefix(f"{prefix}/{i}/"): v for k, v in arrays.items() if k.startswith(f"{prefix}/{i}/")}
            if mine:
                step.load_state(mine)
