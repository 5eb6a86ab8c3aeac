"""ye et al.'s claims (Algorithms 1 and 2 on trained active-top split NNs, masquerade), measured by
ye_measure.py."""

from __future__ import annotations

import functools
from typing import Any

from vflsec.client.experiments.reproduce.claims import YE_RUNS, Measurement, claim


@functools.cache
def ye_bank() -> dict[str, dict[str, Any]]:
    """Bank, 8 passive features incl. the binary contact: plain and masquerade (m = 1, 2, ⌈log₂ n⌉) runs, the
    latter with ye's drop=random (the claims are ye's; the default drop=binary is docs/defenses.md's)."""
    from vflsec.client.experiments.reproduce import ye_measure
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
    from vflsec.client.experiments.reproduce import ye_measure
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
    row = ye_bank()["bank_alg2"]
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
    rows = ye_bank()
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
def ye_drop() -> dict[str, dict[str, Any]]:
    """Bank and Credit under masquerade drop=random (ye's) and drop=binary, m = 1 and ⌈log₂ n⌉ (drop_rows)."""
    from vflsec.client.experiments.reproduce import ye_measure
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
    rows = ye_drop()
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
