"""luo et al.'s claims (feature inference on LR, trees and forests: ESA, GRN, PRA, GRN-RF)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from vflsec.client.experiments.reproduce.claims import (
    Measurement,
    attack_mse,
    claim,
    services_report,
    uci_data,
    uci_task,
)
from vflsec.services.attacks import Observations, make_attack, mse, run_attack
from vflsec.services.attacks.synthetic import trained_lr_task

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
    report = services_report("digits", ["esa"], 300, passive_features=5, epochs=10)
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
                                "half": attack_mse(task, "half")},
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
        task = uci_task("bank", "ordinal", 0.4, n_query=LUO_QUERIES, seed=seed).task  # GRN learns from many
        for case, attack in LUO_VARIANTS.items():
            per_split[case].append(attack_mse(task, attack))
        for case, (attack, options) in extra.items():
            per_split[case].append(attack_mse(task, attack, **options))
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
    runs = [services_report(dataset, attacks, 160, model=model, epochs=1, seed=s, **spec) for s in range(trials)]
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

    x, y, train, query, names, _ = uci_data("bank", "ordinal", RF_QUERIES, seed)
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
    from vflsec.client.experiments.harness import random_path_baseline
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
