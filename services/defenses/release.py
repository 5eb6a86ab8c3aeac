"""Release chains: the coordinator's single point where scores and model parameters leave it.

Every defense is a *step*, a plug-in of :mod:`vflsec.services.registry` (name written once, parameters from
its constructor, the model families it supports):

* score steps (:data:`SCORE_STEPS`, services/defenses/scores.py): ``released = step(scores, logits, context)``
  on a batch (rows are samples);
* parameter steps (:data:`PARAM_STEPS`, :class:`Distortion` here, the built-in steps in services/defenses/params.py):
  ``step.distort(block, ...)`` runs at the passive party that owns the block, ``step.check(block, result)`` at the
  coordinator.

A chain is an ordered list of steps parsed from specs such as ``"privee:epsilon=0.1"``; parameters and the
model family are checked when the chain is built (configuration time), so a bad value fails before any
session starts. Importing the ``vflsec.services.defenses`` package imports the modules that define the
built-in steps, which register themselves. A score step whose class sets ``uses_raw_logits = True``
recomputes the release from the logits and must therefore be the first score step.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from vflsec.services.crypto.entropy import CryptoRandom
from vflsec.services.registry import Plugin, PluginError, Registry, parse_spec

__all__ = [
    "PARAM_STEPS",
    "SCORE_STEPS",
    "DataStats",
    "Distorted",
    "Distortion",
    "ParamReleaseChain",
    "ReleaseConfigError",
    "ReleaseContext",
    "ReleaseStep",
    "ReleasedParams",
    "ReleasedScores",
    "ScoreReleaseChain",
    "ScoreStep",
    "StepDescription",
    "parse_spec",
]

# A release step spec names an unknown step, carries an invalid parameter or does not fit the model family.
ReleaseConfigError = PluginError


@dataclass
class ReleaseContext:
    """What a step may use besides the batch itself. Random draws come from ``rng`` and are never released.

    The coordinator's ``rng`` reads OS entropy on every draw (services/crypto/entropy.py): no seed reaches it.
    """

    rng: CryptoRandom | np.random.Generator
    n_classes: int
    # Passive weight blocks (party id -> K_logits x d_p), known to the coordinator after training.
    passive_weights: Mapping[str, np.ndarray] = field(default_factory=dict)
    # Per-session cache a step may use for work that depends only on the model (e.g. an SVD).
    cache: dict[str, Any] = field(default_factory=dict)


StepDescription = tuple[str, dict[str, str]]  # a step's name and its public parameters, as the parties see them


@dataclass(frozen=True)
class ReleasedScores:
    """Scores as the release point lets them out, with the steps that made them (public: Kerckhoffs) and how
    many rows' argmax they changed."""

    scores: np.ndarray
    chain: list[StepDescription]
    argmax_changed: int


@dataclass(frozen=True)
class ReleasedParams:
    """A trained model as the release point lets it out: each passive party's block after the parameter chain
    (None: withheld), the bias offset the chain adds, the named tensors of the key holder's trainer (and any pulled
    passive tensors), and the chain's steps."""

    passive: dict[str, np.ndarray | None]
    bias_offset: np.ndarray | None
    tensors: dict[str, np.ndarray]
    chain: list[StepDescription]


class ReleaseStep(Plugin):
    """A release step; it announces every constructor parameter to the parties (Kerckhoffs) unless it overrides
    :meth:`public_params`. Random draws are never constructor parameters, so they are never announced."""

    def public_params(self) -> dict[str, str]:
        """The configuration the active party may know (never a random draw)."""
        return {key: str(value) for key, value in self.get_params().items()}


class ScoreStep(ReleaseStep, ABC):
    uses_raw_logits: ClassVar[bool] = False

    @abstractmethod
    def __call__(self, scores: np.ndarray, logits: np.ndarray, context: ReleaseContext) -> np.ndarray: ...


# Features are min-max scaled to [0, 1]; allow rounding noise at the edges.
_RANGE_TOLERANCE = 1e-9


@dataclass(frozen=True)
class DataStats:
    """The passive party's feature statistics (rassouli §V): μ = E[X], K_0 = E[XXᵀ], K_½ = E[(X−½1)(X−½1)ᵀ]."""

    mu: np.ndarray  # (d,)
    k0: np.ndarray  # (d, d)
    k_half: np.ndarray  # (d, d)
    n: int

    @classmethod
    def from_features(cls, x: np.ndarray) -> DataStats:
        """Empirical statistics of min-max scaled features (rows are samples, values in [0, 1])."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
            raise ValueError(f"features must be a non-empty (n, d) matrix, got shape {x.shape}")
        if not np.isfinite(x).all():
            raise ValueError("features must be finite")
        if x.min() < -_RANGE_TOLERANCE or x.max() > 1.0 + _RANGE_TOLERANCE:
            raise ValueError(f"features must be min-max scaled to [0, 1], got range [{x.min():g}, {x.max():g}]")
        n = x.shape[0]
        centred = x - 0.5
        return cls(mu=x.mean(axis=0), k0=x.T @ x / n, k_half=centred.T @ centred / n, n=n)

    @property
    def d(self) -> int:
        return int(self.mu.shape[0])


@dataclass(frozen=True)
class Distorted:
    """What a distortion produced: the disclosed block (None = withheld) and what goes public or stays private.

    ``bias_offset`` (K_logits,) is part of the released model: the coordinator adds it to the disclosed bias.
    ``private`` (achieved g, secret ε′, the transform, ...) never reaches the active party.
    ``undoable``: a Kerckhoffs attacker recovers the true block from what it is told (the announced mechanism
    and parameters, the disclosed block, the bias offset) — the distortion then protects nothing.
    """

    disclosed: np.ndarray | None
    bias_offset: np.ndarray | None = None
    public: dict[str, str] = field(default_factory=dict)
    private: dict[str, Any] = field(default_factory=dict)
    undoable: bool = False


class Distortion(ReleaseStep, ABC):
    """One parameter-release distortion of an LR weight block: ``distort`` at the passive party, ``check`` at the
    coordinator."""

    families = frozenset({"lr"})
    needs_stats: bool = True  # the passive party's data statistics go into ``distort``

    @abstractmethod
    def distort(
        self, w_passive: np.ndarray, stats: DataStats | None, n_classes: int, rng: np.random.Generator
    ) -> Distorted:
        """The disclosed version of one passive block (runs at the passive party)."""

    def check(self, w_passive: np.ndarray, result: Distorted) -> None:
        """Coordinator-side verification of a result computed elsewhere; raises ValueError on mismatch."""


SCORE_STEPS: Registry[ScoreStep] = Registry("score release step")
PARAM_STEPS: Registry[Distortion] = Registry("parameter release step")


@dataclass
class ScoreReleaseChain:
    """Score steps in order; ``family`` is the model family the chain was checked for (None: not checked)."""

    steps: list[ScoreStep] = field(default_factory=list)
    family: str | None = None

    def __post_init__(self) -> None:
        # A step that recomputes the release from the raw logits would silently discard earlier steps.
        for position, step in enumerate(self.steps):
            if position > 0 and step.uses_raw_logits:
                raise ReleaseConfigError(
                    f"score release step {step.name!r} recomputes the scores from the logits, so it must be "
                    "the first score step"
                )
        if self.family is not None:
            self.require(self.family)

    @classmethod
    def from_specs(cls, specs: Sequence[str], family: str | None = None) -> ScoreReleaseChain:
        return cls([SCORE_STEPS.parse(spec, family=family) for spec in specs], family)

    def require(self, family: str) -> None:
        """ReleaseConfigError unless every step supports the model family ``family``."""
        for step in self.steps:
            SCORE_STEPS.check_family(step.name, family)

    def __call__(self, scores: np.ndarray, logits: np.ndarray, context: ReleaseContext) -> np.ndarray:
        released = scores
        for step in self.steps:
            released = np.asarray(step(released, logits, context), dtype=np.float64)
            if released.shape != scores.shape:
                raise RuntimeError(f"release step {step.name!r} changed the batch shape")
        return released

    def describe(self) -> list[StepDescription]:
        return [(step.name, step.public_params()) for step in self.steps]


@dataclass
class ParamReleaseChain:
    """Parameter steps in order, and their specs as configured: the passive parties run the same steps."""

    steps: list[Distortion] = field(default_factory=list)
    specs: list[str] = field(default_factory=list)
    family: str | None = None

    def __post_init__(self) -> None:
        if self.family is not None:
            self.require(self.family)

    @classmethod
    def from_specs(cls, specs: Sequence[str], family: str | None = None) -> ParamReleaseChain:
        return cls([PARAM_STEPS.parse(spec, family=family) for spec in specs], list(specs), family)

    def require(self, family: str) -> None:
        """ReleaseConfigError unless every step supports the model family ``family``."""
        for step in self.steps:
            PARAM_STEPS.check_family(step.name, family)

    def describe(self) -> list[StepDescription]:
        return [(step.name, step.public_params()) for step in self.steps]


def served_families(score: ScoreReleaseChain, param: ParamReleaseChain, candidates: Sequence[str]) -> list[str]:
    """The model families among ``candidates`` that every step of both chains supports: the sessions a coordinator
    with these chains can open (OpenSession refuses the others with FAILED_PRECONDITION)."""
    served = []
    for family in candidates:
        try:
            score.require(family)
            param.require(family)
        except ReleaseConfigError:
            continue
        served.append(family)
    return served
