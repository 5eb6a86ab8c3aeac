"""`vflsec reproduce`: the seed papers' quantitative claims, each measured by the suite's own attacks.

One registered :class:`Claim` per claim: the paper, the value it printed, the function that measures ours,
the rule behind the verdict, the datasets it needs, and whether it is in the ``--fast`` subset. A claim whose
dataset is missing from the shared datasets folder is ``skipped`` with that reason, never faked.

Models are trained on real data and every attack is scored on rows the model did not train on, with Half
(x̂ = ½·1) beside it. Two claims run the real services (in-process parties, gRPC over mTLS, plain backend;
``services_report``); the others train the LR in process (``synthetic.fitted_lr_task``, the ye claims
ye_measure.py) and run the same attack functions on what the active party would receive. This module holds the
registry (:func:`claim`) and the helpers the papers' modules share.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vflsec.services.attacks import make_attack, mse, run_attack
from vflsec.services.attacks.synthetic import SyntheticTask, fit_lr, fitted_lr_task
from vflsec.services.data import datasets

VERDICTS = ("reproduced", "differs", "skipped", "error")
# An attack claim says what an attack achieves; a sanity check tests a property of the data or of the random
# number generator that the attack claims lean on (rassouli's Var(U) = 1/12, varasteh's Half levels): counted apart.
KINDS = ("attack", "sanity")


@dataclass(frozen=True)
class Measurement:
    measured: Any  # the figure(s) set against the paper's
    holds: bool  # the claim's rule holds on them
    details: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None  # why it differs, when the measurement itself shows it
    # The claim's check that it could have failed (e.g. the attacks beat Half before their ordering is judged): a
    # claim whose rule holds while this check fails differs, with the check named as the reason.
    could_fail: bool = True


@dataclass(frozen=True)
class Claim:
    name: str
    paper: str  # paper and section
    statement: str
    paper_value: Any
    rule: str  # the tolerance / rule behind the verdict
    measure: Callable[[], Measurement]
    datasets: tuple[str, ...] = ()  # shared (UCI) datasets it needs; scikit-learn's are always there
    fast: bool = False
    known_difference: str | None = None  # the reason recorded in docs/ when the claim is known to differ
    # The known difference as a predicate on a `differs` row (its measured figures, details, runs): a `differs`
    # for another reason (an attack broken, a check that could not fail) is not the known one.
    differs_as_known: Callable[[dict[str, Any]], bool] | None = None
    kind: str = "attack"  # KINDS
    # What would make the claim fail although the code ran (its non-vacuity check): every claim states one.
    could_fail: str = ""
    # Claims whose verdict depends on random draws the run cannot seed (a party's OS entropy) run several times;
    # the verdict is `reproduced` only when every run reproduces.
    runs: int = 1


CLAIMS: dict[str, Claim] = {}


def claim(name: str | None = None, **fields: Any) -> Callable[[Callable[[], Measurement]], Callable[[], Measurement]]:
    """Register a measuring function as a claim (named after the function unless ``name`` is given)."""

    def register(measure: Callable[[], Measurement]) -> Callable[[], Measurement]:
        nonlocal name
        name = name or measure.__name__
        if name in CLAIMS:
            raise ValueError(f"claim {name!r} registered twice")
        if fields.get("kind", "attack") not in KINDS or not fields.get("could_fail"):
            raise ValueError(f"claim {name!r}: kind must be one of {KINDS} and could_fail must say how it can fail")
        CLAIMS[name] = Claim(name=name, measure=measure, **fields)
        return measure

    return register


# ------------------------------------------------------------------------------------------------ helpers

# An ordering of attacks is judged only when its best attack beats Half by this share of Half's MSE: attacks that
# all returned ½·1 would satisfy an ordering with ties, or a per-sample ≤, and say nothing.
THEOREM1_MARGIN = 0.1
# ye_masquerade_bank's runs: the review-6 test notes counted 6 (4 reproduced).
YE_RUNS = 6


def attack_mse(task: SyntheticTask, name: str, **options: Any) -> float:
    """Clipped MSE of one attack on the task's held-out rows (the figure the reports compare)."""
    x_hat = run_attack(make_attack(name, **options), task.obs).x_passive
    return mse(task.x_passive, np.clip(x_hat, 0.0, 1.0))


@dataclass(frozen=True)
class UciTask:
    task: SyntheticTask
    passive: list[str]  # the passive columns' names
    x_query: np.ndarray  # every scaled column of the queried rows (ground truth for Half levels)
    y_query: np.ndarray

    @property
    def accuracy(self) -> float:
        return float(np.mean(self.task.obs.scores.argmax(axis=1) == self.y_query))  # type: ignore[union-attr]


@functools.cache
def uci_data(name: str, encoding: str, n_query: int, seed: int) -> tuple[Any, ...]:
    """A UCI dataset as the papers set it up: encoded (``target``: fitted on the training rows only), each
    column min-max scaled over all rows as its owner scales it, ``n_query`` random rows held out (queried),
    and an LR fitted once on the rest (the same function whichever columns are then passive)."""
    ds = datasets.load_dataset(name, categorical="ordinal" if encoding == "target" else encoding)  # type: ignore[arg-type]
    rows = np.random.default_rng(seed).permutation(ds.n_samples)
    query, train = rows[:n_query], rows[n_query:]
    if encoding == "target":
        ds = datasets.target_encode(ds, train)
    x = datasets.Scaler.fit(ds.X, "minmax").transform(ds.X)
    return x, ds.y, train, query, list(ds.feature_names), fit_lr(x[train], ds.y[train])


def uci_task(name: str, encoding: str, passive: Sequence[str] | float, n_query: int, seed: int = 0) -> UciTask:
    """The trained LR of :func:`uci_data` queried on its held-out rows, ``passive`` the passive columns (names,
    or a fraction drawn at random with ``seed``: luo's setting)."""
    x, y, train, query, names, model = uci_data(name, encoding, n_query, seed)
    if isinstance(passive, float):
        chosen = np.random.default_rng(seed + 1).permutation(len(names))[: round(passive * len(names))]
    else:
        chosen = np.array([names.index(c) for c in passive])
    passive_idx = np.sort(chosen)
    active_idx = np.setdiff1d(np.arange(len(names)), passive_idx)
    task = fitted_lr_task(x, y, train, query, active_idx, passive_idx, model)
    return UciTask(task, [names[j] for j in passive_idx], x[query], y[query])


def services_report(dataset: str, attacks: Sequence[str], predictions: int, **spec: Any) -> dict[str, Any]:
    """One run through the real services (in-process parties over gRPC + mTLS, plain backend): the harness's
    report of the curious active party's attacks on its recordings."""
    from vflsec.client.experiments.harness import AttackScenario, run_attack_scenario
    from vflsec.client.federation.launcher import FederationSpec

    scenario = AttackScenario(
        FederationSpec(dataset, backend="plain", **spec), attacks=attacks, predictions=predictions, in_process=True
    )
    return run_attack_scenario(scenario)
