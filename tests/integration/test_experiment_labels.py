"""`vflsec experiment` with a curious passive party (issue 29): a small version of examples/label_leakage.yaml through
the real services (in-process gRPC servers, mTLS; split-NN coordinator-top, the gradient defense at the active party),
the training_defense axis, each row's AP / ΔMP / DCS recomputed from the figures it stands on, and the files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from vflsec.client.experiments import runner as exp_runner
from vflsec.client.experiments import scenario as exp_scenario

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "label_leakage.yaml"


def test_a_small_label_leakage_scenario_through_the_services(tmp_path: Path) -> None:
    # The example's own axes and attacker, on a small dataset and two epochs (the example itself takes minutes).
    shipped = yaml.safe_load(EXAMPLE.read_text())
    assert shipped["dataset"] == "bank" and shipped["model"] == "splitnn" and shipped["attacker"] == "passive-1"
    dp = next(d for d in shipped["sweep"]["training_defense"] if str(d).startswith("dp_gaussian"))
    small = {"name": "small_labels", "dataset": "breast_cancer", "model": "splitnn", "backend": "plain",
             "attacker": shipped["attacker"], "training": {"epochs": 2}, "predictions": 60,
             "sweep": {"training_defense": [dp]}}  # fmt: skip
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(small))
    out = tmp_path / "out"
    summary = exp_runner.run_experiment(exp_scenario.load_scenario(path), out, workers=1)

    assert summary["rows"] == []  # no feature rows: every cell was the passive party's
    none, defended = summary["label_rows"]
    assert (none["gradient_defense"], defended["gradient_defense"]) == ([], [dp])
    assert none["defense"] == "none" and defended["defense"] == f"training_defense={dp}"
    for row in (none, defended):
        assert row["attacker"] == "passive-1" and row["metric"] == "auc" and 0.5 < row["accuracy"]["mean"] <= 1.0
        ran = {n: a for n, a in row["attacks"].items() if "either_way" in a}
        assert {"norm", "cosine", "clustering", "completion", "axis_projection", "noise_residual"} <= set(ran)
        best = max(a["either_way"]["mean"] for a in ran.values())
        assert row["ap"] == pytest.approx(max(0.0, (best - 0.5) / 0.5))
        assert row["strongest"]["either_way"] == pytest.approx(best)
    # the undefended run trains without the chain: the accuracy lost is against it
    assert defended["delta_mp"] == pytest.approx(max(0.0, none["accuracy"]["mean"] - defended["accuracy"]["mean"]))
    ap, dmp = defended["ap"], defended["delta_mp"]
    assert defended["dcs"] == pytest.approx(1.0 / (1.0 + math.sqrt(0.5 * ap**2 + 0.5 * dmp**2)))
    # the undefended gradients give the labels away: the strongest gradient attack reads them
    assert none["strongest_gradient"]["either_way"] > 0.9

    stored = json.loads((out / "results.json").read_text())
    assert stored["label_rows"][1]["dcs"] == pytest.approx(defended["dcs"]) and len(stored["cells"]) == 2
    assert stored["label_dcs_formula"].startswith("DCS = 1 / (1 + sqrt(")
    assert stored["verdict"] == stored["label_verdict"]
    text = (out / "results.md").read_text()
    assert "AP = max(0, (AUC − 0.5) / 0.5)" in text and f"| training_defense={dp} | passive-1 |" in text
    assert "completion" in text and "What remains: passive model completion with k labelled rows" in text
    names = {Path(p).name for p in summary["plots"]}
    assert names == {"label_privacy_utility.png", "label_auc_vs_training_defense.png"}
    assert all(Path(p).stat().st_size > 10_000 for p in summary["plots"])
