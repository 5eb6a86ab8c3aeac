"""Release chains: the coordinator's single point where scores and model parameters leave it.

Every defense is a *step* with one contract:

* score steps: ``released = step(scores, logits, context)`` on a batch (rows are samples);
* parameter steps: ``disclosed = step(weights, context)`` on the passive blocks of the model.

A chain is an ordered list of steps parsed from specs such as ``"privee:epsilon=0.1"``. Steps register
themselves by name with :func:`score_step` / :func:`param_step`; parameters are validated when the chain is
built (configuration time), so a bad value fails before any session starts. A score step whose class sets
``uses_raw_logits = True`` recomputes the release from the logits and must therefore be the first score step.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from vflsec.services.crypto.entropy import CryptoRandom


class ReleaseConfigError(ValueError):
    """A release step spec names an unknown step or carries an invalid parameter."""


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


class ScoreStep(Protocol):
    name: str

    def public_params(self) -> dict[str, str]: ...

    def __call__(self, scores: np.ndarray, logits: np.ndarray, context: ReleaseContext) -> np.ndarray: ...


class ParamStep(Protocol):
    name: str

    def public_params(self) -> dict[str, str]: ...

    def __call__(
        self, weights: Mapping[str, np.ndarray | None], context: ReleaseContext
    ) -> dict[str, np.ndarray | None]: ...


_SCORE_STEPS: dict[str, Callable[..., ScoreStep]] = {}
_PARAM_STEPS: dict[str, Callable[..., ParamStep]] = {}


def score_step(name: str) -> Callable[[Callable[..., ScoreStep]], Callable[..., ScoreStep]]:
    """Register a score-release step factory (a class whose ``__init__`` takes the step's parameters)."""

    def register(factory: Callable[..., ScoreStep]) -> Callable[..., ScoreStep]:
        _SCORE_STEPS[name] = factory
        return factory

    return register


def param_step(name: str) -> Callable[[Callable[..., ParamStep]], Callable[..., ParamStep]]:
    """Register a parameter-release step factory."""

    def register(factory: Callable[..., ParamStep]) -> Callable[..., ParamStep]:
        _PARAM_STEPS[name] = factory
        return factory

    return register


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``"privee:epsilon=0.1,basis=householder"`` -> ``("privee", {"epsilon": "0.1", ...})``."""
    name, _, rest = spec.strip().partition(":")
    if not name:
        raise ReleaseConfigError(f"empty release step in {spec!r}")
    params: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ReleaseConfigError(f"release step {name!r}: expected key=value, got {item!r}")
        params[key.strip()] = value.strip()
    return name, params


def build_param_step(spec: str) -> ParamStep:
    """One parameter-release step from its spec (ReleaseConfigError on a bad one)."""
    return _build(spec, _PARAM_STEPS, "parameter")


def _build(spec: str, registry: Mapping[str, Callable[..., Any]], kind: str) -> Any:
    _load_builtin_steps()
    name, params = parse_spec(spec)
    factory = registry.get(name)
    if factory is None:
        known = ", ".join(sorted(registry)) or "none"
        raise ReleaseConfigError(f"unknown {kind} release step {name!r} (known: {known})")
    accepted = inspect.signature(factory).parameters
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ReleaseConfigError(f"{kind} release step {name!r} has no parameter(s) {unknown}")
    try:
        return factory(**params)
    except (TypeError, ValueError) as exc:
        raise ReleaseConfigError(f"{kind} release step {name!r}: {exc}") from exc


@dataclass
class ScoreReleaseChain:
    steps: list[ScoreStep] = field(default_factory=list)

    def __post_init__(self) -> None:
        # A step that recomputes the release from the raw logits would silently discard earlier steps.
        for position, step in enumerate(self.steps):
            if position > 0 and getattr(step, "uses_raw_logits", False):
                raise ReleaseConfigError(
                    f"score release step {step.name!r} recomputes the scores from the logits, so it must be "
                    "the first score step"
                )

    @classmethod
    def from_specs(cls, specs: Sequence[str]) -> ScoreReleaseChain:
        return cls([_build(spec, _SCORE_STEPS, "score") for spec in specs])

    def __call__(self, scores: np.ndarray, logits: np.ndarray, context: ReleaseContext) -> np.ndarray:
        released = scores
        for step in self.steps:
            released = np.asarray(step(released, logits, context), dtype=np.float64)
            if released.shape != scores.shape:
                raise RuntimeError(f"release step {step.name!r} changed the batch shape")
        return released

    def describe(self) -> list[tuple[str, dict[str, str]]]:
        return [(step.name, step.public_params()) for step in self.steps]


@dataclass
class ParamReleaseChain:
    steps: list[ParamStep] = field(default_factory=list)
    specs: list[str] = field(default_factory=list)  # as configured: passive parties run the same steps

    @classmethod
    def from_specs(cls, specs: Sequence[str]) -> ParamReleaseChain:
        return cls([build_param_step(spec) for spec in specs], list(specs))

    def __call__(
        self, weights: Mapping[str, np.ndarray | None], context: ReleaseContext
    ) -> dict[str, np.ndarray | None]:
        disclosed: dict[str, np.ndarray | None] = dict(weights)
        for step in self.steps:
            disclosed = step(disclosed, context)
        return disclosed

    def describe(self) -> list[tuple[str, dict[str, str]]]:
        return [(step.name, step.public_params()) for step in self.steps]


def _load_builtin_steps() -> None:
    """Import the modules that define built-in steps so that they register themselves."""
    import importlib

    for module in _BUILTIN_STEP_MODULES:
        importlib.import_module(module)


# Modules whose import registers steps; defenses add themselves here.
_BUILTIN_STEP_MODULES: list[str] = ["vflsec.services.defenses.scores", "vflsec.services.defenses.params"]
