"""PRIVEE's claim (its release against the GRN attack)."""

from __future__ import annotations

from vflsec.client.experiments.reproduce.claims import THEOREM1_MARGIN, Measurement, claim, services_report
from vflsec.services.data import datasets


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
    base = services_report("digits", ["grn"], 300, **split)
    defended = services_report("digits", ["grn", "aware_cls"], 300, score_release=("privee:epsilon=0.1",), **split)
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
