"""`vflsec reproduce`: the seed papers' quantitative claims, each measured by the suite's own attacks.

One registered :class:`Claim` per claim: the paper, the value it printed, the function that measures ours,
the rule behind the verdict, the datasets it needs, and whether it is in the ``--fast`` subset. A claim whose
dataset is missing from the shared datasets folder is ``skipped`` with that reason, never faked.

Models are trained on real data and every attack is scored on rows the model did not train on, with Half
(x̂ = ½·1) beside it. Two claims run the real services (in-process parties, gRPC over mTLS, plain backend;
``_federation``); the others train the LR in process (``synthetic.fitted_lr_task``, the ye claims
``client/ye_measure.py``) and run the same attack functions on what the active party would receive.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vflsec.services.attacks import Observations, make_attack, mse, run_attack
from vflsec.services.attacks.synthetic import SyntheticTask, fit_lr, fitted_lr_task, trained_lr_task
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


def _mse(task: SyntheticTask, name: str, **options: Any) -> float:
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
def _uci_data(name: str, encoding: str, n_query: int, seed: int) -> tuple[Any, ...]:
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


def _uci_task(name: str, encoding: str, passive: Sequence[str] | float, n_query: int, seed: int = 0) -> UciTask:
    """The trained LR of :func:`_uci_data` queried on its held-out rows, ``passive`` the passive columns (names,
    or a fraction drawn at random with ``seed``: luo's setting)."""
    x, y, train, query, names, model = _uci_data(name, encoding, n_query, seed)
    if isinstance(passive, float):
        chosen = np.random.default_rng(seed + 1).permutation(len(names))[: round(passive * len(names))]
    else:
        chosen = np.array([names.index(c) for c in passive])
    passive_idx = np.sort(chosen)
    active_idx = np.setdiff1d(np.arange(len(names)), passive_idx)
    task = fitted_lr_task(x, y, train, query, active_idx, passive_idx, model)
    return UciTask(task, [names[j] for j in passive_idx], x[query], y[query])


def _federation(dataset: str, attacks: Sequence[str], predictions: int, **spec: Any) -> dict[str, Any]:
    """One run through the real services (in-process parties over gRPC + mTLS, plain backend): the harness's
    report of the curious active party's attacks on its recordings."""
    from vflsec.client.federation.launcher import FederationSpec
    from vflsec.client.harness import AttackScenario, run_attack_scenario

    scenario = AttackScenario(
        FederationSpec(dataset, backend="plain", **spec), attacks=attacks, predictions=predictions, in_process=True
    )
    return run_attack_scenario(scenario)


# ---------------------------------------------------------------------------------------------------- luo

# luo §IV-A, Example 1: θ for 3 classes, x = (age 25, income 2K | deposit 8K, 3 years), no bias.
LUO_THETA = np.array([[0.08, 0.0002, 0.0005, 0.09], [0.06, 0.0005, 0.0002, 0.08], [0.01, 0.0001, 0.0004, 0.05]])
LUO_X = np.array([25.0, 2000.0, 8000.0, 3.0])
LUO_PRINTED_SCORES = (0.867, 0.084, 0.049)


def _luo_esa(scores: np.ndarray) -> np.ndarray:
    obs = Observations(
        LUO_X[None, :2], scores[None, :], 3, 2, w_active=LUO_THETA[:, :2], bias=np.zeros(3), w_passive=LUO_THETA[:, 2:]
    )
    return run_attack(make_attack("esa"), obs).x_passive[0]


@claim(
    paper="luo §IV-A Example 1",
    statement="the scores are v = (0.867, 0.084, 0.049) and ESA solves the two target features (8000, 3)",
    paper_value={"scores": list(LUO_PRINTED_SCORES), "x_target": [8000.0, 3.0]},
    rule="scores within 5e-4 of the printed v; ESA on the exact scores recovers (8000, 3) to 1e-6 relative",
    could_fail="ESA solves from the scores alone: a wrong θ, softmax or solver misses (8000, 3) by orders of magnitude",
    fast=True,
)
def luo_worked_example() -> Measurement:
    from scipy.special import softmax

    scores = softmax(LUO_THETA @ LUO_X)
    exact = _luo_esa(scores)
    printed = _luo_esa(np.array(LUO_PRINTED_SCORES))
    holds = bool(np.allclose(scores, LUO_PRINTED_SCORES, atol=5e-4) and np.allclose(exact, [8000.0, 3.0], rtol=1e-6))
    return Measurement(
        {"scores": scores.round(4).tolist(), "x_target": exact.tolist()},
        holds,
        {"esa_from_printed_3_decimal_scores": printed.round(2).tolist()},
    )


@claim(
    paper="luo §IV-A (ESA); rassouli Thm 2",
    statement="ESA reconstructs the passive features exactly (MSE 0) iff d_target ≤ C − 1",
    paper_value={"d_p <= C-1": 0.0, "d_p > C-1": "> 0"},
    rule="through the services, digits (C = 10), d_p = 5: ESA MSE < 1e-12; d_p = 26 (40 %): not exact, MSE > 1e-3",
    could_fail="the determined case must be exact (1e-12): an ESA that returned Half or the truth fails one of the "
    "two cases",
    fast=True,
)
def esa_exact_condition() -> Measurement:
    report = _federation("digits", ["esa"], 300, passive_features=5, epochs=10)
    determined = report["attacks"]["esa"]["mse"]
    task = trained_lr_task("digits")  # 26 passive columns, 9 equations
    result = run_attack(make_attack("esa"), task.obs)
    under = mse(task.x_passive, result.x_passive)
    holds = determined < 1e-12 and not result.meta["exact"] and under > 1e-3
    return Measurement(
        {"d_p <= C-1": determined, "d_p > C-1": under},
        holds,
        {
            "services_run": {"d_p": report["d_passive"], "accuracy": report["accuracy"],
                             "half": report["baselines"]["half"]},
            "underdetermined": {"d_p": task.obs.d_passive, "rank": int(result.meta["rank"]),
                                "half": _mse(task, "half")},
        },
    )


# luo Table III: LR on Bank marketing, 40 % of the features passive at random.
LUO_TABLE3 = {
    "noise_only": 0.1705,
    "xadv_only": 0.1514,
    "no_reg": 0.1474,
    "direct": 0.2862,
    "grn": 0.1216,
    "rg": 0.2459,
}
# Measured before (docs/attacks.md, GRN ablations): with few predictions luo's configuration under-trains.
LUO_TABLE3_KNOWN = (
    "luo's configuration under-trains with few predictions (lr 1e-4, 60 epochs, summed probability loss that "
    "saturates on confident scores; docs/attacks.md, GRN ablations)"
)


# The measurement: LUO_SEEDS splits (each its own held-out rows, LR fit and random 40 % of passive columns), every
# variant on the same split, so each comparison is a paired difference per split; its mean and spread decide.
LUO_SEEDS = (0, 1, 2)
# 4,000 predictions per split: three splits of 8,000 would take ~3x the suite's time budget. At 8,000 on one split
# (the suite's earlier single measurement) GRN led the best ablation by 2 %; at 4,000 luo's configuration
# under-trains (docs/experiments.md, "luo Table III").
LUO_QUERIES = 4000
LUO_ABLATIONS = ("noise_only", "xadv_only", "no_reg")
LUO_VARIANTS = {"noise_only": "grn_luo_noise_only", "xadv_only": "grn_luo_xadv_only", "no_reg": "grn_luo_no_reg",
                "direct": "grn_luo_direct", "grn": "grn_luo"}  # fmt: skip
LUO_MARGIN_SE = 2.0  # a comparison holds when its mean paired difference exceeds this many standard errors


def paired_margin(differences: Sequence[float]) -> dict[str, float]:
    """Mean of paired differences over splits, its standard error (sample std / √n) and the mean in SEs."""
    d = np.asarray(differences, dtype=float)
    se = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("inf")
    return {"mean": float(d.mean()), "se": se, "z": float(d.mean() / se) if se > 0 else float("inf")}


@claim(
    paper="luo Table III",
    statement="GRN ablation on Bank, 40 % passive: the full GRN beats every ablation; direct regression (case 4) "
    "is worse than random guessing (the ordering; luo's MSEs are in the table for comparison)",
    paper_value=LUO_TABLE3,
    rule=f"luo's own configuration and setting (grn_luo and its ablations, transductive as in luo §V-A: each "
    f"generator trained and scored on the same released predictions), {LUO_QUERIES:,} predictions of held-out "
    f"rows on each of {len(LUO_SEEDS)} splits (rows, LR fit, random 40 % passive): per split the paired differences "
    f"case − GRN (cases 1–4); every mean difference > {LUO_MARGIN_SE:g} standard errors, judged only when GRN beats "
    "Half. Beside it (not judged): GRN held out (2 folds, each scored by a generator trained on the other), and "
    "case 4 − RG with case 4's random start: at lr 1e-4 case 4's x̂ moves at most ~0.006 per coordinate from its "
    "N(0, 1) start, so that margin measures the start, not a regression",
    could_fail="GRN must beat Half (else the ordering of attacks that learned nothing is judged) and lead each "
    "ablation by 2 standard errors of the paired differences",
    datasets=("bank",),
    known_difference=f"at {LUO_QUERIES:,} predictions per split, luo's own GRN configuration (lr 1e-4, 60 epochs "
    "whatever the number of predictions) under-trains: in luo's transductive setting GRN improves on its held-out "
    "variant but stays above Half on the mean, so its ordering is not judged (docs/experiments.md, 'luo Table III')",
    differs_as_known=lambda r: r["measured"]["grn"] >= r["details"]["half"],
)
def luo_table3_grn_ablation() -> Measurement:
    extra = {"grn_held_out": ("grn_luo", {"folds": 2}), "direct_start": ("grn_luo_direct", {"epochs": 0}),
             "rg": ("rg", {}), "half": ("half", {})}  # fmt: skip
    per_split: dict[str, list[float]] = {case: [] for case in [*LUO_VARIANTS, *extra]}
    for seed in LUO_SEEDS:
        task = _uci_task("bank", "ordinal", 0.4, n_query=LUO_QUERIES, seed=seed).task  # GRN learns from many
        for case, attack in LUO_VARIANTS.items():
            per_split[case].append(_mse(task, attack))
        for case, (attack, options) in extra.items():
            per_split[case].append(_mse(task, attack, **options))
    mses = {case: np.asarray(values) for case, values in per_split.items()}
    margins = {f"{case} − grn": paired_margin(mses[case] - mses["grn"]) for case in [*LUO_ABLATIONS, "direct"]}
    beside = {"direct − rg": paired_margin(mses["direct"] - mses["rg"]),
              "direct_start − rg": paired_margin(mses["direct_start"] - mses["rg"]),
              "grn_held_out − grn": paired_margin(mses["grn_held_out"] - mses["grn"])}  # fmt: skip
    holds = all(m["z"] > LUO_MARGIN_SE for m in margins.values())
    could_fail = bool(mses["grn"].mean() < mses["half"].mean())
    measured = {case: float(mses[case].mean()) for case in [*LUO_VARIANTS, "rg"]}
    details = {"grn_held_out": float(mses["grn_held_out"].mean()), "half": float(mses["half"].mean()),
               "direct_start": float(mses["direct_start"].mean()),
               "std_over_splits": {case: float(v.std(ddof=1)) for case, v in mses.items()},
               "paired_margins": margins, "not_judged": beside, "per_split": per_split, "splits": len(LUO_SEEDS),
               "n_queried": LUO_QUERIES,
               "note": "measured: the mean MSE over the splits in luo's transductive setting; the verdict is on luo's "
                       "ordering, from the paired differences' spread; the MSEs themselves are not luo's (compare "
                       "with Half here)"}  # fmt: skip
    reason = None
    if not could_fail:
        reason = f"GRN {mses['grn'].mean():.4f} does not beat Half {mses['half'].mean():.4f}: " + LUO_TABLE3_KNOWN
    elif not holds:
        failed = [f"{name} {m['mean']:+.4f} ± {m['se']:.4f} SE ("
                  + ("the opposite order" if m["z"] < -LUO_MARGIN_SE else "within the spread") + ")"
                  for name, m in margins.items() if m["z"] <= LUO_MARGIN_SE]  # fmt: skip
        reason = (
            f"over {len(LUO_SEEDS)} splits luo's ordering does not hold by {LUO_MARGIN_SE:g} standard errors for "
            f"{'; '.join(failed)}; GRN {mses['grn'].mean():.4f}, Half {mses['half'].mean():.4f}: " + LUO_TABLE3_KNOWN
        )
    return Measurement(measured, holds, details, reason, could_fail)


TREE_TRIALS = 10  # seeds 0..9: a fresh split of rows and columns, tree / forest, queries and path draws each


def _tree_trials(dataset: str, model: str, attacks: Sequence[str], trials: int, **spec: Any) -> dict[str, Any]:
    """CBR per trial through the services (plain, in-process parties; the tree grown by the tree protocol, the
    curious active party's recordings attacked): every attack's CBR and the random-path CBR, mean ± std over the
    trials whose paths test a passive feature. Also GRN on RF's figures (scripts/measure_tree_attacks.py
    services-rf: 10 trials of a 100-tree forest take minutes, beyond a claim that CI runs)."""
    runs = [_federation(dataset, attacks, 160, model=model, epochs=1, seed=s, **spec) for s in range(trials)]
    cbr = {name: [r["attacks"][name].get("cbr", np.nan) for r in runs] for name in attacks}
    cbr["random_path"] = [r.get("cbr_random_path", np.nan) for r in runs]
    out: dict[str, Any] = {f"cbr_{k}": _spread(v) for k, v in cbr.items()}
    out["accuracy"] = float(np.mean([r["accuracy"] for r in runs]))
    out["d_passive"], out["d"] = runs[0]["d_passive"], runs[0]["d_passive"] + runs[0]["d_active"]
    return out


# luo_pra_cbr: PRA's mean CBR must exceed the random path's by this many standard errors of the difference.
PRA_MARGIN_SE = 2.0


def _margin_se(a: dict[str, float], b: dict[str, float]) -> float:
    """(mean a − mean b) in standard errors of the difference of two means (each a :func:`_spread`)."""
    se = np.sqrt(a["std"] ** 2 / a["trials"] + b["std"] ** 2 / b["trials"])
    return float((a["mean"] - b["mean"]) / se) if se > 0 else float(np.sign(a["mean"] - b["mean"]) * np.inf)


def _spread(values: Sequence[float]) -> dict[str, float]:
    v = np.asarray(values, dtype=np.float64)
    return {"mean": float(np.nanmean(v)), "std": float(np.nanstd(v)), "trials": int(np.isfinite(v).sum())}


@claim(
    paper="luo §IV-B, Algorithm 1; §VI",
    statement="PRA's correct branching rate on a released decision tree exceeds that of a random path",
    paper_value="CBR(PRA) > CBR(random path)",
    rule=f"through the services, DT depth 5, {TREE_TRIALS} trials (seeds) on wine and breast_cancer, 160 queried "
    f"rows each: the mean PRA CBR above the mean random-path CBR (luo's baseline) by > {PRA_MARGIN_SE:g} standard "
    "errors of the difference of the two means, on both; Half's CBR, the other blind floor, beside it",
    could_fail="a PRA that picked paths at random would sit at the random-path CBR, within the trials' spread of it "
    "(the margin in standard errors refuses that; a bare > would pass half the time)",
)
def luo_pra_cbr() -> Measurement:
    # luo's setting releases the passive thresholds: a tree withholds them unless asked (the `thresholds` step).
    measured = {
        name: _tree_trials(name, "tree", ["pra", "half"], TREE_TRIALS, param_release=["thresholds"])
        for name in ("wine", "breast_cancer")
    }
    margins = {name: _margin_se(m["cbr_pra"], m["cbr_random_path"]) for name, m in measured.items()}
    holds = min(margins.values()) > PRA_MARGIN_SE
    return Measurement(measured, holds, {"pra_minus_random_path_se": margins})


# luo §VI, Fig. 8: GRN on RF recovers > 80 % of the branches at 10 % target features on Bank and Drive. Drive
# (Sensorless Drive Diagnosis) is not in the shared datasets folder, so the claim runs on Bank only.
RF_SEEDS = (0, 1, 2)
RF_QUERIES = 1000


def _bank_forest(seed: int) -> Any:
    """luo's RF setting on Bank (ordinal encoding, min-max scaled): 100 trees of depth 3 fitted on the training
    rows, 10 % of the columns passive at random, ``RF_QUERIES`` held-out rows queried."""
    from sklearn.ensemble import RandomForestClassifier

    from vflsec.services.attacks.released import from_sklearn
    from vflsec.services.attacks.synthetic import TREE_MODELS, TreeTask
    from vflsec.services.attacks.trees import vote_fractions

    x, y, train, query, names, _ = _uci_data("bank", "ordinal", RF_QUERIES, seed)
    columns = np.random.default_rng(seed + 1).permutation(len(names))
    passive = np.sort(columns[: round(0.1 * len(names))])
    active = np.setdiff1d(np.arange(len(names)), passive)
    x = np.hstack([x[:, active], x[:, passive]])
    forest = RandomForestClassifier(**TREE_MODELS["forest"], random_state=seed).fit(x[train], y[train])
    trees = from_sklearn(forest, len(active))
    n_classes = int(y.max()) + 1
    x_active, x_passive = x[query][:, : len(active)], x[query][:, len(active) :]
    votes = vote_fractions(trees, x_active, x_passive, n_classes)
    return TreeTask(trees, x_active, x_passive, n_classes, float(np.mean(votes.argmax(axis=1) == y[query])))


@claim(
    paper="luo §VI, Fig. 8",
    statement="GRN on a random forest correctly infers more than 80 % of the tree branches at 10 % target "
    "features (Bank; luo also states it for Drive, which is not in the shared datasets folder)",
    paper_value={"cbr_grn_rf": "> 0.8"},
    rule=f"Bank, RF 100 trees of depth 3, 10 % random passive columns, {RF_QUERIES:,} held-out rows queried, "
    f"{len(RF_SEEDS)} splits: the mean CBR of luo's GRN (grn_rf) > 0.8 and above both blind floors (Half's CBR "
    "and the random path's), each on the mean over the splits (grn_rf_own, the suite's stronger tree attacker, is "
    "measured in docs/attacks.md: two more minutes per split here)",
    could_fail="Half, which learns nothing, already branches correctly on most of Bank's paths: GRN must beat it, "
    "not only 0.8",
    datasets=("bank",),
    known_difference="luo's GRN on RF stays below 80 % on the mean over Bank's splits, and per split it is close to "
    "blind Half's CBR, which swings with the two passive columns drawn (0.11 to 0.75 over three splits)",
    differs_as_known=lambda r: r["measured"]["cbr_grn_rf"] <= 0.8,
)
def luo_grn_rf_cbr_bank() -> Measurement:
    from vflsec.client.harness import random_path_baseline
    from vflsec.services.attacks.gradient import torch_threads
    from vflsec.services.attacks.trees import correct_branching_rate

    per_split: dict[str, list[float]] = {}
    for seed in RF_SEEDS:
        task = _bank_forest(seed)

        def cbr(x_hat: np.ndarray, task: Any = task) -> float:
            return correct_branching_rate(task.trees, task.x_active, task.x_passive, x_hat)

        path = random_path_baseline(task.trees, task.x_passive, np.random.default_rng())
        row = {"cbr_half": cbr(np.full_like(task.x_passive, 0.5)), "cbr_random_path": path, "accuracy": task.accuracy}
        with torch_threads(1):
            row["cbr_grn_rf"] = cbr(run_attack(make_attack("grn_rf"), task.observe()).x_passive)
        for key, value in row.items():
            per_split.setdefault(key, []).append(value)
    mean = {key: float(np.nanmean(v)) for key, v in per_split.items()}
    floor = max(mean["cbr_half"], mean["cbr_random_path"])
    holds = mean["cbr_grn_rf"] > 0.8 and mean["cbr_grn_rf"] > floor
    measured = {k: mean[k] for k in ("cbr_grn_rf", "cbr_half", "cbr_random_path")}
    reason = None
    if not holds:
        failed = [f"{mean['cbr_grn_rf']:.3f} ≤ 0.8"] if mean["cbr_grn_rf"] <= 0.8 else []
        floors = {"Half": "cbr_half", "random-path": "cbr_random_path"}
        failed += [f"not above the {n} floor {mean[k]:.3f}" for n, k in floors.items() if mean["cbr_grn_rf"] <= mean[k]]
        pairs = ", ".join(f"{g:.3f} vs {h:.3f}" for g, h in zip(per_split["cbr_grn_rf"], per_split["cbr_half"],
                                                                  strict=True))  # fmt: skip
        reason = (f"grn_rf mean CBR {mean['cbr_grn_rf']:.3f}: {'; '.join(failed)} (per split grn_rf vs Half: {pairs}; "
                  f"random path {mean['cbr_random_path']:.3f})")
    details = {"per_split": per_split, "accuracy": mean["accuracy"], "d_passive": task.x_passive.shape[1],
               "n_queried": RF_QUERIES}  # fmt: skip
    return Measurement(measured, holds, details, reason)


# ----------------------------------------------------------------------------------------------- rassouli


@claim(
    paper="rassouli Lemma 1",
    statement="MSE(RG) − MSE(Half) = Var(U) = 1/12 for any data distribution",
    paper_value=1 / 12,
    rule="|gap − 1/12| ≤ 0.005 on digits' held-out rows (26 passive columns; RG the mean of 10 fresh draws)",
    kind="sanity",
    could_fail="RG drawn from another law than U(0,1) (or not fresh) moves the gap off 1/12",
    fast=True,
)
def rg_minus_half() -> Measurement:
    task = trained_lr_task("digits")
    gap = np.mean([_mse(task, "rg", seed=None) for _ in range(10)]) - _mse(task, "half")  # 10 fresh draws
    return Measurement(gap, abs(gap - 1 / 12) <= 0.005)


@claim(
    paper="rassouli Thm 1",
    statement="per sample, ‖X − x̂_RCC2‖ ≤ ‖X − x̂_Half*‖ ≤ ‖X − ½·1‖ (exact scores)",
    paper_value={"share of samples": 1.0},
    rule="every held-out row of breast_cancer, wine and digits (LR, 40 % passive) satisfies both, to 1e-9; judged "
    f"only when RCC2 beats Half by ≥ {THEOREM1_MARGIN:.0%} of Half's MSE on each dataset",
    could_fail="attacks that all returned ½·1 satisfy the ordering with equality; the margin over Half refuses that",
    fast=True,
)
def theorem1_ordering() -> Measurement:
    shares, mses = {}, {}
    for dataset in ("breast_cancer", "wine", "digits"):
        task = trained_lr_task(dataset)
        estimates = {n: run_attack(make_attack(n), task.obs).x_passive for n in ("rcc2", "half_star", "half")}
        dist = {n: np.linalg.norm(task.x_passive - x, axis=1) for n, x in estimates.items()}
        ok = (dist["rcc2"] <= dist["half_star"] + 1e-9) & (dist["half_star"] <= dist["half"] + 1e-9)
        shares[dataset] = float(ok.mean())
        mses[dataset] = {n: mse(task.x_passive, x) for n, x in estimates.items()}
    worst = min(shares.values())
    beats = {k: 1 - m["rcc2"] / m["half"] for k, m in mses.items()}  # RCC2's advantage over Half, per dataset
    could_fail = min(beats.values()) >= THEOREM1_MARGIN
    reason = None
    if not could_fail:
        reason = f"RCC2 beats Half by {min(beats.values()):.1%} < {THEOREM1_MARGIN:.0%}: the ordering says nothing"
    return Measurement({"share of samples": worst}, worst == 1.0, {"share": shares, "mse": mses,
                       "rcc2_advantage_over_half": beats}, reason, could_fail)  # fmt: skip


@claim(
    paper="rassouli Thm 2",
    statement="MSE(LS) = Tr((I − A⁺A) K_0)/d and MSE(Half*) = Tr((I − A⁺A) K_½)/d",
    paper_value="closed form = measured",
    rule="the closed form with K_0, K_½ of the training rows matches the attacks' MSE on the held-out rows within "
    "3 standard errors of the difference of the two means (breast_cancer, wine, digits; LR, 40 % passive)",
    could_fail="the two closed forms differ from each other and from Half's MSE, so an attack returning the wrong "
    "estimate (Half, LS for Half*) misses its own form; judged only when each form is > 3 standard errors from "
    "Half's MSE on at least two of the three datasets (where Half would match a form, that case says nothing: "
    "details z_half)",
    fast=True,
)
def closed_form_mse() -> Measurement:
    from vflsec.services.attacks.linear import passive_system

    rows: dict[str, dict[str, float]] = {}
    worst, informative = 0.0, {"ls": 0, "half_star": 0}  # per form: the datasets where Half misses it
    for dataset in ("breast_cancer", "wine", "digits"):
        task = trained_lr_task(dataset)
        system, _ = passive_system(task.obs)
        null = system.null_basis @ system.null_basis.T  # I − A⁺A
        x_train, d = task.train_x_passive, task.obs.d_passive
        assert x_train is not None
        for name, centre in (("ls", 0.0), ("half_star", 0.5)):
            # Tr((I − A⁺A) K)/d is the mean over the training rows of (x − c)ᵀ(I − A⁺A)(x − c)/d.
            form = np.einsum("ij,jk,ik->i", x_train - centre, null, x_train - centre) / d
            x_hat = run_attack(make_attack(name), task.obs).x_passive
            errors = np.mean((task.x_passive - x_hat) ** 2, axis=1)
            se = np.sqrt(form.var(ddof=1) / len(form) + errors.var(ddof=1) / len(errors))
            z = abs(errors.mean() - form.mean()) / se
            half = np.mean((task.x_passive - 0.5) ** 2, axis=1)  # what an attack that learned nothing scores
            se_half = np.sqrt(form.var(ddof=1) / len(form) + half.var(ddof=1) / len(half))
            z_half = abs(half.mean() - form.mean()) / se_half
            worst, informative[name] = max(worst, z), informative[name] + int(z_half > 3.0)
            rows[f"{dataset} {name}"] = {"predicted": form.mean(), "measured": errors.mean(), "z": z, "z_half": z_half}
    could_fail = min(informative.values()) >= 2
    reason = None if could_fail else f"Half's MSE is > 3 standard errors from a form on only {informative} datasets"
    return Measurement({"largest |z|": worst}, worst <= 3.0, rows, reason, could_fail)


@claim(
    paper="rassouli §VI, Fig. 7",
    statement="black box, the passive party holds emp.var.rate of Bank: knowing only the sign of ω·b, the "
    "sign-only attack's MSE → 0 as the number of predictions N grows",
    paper_value={"N=100": "≈ 0 (Fig. 7)"},
    rule="mean MSE over 100 draws of N held-out predictions decreases for N = 10, 100, 1000 and is < 0.01 at 1000",
    could_fail="< 0.01 at N = 1000 is far below Half's MSE on the column (details: half); judged only when it is "
    "below a tenth of Half's",
    datasets=("bank",),
)
def sign_only_bank() -> Measurement:
    task = _uci_task("bank", "target", ["emp.var.rate"], n_query=5000).task
    obs = task.obs
    w, b = float(obs.w_passive[0, 0]), float(obs.bias[0])  # type: ignore[index]
    relation = "same" if w * b > 0 else "opposite"  # the adversary's one piece of knowledge
    attack = make_attack("sign_only", sign_relation=relation)
    rng = np.random.default_rng()
    curve = {}
    for n in (10, 100, 1000):
        errors = []
        for _ in range(100):
            rows = rng.choice(obs.n_samples, size=n, replace=False)
            seen = Observations(obs.x_active[rows], obs.scores[rows], obs.n_classes, 1, w_active=obs.w_active)  # type: ignore[index]
            errors.append(mse(task.x_passive[rows], run_attack(attack, seen).x_passive))
        curve[f"N={n}"] = float(np.mean(errors))
    values, half = list(curve.values()), _mse(task, "half")
    holds = values[0] > values[1] > values[2] and values[2] < 0.01
    could_fail = 0.1 * half >= 0.01
    reason = None if could_fail else f"Half's MSE on the column is {half:.4f}: the 0.01 bound is no test"
    return Measurement(curve, holds, {"omega": w, "b": b, "sign_relation": relation, "half": half}, reason, could_fail)


# ----------------------------------------------------------------------------------------------- varasteh

# varasteh §VI (Fig. 4, quoted with Fig. 10): Half's MSE per feature on each dataset.
VARASTEH_HALF = {"bank": (0.17, 0.17), "adult": (0.12, 0.14), "satellite": (0.04, 0.04), "pendigits": (0.12, 0.12)}
VARASTEH_ENCODING = {"bank": "target", "adult": "target", "satellite": "onehot", "pendigits": "onehot"}


def _half_level(dataset: str) -> Measurement:
    """Half's MSE averaged over every column (= the average over all cyclic windows of passive columns, the
    papers' "average over space") on 2,000 held-out rows; the LR's accuracy on them beside it."""
    uci = _uci_task(dataset, VARASTEH_ENCODING[dataset], 0.4, n_query=2000)
    half = mse(uci.x_query, np.full_like(uci.x_query, 0.5))
    low, high = VARASTEH_HALF[dataset]
    return Measurement(
        half,
        low * 0.85 <= half <= high * 1.15,
        {"half_on_40pct_random_passive": _mse(uci.task, "half"), "accuracy": uci.accuracy, "d": uci.x_query.shape[1]},
    )


for _name, (_low, _high) in VARASTEH_HALF.items():
    claim(
        f"varasteh_half_{_name}",
        paper="varasteh §VI, Fig. 4",
        statement=f"Half's MSE per feature on {_name} is ≈ {_low}" + (f"–{_high}" if _high != _low else ""),
        paper_value=_low if _low == _high else [_low, _high],
        rule="Half over all columns (every cyclic window alike), 2,000 held-out rows, within 15 % of the paper's "
        "value (range)",
        kind="sanity",
        could_fail="another encoding or scaling of the data than the paper's moves Half's MSE out of the band",
        datasets=(_name,),
        fast=True,
    )(functools.partial(_half_level, _name))


@claim(
    paper="varasteh §VI, Fig. 5",
    statement="on Satellite, refining the adversary model with delivered scores helps: MSE(AM) > MSE(RAM(50)) > "
    "MSE(RAM(100))",
    paper_value="AM > RAM(50) > RAM(100)",
    rule="MSE averaged over 3 cyclic windows each of d_p = 2 and 4 passive columns, 1,000 held-out rows: "
    f"strictly ordered, judged only when AM beats Half by ≥ {THEOREM1_MARGIN:.0%} of Half's MSE",
    could_fail="attacks that returned Half would tie (not strictly ordered) and fail the margin over Half",
    datasets=("satellite",),
)
def am_ram_satellite() -> Measurement:
    from vflsec.client.harness import cyclic_windows

    names = list(datasets.load_dataset("satellite").feature_names)
    runs: dict[str, list[float]] = {"am": [], "ram50": [], "ram100": [], "half_star": [], "half": []}
    accuracy = []
    for width in (2, 4):
        for window in cyclic_windows(names, width, 3):
            uci = _uci_task("satellite", "onehot", window, n_query=1000)
            accuracy.append(uci.accuracy)
            for key, (attack, options) in {"am": ("am", {}), "ram50": ("ram", {"n_refine": 50}),
                                           "ram100": ("ram", {"n_refine": 100}), "half_star": ("half_star", {}),
                                           "half": ("half", {})}.items():  # fmt: skip
                runs[key].append(_mse(uci.task, attack, **options))
    mean = {key: float(np.mean(values)) for key, values in runs.items()}
    holds = mean["am"] > mean["ram50"] > mean["ram100"]
    could_fail = mean["am"] <= (1 - THEOREM1_MARGIN) * mean["half"]
    reason = None
    if not could_fail:
        reason = f"AM {mean['am']:.4f} does not beat Half {mean['half']:.4f} by {THEOREM1_MARGIN:.0%}"
    measured = {"AM": mean["am"], "RAM(50)": mean["ram50"], "RAM(100)": mean["ram100"]}
    return Measurement(measured, holds, {"half_star": mean["half_star"], "half": mean["half"],
                                         "accuracy": float(np.mean(accuracy)), "windows": len(runs["am"])},
                       reason, could_fail)  # fmt: skip


# ------------------------------------------------------------------------------------------------- privee


@claim(
    paper="privee §6 (summary)",
    statement="PRIVEE raises the GRN attack's MSE by up to 30× (threefold typically) at near-zero accuracy change",
    paper_value={"grn_mse_ratio": "3–30", "accuracy_change": 0.0},
    rule="through the services, digits, 40 % passive, the same plain model released with and without "
    "privee:epsilon=0.1: GRN MSE ratio ≥ 3 and |accuracy change| ≤ 0.01; over 3 runs (fresh weights each)",
    could_fail="a ratio under 3 or an accuracy change over 0.01 fails it (and does: see the reason); judged only when "
    f"the undefended GRN beats Half by ≥ {THEOREM1_MARGIN:.0%} of Half's MSE (a ratio over a GRN that learned nothing "
    "says nothing)",
    runs=3,
    differs_as_known=lambda r: all(
        run["measured"]["grn_mse_ratio"] < 3 and abs(run["measured"]["accuracy_change"]) <= 0.01
        for run in r["per_run"]
    ),
    known_difference="the paper's 30× is relative to a small undefended MSE; here the undefended GRN is within "
    "2× of Half, so 3× would need PRIVEE to push GRN far beyond blind guessing (docs/attacks.md: 'PRIVEE on the "
    "split NN'); the PRIVEE-aware attacks undo the noise ('Defense-aware attacks')",
)
def privee_grn_ratio() -> Measurement:
    split = {"passive_features": datasets.RandomColumns(0.4), "epochs": 10}  # luo's random 40 %
    base = _federation("digits", ["grn"], 300, **split)
    defended = _federation("digits", ["grn", "aware_cls"], 300, score_release=("privee:epsilon=0.1",), **split)
    none, privee = base["attacks"]["grn"]["mse_clipped"], defended["attacks"]["grn"]["mse_clipped"]
    aware, half = defended["attacks"]["aware_cls"]["mse_clipped"], base["baselines"]["half"]
    ratio, change = privee / none, defended["accuracy"] - base["accuracy"]
    reason = None
    if ratio < 3:
        reason = (
            f"GRN {none:.4f} → {privee:.4f} under PRIVEE (ratio {ratio:.2f}); 3× would be {3 * none:.4f}, far "
            f"above blind Half ({half:.4f}): the undefended GRN is only {half / none:.2f}× below Half, so PRIVEE "
            f"would have to make GRN much worse than guessing; the PRIVEE-aware aware_cls reaches {aware:.4f}"
        )
    could_fail = none <= (1 - THEOREM1_MARGIN) * half
    if not could_fail:
        reason = f"the undefended GRN {none:.4f} does not beat Half {half:.4f} by {THEOREM1_MARGIN:.0%}"
    details = {"grn_none": none, "grn_privee": privee, "aware_cls_privee": aware, "half": half,
               "accuracy_none": base["accuracy"], "d_p": base["d_passive"]}  # fmt: skip
    return Measurement({"grn_mse_ratio": ratio, "accuracy_change": change}, ratio >= 3 and abs(change) <= 0.01,
                       details, reason, could_fail)  # fmt: skip


# ----------------------------------------------------------------------------------------------------- ye


@functools.cache
def _ye_bank() -> dict[str, dict[str, Any]]:
    """Bank, 8 passive features incl. the binary contact: plain and masquerade (m = 1, 2, ⌈log₂ n⌉) runs, the
    latter with ye's drop=random (the claims are ye's; the default drop=binary is docs/defenses.md's)."""
    from vflsec.client import ye_measure
    from vflsec.services.attacks.gradient import torch_threads

    with torch_threads(1):
        rows = ye_measure.bank(5, {"bank", "masquerade"}, 1)
    return {row["experiment"]: row for row in rows}


@claim(
    paper="ye §4, §7",
    statement="Algorithm 1 recovers every binary input feature of the passive party exactly from noise-free "
    "embeddings (COVID: all binary features)",
    paper_value={"attack_accuracy": 1.0},
    rule="COVID, 12 binary passive columns, trained active-top split NN: every column found (up to complement)",
    could_fail="every one of 12 columns must match exactly; a guessed column matches at about its majority rate",
    datasets=("covid",),
)
def ye_alg1_covid() -> Measurement:
    from vflsec.client import ye_measure
    from vflsec.services.attacks.gradient import torch_threads

    with torch_threads(1):
        row = ye_measure.covid(5)
    found = row["ye_alg1"]["per_feature_best_of_all_found"]
    return Measurement({"attack_accuracy": min(found)}, min(found) == 1.0, {"per_feature": found, "n": row["n"],
                       "test_accuracy": row["test_accuracy"], "n_found": row["ye_alg1"]["n_found"]})  # fmt: skip


@claim(
    paper="ye §7",
    statement="Algorithm 2 (leverage-score regression search) outputs the passive party's binary feature "
    "(Bank: contact among 8 passive features)",
    paper_value={"attack_accuracy": 1.0},
    rule="Bank, trained active-top split NN: Algorithm 2's best vector matches contact on ≥ 99 % of rows",
    could_fail="contact's majority rate is 0.63 (details: majority): a wrong vector scores far below 0.99",
    datasets=("bank",),
)
def ye_alg2_bank() -> Measurement:
    row = _ye_bank()["bank_alg2"]
    accuracy = row["ye_alg2"]["accuracy_with_complements"]
    details = {"test_accuracy": row["test_accuracy"], "majority": row["ye_alg2"]["majority_baseline"]}
    return Measurement({"attack_accuracy": accuracy}, accuracy >= 0.99, details)


@claim(
    paper="ye §5, §7, Table 2",
    statement="masquerade (m fabricated bits) leads Algorithm 2 to a fabricated bit (≈ 50 %); the adaptive "
    "attack still recovers the feature for m = 1, 2 (93.8 %, 90.2 % on Bank)",
    paper_value={"alg2_under_m1": 0.5, "adaptive_m1": 0.938, "adaptive_m2": 0.902},
    rule=f"Bank: Algorithm 2 under m = 1 ≤ 0.6; adaptive attack ≥ 0.9 for m = 1 and 2; each of {YE_RUNS} runs (a "
    "fresh masquerade secret and weights from OS entropy each) judged, reproduced only when all are",
    could_fail="the adaptive attack must reach 0.9 where the majority rate is 0.63, and Algorithm 2 must be misled: "
    "judged only when the same run's undefended Algorithm 2 finds contact (≥ 0.99), so its ≤ 0.6 is masquerade's",
    runs=YE_RUNS,
    known_difference="since review 6 the defended layer (masquerade's Q, P's start) is drawn from the passive "
    "party's OS entropy at every run; some draws put one of the three figures across its threshold (review 6: "
    "reproduced in 4 of 6 runs)",
    differs_as_known=lambda r: r["reproduced_runs"] >= r["runs"] // 2,
    datasets=("bank",),
)
def ye_masquerade_bank() -> Measurement:
    rows = _ye_bank()
    measured = {
        "alg2_under_m1": rows["bank_masquerade_m1"]["ye_alg2"]["accuracy"],
        "adaptive_m1": rows["bank_masquerade_m1"]["ye_adaptive"]["accuracy"],
        "adaptive_m2": rows["bank_masquerade_m2"]["ye_adaptive"]["accuracy"],
    }
    log2n = next(r for k, r in rows.items() if k.startswith("bank_masquerade_m") and k[-1] not in "12")
    holds = measured["alg2_under_m1"] <= 0.6 and min(measured["adaptive_m1"], measured["adaptive_m2"]) >= 0.9
    details = {
        "accuracy_drop_pp": {k: r["accuracy_drop_pp"] for k, r in rows.items() if "accuracy_drop_pp" in r},
        "log2n_oracle_bits_accuracy": log2n["adaptive_oracle_bits"]["accuracy_with_complements"],
        "majority": rows["bank_alg2"]["ye_alg2"]["majority_baseline"],
        "alg2_undefended": rows["bank_alg2"]["ye_alg2"]["accuracy_with_complements"],
    }
    could_fail = details["alg2_undefended"] >= 0.99
    reason = None if could_fail else f"undefended Algorithm 2 reaches only {details['alg2_undefended']:.3f}"
    return Measurement(measured, holds, details, reason, could_fail)


YE_LOG2N_ATTACKS = ("ye_alg2", "ye_adaptive", "ye_peel")
# ye_masquerade_log2n's runs: each draws masquerade's secret (ye's random Q and dropped direction) from OS entropy,
# and a draw whose dropped direction nearly contains the binary column's collinearity hides it.
YE_LOG2N_RUNS = 3


def _log2n_run_as_known(run: dict[str, Any]) -> bool:
    """One run of ye_masquerade_log2n as the known difference has it: the attacks find the column at m = 1 and
    drop=binary leaves them at the majority rate; a run that differs does so because they find it at ⌈log₂ n⌉."""
    details = run["details"]
    binary_holds = all(details["drop_binary"][k] <= details["majority"][k] + 0.05 for k in details["majority"])
    found = run["reproduced"] or max(run["measured"].values()) > 0.55
    return found and binary_holds and min(details["drop_random_m1"].values()) >= 0.9


@functools.cache
def _ye_drop() -> dict[str, dict[str, Any]]:
    """Bank and Credit under masquerade drop=random (ye's) and drop=binary, m = 1 and ⌈log₂ n⌉ (drop_rows)."""
    from vflsec.client import ye_measure
    from vflsec.services.attacks.gradient import torch_threads

    with torch_threads(1):
        rows = [*ye_measure.bank(5, {"drop"}, 1), *ye_measure.credit(5, 1)]
    return {row["experiment"]: row for row in rows}


@claim(
    paper="ye §5",
    statement="m = ⌈log₂ n⌉ fabricated bits ensure data security: an attacker who knows the mechanism no longer "
    "recovers the binary feature",
    paper_value={"bank_log2n": 0.5, "credit_log2n": 0.5},
    rule="ye's masquerade (drop=random) at m = ⌈log₂ n⌉: the strongest of Algorithm 2, the adaptive and the peeling "
    "attack (best of all listed, with complements) ≤ majority rate + 0.05 on Bank (contact) and Credit (SEX), judged "
    f"only when the same attacks recover the column at m = 1 (≥ 0.9); each of {YE_LOG2N_RUNS} runs (a fresh "
    "masquerade secret, so a fresh Q, from OS entropy each) judged, reproduced only when all are",
    could_fail="'the attacks fail' is vacuous if they fail everywhere: at m = 1 the same attacks must find the column",
    runs=YE_LOG2N_RUNS,
    datasets=("bank", "credit"),
    known_difference="the peeling attack (ye_peel) needs no groups: it projects out the fabricated bits it finds and "
    "searches what is left, where ye's random dropped direction leaves a binary column that the party's other "
    "columns nearly rebuild (Credit's bill amounts, Bank's economic indicators); masquerade's drop=binary, the "
    "default, closes it (details: drop_binary)",
    differs_as_known=lambda r: all(map(_log2n_run_as_known, r["per_run"])),
)
def ye_masquerade_log2n() -> Measurement:
    rows = _ye_drop()
    strongest, majority, binary, at_m1 = {}, {}, {}, {}

    def best(row: dict[str, Any], drop: str) -> float:  # the best listed vector of any of the three attacks
        found = [max(row[drop][a].get("per_feature_best_of_all_found", [0.0])) for a in YE_LOG2N_ATTACKS]
        return float(max(found))

    for label in ("bank", "credit"):
        row = next(r for k, r in rows.items() if k.startswith(f"{label}_masquerade_drop_m") and not k.endswith("_m1"))
        strongest[f"{label}_log2n"], binary[label] = best(row, "random"), best(row, "binary")
        at_m1[label] = best(rows[f"{label}_masquerade_drop_m1"], "random")
        majority[label] = row["binary"]["ye_peel"]["majority_baseline"]
    holds = all(strongest[f"{k}_log2n"] <= majority[k] + 0.05 for k in majority)
    could_fail = min(at_m1.values()) >= 0.9
    reason = None if could_fail else f"at m = 1 the attacks reach only {at_m1}: they may be failing everywhere"
    details = {"majority": majority, "drop_binary": binary, "drop_random_m1": at_m1,
               "ls_ceiling": {k: r["ls_ceiling"] for k, r in rows.items()}}  # fmt: skip
    return Measurement(strongest, holds, details, reason, could_fail)


# ------------------------------------------------------------------------------------------------- runner


def missing_datasets(c: Claim) -> list[str]:
    found = datasets.available_datasets()
    return [name for name in c.datasets if name not in found]


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def registered(c: Claim) -> dict[str, Any]:
    """What the registry says of a claim (``reproduce --list``; also the first keys of its row)."""
    return {"source": c.paper, "statement": c.statement, "paper": _jsonable(c.paper_value), "rule": c.rule,
            "kind": c.kind, "could_fail": c.could_fail, "runs": c.runs, "fast": c.fast, "datasets": list(c.datasets),
            "known_difference": c.known_difference}  # fmt: skip


# What a row must share with the registry to be this claim's measurement (the known difference's wording and the
# fast flag may change without re-measuring).
REGISTRATION = ("source", "statement", "paper", "rule", "kind", "could_fail", "runs", "datasets")


def same_registration(row: dict[str, Any], c: Claim) -> bool:
    expected = registered(c)
    return all(row.get(k) == expected[k] for k in REGISTRATION)


def listing() -> dict[str, Any]:
    """Every registered claim, in the order ``all`` runs them."""
    return {"claims": {name: registered(c) for name, c in CLAIMS.items()}}


def _loaded_commit() -> str:
    """The commit of the code this process loaded (``+dirty`` with uncommitted changes to the code;
    ``unknown`` outside a git checkout), read once at import: a later checkout does not change the code running."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        code = ["client", "services", "proto", "pyproject.toml"]  # what measures (docs edits do not)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", *code], cwd=root,
                               capture_output=True, text=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


LOADED_COMMIT = _loaded_commit()


def measured_at() -> dict[str, str]:
    """The commit of the code that measured a row and the UTC time it was measured."""
    import datetime

    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    return {"commit": LOADED_COMMIT, "date": now.isoformat().replace("+00:00", "Z")}


def _clear_caches() -> None:
    """Forget cached trainings so that each run of a several-run claim draws afresh."""
    for cached in (_ye_bank, _ye_drop):
        cached.cache_clear()


def _numbers(value: Any, prefix: str = "") -> dict[str, float]:
    """The numeric leaves of a measured value, by dotted key."""
    if isinstance(value, dict):
        return {k: v for key, sub in value.items() for k, v in _numbers(sub, f"{prefix}{key}.").items()}
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        return {}
    return {prefix.rstrip(".") or "value": float(value)}


def _spread_over_runs(measured: Sequence[Any]) -> dict[str, dict[str, float]]:
    per_key: dict[str, list[float]] = {}
    for m in measured:
        for key, v in _numbers(m).items():
            per_key.setdefault(key, []).append(v)
    return {k: {"min": min(v), "max": max(v), "mean": float(np.mean(v))} for k, v in per_key.items()}


def _verdict(m: Measurement) -> tuple[bool, str | None]:
    """A run reproduces when its rule holds and its check that it could have failed passed."""
    if not m.could_fail:
        return False, f"the check that the claim could fail did not pass: {m.reason}"
    return m.holds, m.reason


def run_claim(c: Claim) -> dict[str, Any]:
    """One claim's row: paper value, measured value, verdict (with the reason when it differs or is skipped), and
    the commit and date it was measured on. A claim of several runs: `measured` is the first run's, `per_run`
    every run's, `spread` the range of each figure, `reproduced_runs` how many reproduced."""
    # clarifications.md: per claim `paper` (the value), `measured`, `verdict`; the citation is `source`.
    row: dict[str, Any] = registered(c) | measured_at()
    missing = missing_datasets(c)
    if missing:
        folder = datasets.shared_datasets_dir()
        where = folder or f"no datasets folder (set {datasets.DATASETS_ENV_VAR})"
        reason = f"dataset {', '.join(missing)} not in {where}"
        return row | {"measured": None, "verdict": "skipped", "reason": reason, "reproduced_runs": 0}
    start = time.perf_counter()
    results: list[Measurement] = []
    try:
        for _ in range(c.runs):
            if c.runs > 1:
                _clear_caches()
            results.append(c.measure())
    except Exception as exc:  # one broken claim must not hide the others' results; reported, exit status 1
        return row | {"measured": None, "verdict": "error", "reason": f"{type(exc).__name__}: {exc}",
                      "reproduced_runs": 0, "seconds": time.perf_counter() - start}  # fmt: skip
    verdicts = [(bool(holds), reason) for holds, reason in map(_verdict, results)]  # numpy bools are not JSON
    reproduced = sum(holds for holds, _ in verdicts)
    first = results[0]
    row |= {"measured": _jsonable(first.measured), "verdict": "reproduced" if reproduced == c.runs else "differs"}
    if reproduced < c.runs:
        reason = next(r for holds, r in verdicts if not holds) or c.known_difference or "not known"
        if c.runs > 1:
            reason = f"reproduced in {reproduced} of {c.runs} runs; a run that differs: {reason}"
        row["reason"] = reason
    row["reproduced_runs"] = reproduced
    if c.runs > 1:
        pairs = zip(results, verdicts, strict=True)
        per_run = [{"measured": _jsonable(m.measured), "details": _jsonable(m.details), "reproduced": h}
                   for m, (h, _) in pairs]  # fmt: skip
        row |= {"spread": _spread_over_runs([m.measured for m in results]), "per_run": per_run}
    return row | {"details": _jsonable(first.details), "seconds": round(time.perf_counter() - start, 2)}


def select(name: str, fast: bool) -> list[Claim]:
    """``all`` (the fast subset with ``fast``) or one claim by name; ValueError naming the known claims."""
    if name == "all":
        return [c for c in CLAIMS.values() if c.fast or not fast]
    if name not in CLAIMS:
        raise ValueError(f"unknown claim {name!r}; known: all, {', '.join(CLAIMS)}")
    return [CLAIMS[name]]


def summarize(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The count per verdict (all rows), and per kind: attack claims and sanity checks apart."""
    def count(kind: str | None) -> dict[str, int]:
        return _all_counts({n: r for n, r in rows.items() if kind in (None, r.get("kind", "attack"))})

    return {"summary": count(None), "summary_by_kind": {k: count(k) for k in KINDS}}


def reproduce(claims: Sequence[Claim], on_claim: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Every claim in turn; ONE document: per claim its row, then the count per verdict and the total time."""
    start = time.perf_counter()
    rows: dict[str, dict[str, Any]] = {}
    for c in claims:
        rows[c.name] = run_claim(c)
        if on_claim is not None:
            on_claim(c.name, rows[c.name])
    return {"claims": rows, **summarize(rows), "seconds": round(time.perf_counter() - start, 1)}


def merge(previous: dict[str, Any], document: dict[str, Any]) -> dict[str, Any]:
    """A published table updated with new rows: the claims just run replace theirs, every other registered claim
    keeps its row (with the commit and date it was measured on), claims no longer registered are dropped, and a
    registered claim never measured is listed as such. Rows in the registry's order."""
    old, new = previous.get("claims", {}), document["claims"]
    rows: dict[str, dict[str, Any]] = {}
    for name, c in CLAIMS.items():
        if name in new:
            rows[name] = new[name]
        elif name in old and same_registration(old[name], c):
            rows[name] = old[name]
        else:  # never measured, or its registration changed since: the old figures are not this claim's
            never = {"measured": None, "verdict": "not measured", "reason": "not measured at this commit"}
            rows[name] = registered(c) | never | {"commit": None, "date": None}
    return {"claims": rows, **summarize(rows), "seconds": round(sum(r.get("seconds") or 0 for r in rows.values()), 1)}


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_short(v)}" for k, v in value.items())
    if isinstance(value, list):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return "—" if value is None else str(value)


def _count_line(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {v}" for v, n in counts.items() if n) or "none"


def _all_counts(rows: dict[str, dict[str, Any]]) -> dict[str, int]:
    verdicts = [*VERDICTS, "not measured"]
    return {v: sum(r["verdict"] == v for r in rows.values()) for v in verdicts}


def count_sentence(document: dict[str, Any]) -> str:
    """The counts as docs quote them: attack claims and sanity checks apart."""
    by_kind = summarize(document["claims"])["summary_by_kind"]
    return f"attack claims: {_count_line(by_kind['attack'])}; sanity checks: {_count_line(by_kind['sanity'])}"


def markdown(document: dict[str, Any]) -> str:
    lines = ["# Reproduction of the seed papers' claims (`vflsec reproduce all`)", ""]
    lines += [f"Counts: {count_sentence(document)} (sanity checks test no attack: they check properties of the "
              "data and of the random draws that the attack claims lean on). "
              "Each row was measured on the commit and date it shows; a claim of several runs shows how many of "
              "its runs reproduced (the verdict is `reproduced` only when all did) and the spread of its figures.",
              ""]  # fmt: skip
    header = ["| claim | paper | paper value | measured | verdict | runs | reason | seconds | commit, date |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for kind, title in (("attack", "Attack claims"), ("sanity", "Sanity checks")):
        lines += [f"## {title}", "", *header]
        for name, r in document["claims"].items():
            if r.get("kind", "attack") != kind:
                continue
            runs = f"{r['reproduced_runs']} of {r['runs']} reproduced" if "reproduced_runs" in r else "—"
            if r.get("spread"):
                runs += "; spread " + ", ".join(f"{k} {v['min']:.4g}–{v['max']:.4g}" for k, v in r["spread"].items())
            when = f"{(r.get('commit') or '—')[:12]}, {r.get('date') or '—'}"
            cells = [name, r["source"], _short(r["paper"]), _short(r["measured"]), f"**{r['verdict']}**", runs,
                     r.get("reason", ""), _short(r.get("seconds")), when]  # fmt: skip
            lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
        lines.append("")
    lines += [f"All: {_count_line(document['summary'])}; {document['seconds']} s of measuring in all.", "",
              "## Each claim: statement, rule, how it could fail, details", ""]  # fmt: skip
    for name, r in document["claims"].items():
        details = f" Details: {_short(r['details'])}." if r.get("details") else ""
        could_fail = f" Could fail: {r['could_fail']}." if r.get("could_fail") else ""
        lines.append(f"* **{name}** ({r['source']}): {r['statement']}. Rule: {r['rule']}.{could_fail}{details}")
    return "\n".join(lines) + "\n"


def write(document: dict[str, Any], out: Path) -> list[Path]:
    """results.json and results.md in ``out``, always the whole registry (:func:`merge`): an existing results.json
    there is updated, so a claim measured alone joins the table beside the others' earlier rows, and a claim not
    yet measured is listed as such."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.json", out / "results.md"]
    document = merge(json.loads(paths[0].read_text()) if paths[0].exists() else {}, document)
    paths[0].write_text(json.dumps(document, indent=2) + "\n")
    paths[1].write_text(markdown(document))
    return paths
