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


@dataclass(frozen=True)
class Measurement:
    measured: Any  # the figure(s) set against the paper's
    holds: bool  # the claim's rule holds on them
    details: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None  # why it differs, when the measurement itself shows it


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


CLAIMS: dict[str, Claim] = {}


def claim(name: str | None = None, **fields: Any) -> Callable[[Callable[[], Measurement]], Callable[[], Measurement]]:
    """Register a measuring function as a claim (named after the function unless ``name`` is given)."""

    def register(measure: Callable[[], Measurement]) -> Callable[[], Measurement]:
        nonlocal name
        name = name or measure.__name__
        if name in CLAIMS:
            raise ValueError(f"claim {name!r} registered twice")
        CLAIMS[name] = Claim(name=name, measure=measure, **fields)
        return measure

    return register


# ------------------------------------------------------------------------------------------------ helpers


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
    from vflsec.client.federation import FederationSpec
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
    rule=f"luo's own configuration (grn_luo and its ablations, held-out folds), {LUO_QUERIES:,} held-out predictions "
    f"on each of {len(LUO_SEEDS)} splits (held-out rows, LR fit, random 40 % passive): per split the paired "
    f"differences case − GRN (cases 1–4) and case 4 − RG; every mean difference > {LUO_MARGIN_SE:g} standard errors",
    datasets=("bank",),
    known_difference=f"at {LUO_QUERIES:,} predictions per split, luo's own GRN configuration (lr 1e-4, 60 epochs "
    "whatever the number of predictions) under-trains: GRN stays above Half and behind the noise-only and "
    "x_adv-only ablations on every split (docs/experiments.md, 'luo Table III')",
)
def luo_table3_grn_ablation() -> Measurement:
    per_split: dict[str, list[float]] = {case: [] for case in [*LUO_VARIANTS, "rg", "half"]}
    for seed in LUO_SEEDS:
        task = _uci_task("bank", "ordinal", 0.4, n_query=LUO_QUERIES, seed=seed).task  # GRN learns from many
        for case, attack in LUO_VARIANTS.items():
            per_split[case].append(_mse(task, attack))
        per_split["rg"].append(_mse(task, "rg"))
        per_split["half"].append(_mse(task, "half"))
    mses = {case: np.asarray(values) for case, values in per_split.items()}
    margins = {f"{case} − grn": paired_margin(mses[case] - mses["grn"]) for case in [*LUO_ABLATIONS, "direct"]}
    margins["direct − rg"] = paired_margin(mses["direct"] - mses["rg"])
    holds = all(m["z"] > LUO_MARGIN_SE for m in margins.values())
    measured = {case: float(v.mean()) for case, v in mses.items() if case != "half"}
    details = {"std_over_splits": {case: float(v.std(ddof=1)) for case, v in mses.items()},
               "paired_margins": margins, "per_split": per_split, "splits": len(LUO_SEEDS), "n_queried": LUO_QUERIES,
               "note": "measured: the mean MSE over the splits; the verdict is on luo's ordering, from the paired "
                       "differences' spread; the MSEs themselves are not luo's (compare with Half here)"}  # fmt: skip
    reason = None
    if not holds:
        failed = [f"{name} {m['mean']:+.4f} ± {m['se']:.4f} SE ("
                  + ("the opposite order" if m["z"] < -LUO_MARGIN_SE else "within the spread") + ")"
                  for name, m in margins.items() if m["z"] <= LUO_MARGIN_SE]  # fmt: skip
        reason = (
            f"over {len(LUO_SEEDS)} splits luo's ordering does not hold by {LUO_MARGIN_SE:g} standard errors for "
            f"{'; '.join(failed)}; GRN {mses['grn'].mean():.4f}, Half {mses['half'].mean():.4f}: " + LUO_TABLE3_KNOWN
        )
    return Measurement(measured, holds, details, reason)


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


def _spread(values: Sequence[float]) -> dict[str, float]:
    v = np.asarray(values, dtype=np.float64)
    return {"mean": float(np.nanmean(v)), "std": float(np.nanstd(v)), "trials": int(np.isfinite(v).sum())}


@claim(
    paper="luo §IV-B, Algorithm 1; §VI",
    statement="PRA's correct branching rate on a released decision tree exceeds that of a random path",
    paper_value="CBR(PRA) > CBR(random path)",
    rule=f"through the services, DT depth 5, {TREE_TRIALS} trials (seeds) on wine and breast_cancer, 160 queried "
    "rows each: the mean PRA CBR above the mean random-path CBR on both",
)
def luo_pra_cbr() -> Measurement:
    # luo's setting releases the passive thresholds: a tree withholds them unless asked (the `thresholds` step).
    measured = {
        name: _tree_trials(name, "tree", ["pra"], TREE_TRIALS, param_release=["thresholds"])
        for name in ("wine", "breast_cancer")
    }
    holds = all(m["cbr_pra"]["mean"] > m["cbr_random_path"]["mean"] for m in measured.values())
    return Measurement(measured, holds)


# ----------------------------------------------------------------------------------------------- rassouli


@claim(
    paper="rassouli Lemma 1",
    statement="MSE(RG) − MSE(Half) = Var(U) = 1/12 for any data distribution",
    paper_value=1 / 12,
    rule="|gap − 1/12| ≤ 0.005 on digits' held-out rows (26 passive columns; RG the mean of 10 fresh draws)",
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
    rule="every held-out row of breast_cancer, wine and digits (LR, 40 % passive) satisfies both, to 1e-9",
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
    return Measurement({"share of samples": worst}, worst == 1.0, {"share": shares, "mse": mses})


@claim(
    paper="rassouli Thm 2",
    statement="MSE(LS) = Tr((I − A⁺A) K_0)/d and MSE(Half*) = Tr((I − A⁺A) K_½)/d",
    paper_value="closed form = measured",
    rule="the closed form with K_0, K_½ of the training rows matches the attacks' MSE on the held-out rows within "
    "3 standard errors of the difference of the two means (breast_cancer, wine, digits; LR, 40 % passive)",
    fast=True,
)
def closed_form_mse() -> Measurement:
    from vflsec.services.attacks.linear import passive_system

    rows: dict[str, dict[str, float]] = {}
    worst = 0.0
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
            worst = max(worst, z)
            rows[f"{dataset} {name}"] = {"predicted": form.mean(), "measured": errors.mean(), "z": z}
    return Measurement({"largest |z|": worst}, worst <= 3.0, rows)


@claim(
    paper="rassouli §VI, Fig. 7",
    statement="black box, the passive party holds emp.var.rate of Bank: knowing only the sign of ω·b, the "
    "sign-only attack's MSE → 0 as the number of predictions N grows",
    paper_value={"N=100": "≈ 0 (Fig. 7)"},
    rule="mean MSE over 100 draws of N held-out predictions decreases for N = 10, 100, 1000 and is < 0.01 at 1000",
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
    values = list(curve.values())
    holds = values[0] > values[1] > values[2] and values[2] < 0.01
    return Measurement(curve, holds, {"omega": w, "b": b, "sign_relation": relation, "half": _mse(task, "half")})


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
        datasets=(_name,),
        fast=True,
    )(functools.partial(_half_level, _name))


@claim(
    paper="varasteh §VI, Fig. 5",
    statement="on Satellite, refining the adversary model with delivered scores helps: MSE(AM) > MSE(RAM(50)) > "
    "MSE(RAM(100))",
    paper_value="AM > RAM(50) > RAM(100)",
    rule="MSE averaged over 3 cyclic windows each of d_p = 2 and 4 passive columns, 1,000 held-out rows: "
    "strictly ordered",
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
    measured = {"AM": mean["am"], "RAM(50)": mean["ram50"], "RAM(100)": mean["ram100"]}
    return Measurement(measured, holds, {"half_star": mean["half_star"], "half": mean["half"],
                                         "accuracy": float(np.mean(accuracy)), "windows": len(runs["am"])})  # fmt: skip


# ------------------------------------------------------------------------------------------------- privee


@claim(
    paper="privee §6 (summary)",
    statement="PRIVEE raises the GRN attack's MSE by up to 30× (threefold typically) at near-zero accuracy change",
    paper_value={"grn_mse_ratio": "3–30", "accuracy_change": 0.0},
    rule="through the services, digits, 40 % passive, the same plain model released with and without "
    "privee:epsilon=0.1: GRN MSE ratio ≥ 3 and |accuracy change| ≤ 0.01",
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
    details = {"grn_none": none, "grn_privee": privee, "aware_cls_privee": aware, "half": half,
               "accuracy_none": base["accuracy"], "d_p": base["d_passive"]}  # fmt: skip
    return Measurement({"grn_mse_ratio": ratio, "accuracy_change": change}, ratio >= 3 and abs(change) <= 0.01,
                       details, reason)  # fmt: skip


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
    rule="Bank: Algorithm 2 under m = 1 ≤ 0.6; adaptive attack ≥ 0.9 for m = 1 and 2",
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
    }
    return Measurement(measured, holds, details)


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
    "attack (best of all listed, with complements) ≤ majority rate + 0.05 on Bank (contact) and Credit (SEX)",
    datasets=("bank", "credit"),
    known_difference="the peeling attack (ye_peel) needs no groups: it projects out the fabricated bits it finds and "
    "searches what is left, where ye's random dropped direction leaves a binary column that the party's other "
    "columns nearly rebuild (Credit's bill amounts, Bank's economic indicators); masquerade's drop=binary, the "
    "default, closes it (details: drop_binary)",
)
def ye_masquerade_log2n() -> Measurement:
    rows = _ye_drop()
    strongest, majority, binary = {}, {}, {}
    for label in ("bank", "credit"):
        row = next(r for k, r in rows.items() if k.startswith(f"{label}_masquerade_drop_m") and not k.endswith("_m1"))
        best = {drop: max(max(row[drop][a].get("per_feature_best_of_all_found", [0.0])) for a in
                          ("ye_alg2", "ye_adaptive", "ye_peel")) for drop in ("random", "binary")}  # fmt: skip
        strongest[f"{label}_log2n"], binary[label] = best["random"], best["binary"]
        majority[label] = row["binary"]["ye_peel"]["majority_baseline"]
    holds = all(strongest[f"{k}_log2n"] <= majority[k] + 0.05 for k in majority)
    details = {"majority": majority, "drop_binary": binary,
               "ls_ceiling": {k: r["ls_ceiling"] for k, r in rows.items()}}  # fmt: skip
    return Measurement(strongest, holds, details)


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


def run_claim(c: Claim) -> dict[str, Any]:
    """One claim's row: paper value, measured value, verdict (with the reason when it differs or is skipped)."""
    # clarifications.md: per claim `paper` (the value), `measured`, `verdict`; the citation is `source`.
    row: dict[str, Any] = {"source": c.paper, "statement": c.statement, "paper": c.paper_value, "rule": c.rule}
    missing = missing_datasets(c)
    if missing:
        folder = datasets.shared_datasets_dir()
        where = folder or f"no datasets folder (set {datasets.DATASETS_ENV_VAR})"
        return row | {"measured": None, "verdict": "skipped", "reason": f"dataset {', '.join(missing)} not in {where}"}
    start = time.perf_counter()
    try:
        m = c.measure()
    except Exception as exc:  # one broken claim must not hide the others' results; reported, exit status 1
        return row | {"measured": None, "verdict": "error", "reason": f"{type(exc).__name__}: {exc}",
                      "seconds": time.perf_counter() - start}  # fmt: skip
    row |= {"measured": _jsonable(m.measured), "verdict": "reproduced" if m.holds else "differs"}
    if not m.holds:
        row["reason"] = m.reason or c.known_difference or "not known"
    return row | {"details": _jsonable(m.details), "seconds": round(time.perf_counter() - start, 2)}


def select(name: str, fast: bool) -> list[Claim]:
    """``all`` (the fast subset with ``fast``) or one claim by name; ValueError naming the known claims."""
    if name == "all":
        return [c for c in CLAIMS.values() if c.fast or not fast]
    if name not in CLAIMS:
        raise ValueError(f"unknown claim {name!r}; known: all, {', '.join(CLAIMS)}")
    return [CLAIMS[name]]


def reproduce(claims: Sequence[Claim], on_claim: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Every claim in turn; ONE document: per claim its row, then the count per verdict and the total time."""
    start = time.perf_counter()
    rows: dict[str, dict[str, Any]] = {}
    for c in claims:
        rows[c.name] = run_claim(c)
        if on_claim is not None:
            on_claim(c.name, rows[c.name])
    counts = {v: sum(r["verdict"] == v for r in rows.values()) for v in VERDICTS}
    return {"claims": rows, "summary": counts, "seconds": round(time.perf_counter() - start, 1)}


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_short(v)}" for k, v in value.items())
    if isinstance(value, list):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return "—" if value is None else str(value)


def markdown(document: dict[str, Any]) -> str:
    lines = [
        "# Reproduction of the seed papers' claims (`vflsec reproduce all`)",
        "",
        "| claim | paper | paper value | measured | verdict | reason | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in document["claims"].items():
        cells = [name, r["source"], _short(r["paper"]), _short(r["measured"]), f"**{r['verdict']}**",
                 r.get("reason", ""), _short(r.get("seconds"))]  # fmt: skip
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    counts = ", ".join(f"{n} {v}" for v, n in document["summary"].items() if n)
    lines += ["", f"{counts}; {document['seconds']} s in all.", "", "## Each claim: statement, rule, details", ""]
    for name, r in document["claims"].items():
        details = f" Details: {_short(r['details'])}." if r.get("details") else ""
        lines.append(f"* **{name}** ({r['paper']}): {r['statement']}. Rule: {r['rule']}.{details}")
    return "\n".join(lines) + "\n"


def write(document: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.json", out / "results.md"]
    paths[0].write_text(json.dumps(document, indent=2) + "\n")
    paths[1].write_text(markdown(document))
    return paths
