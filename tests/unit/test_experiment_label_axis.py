"""Experiments with a curious passive party (issue 29): the `attacker` key and axis, the `training_defense` axis of
gradient defenses, and the label rows' AP / ΔMP / DCS, checked on constructed values against the formula written out
here."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from vflsec.client.experiments import labels as lx
from vflsec.client.experiments import results as exp_results
from vflsec.client.experiments import scenario as exp_scenario

NN = "dataset: breast_cancer\nmodel: splitnn\nbackend: plain\n"


def scenario(tmp_path: Path, text: str) -> exp_scenario.Scenario:
    path = tmp_path / "s.yaml"
    path.write_text(NN + text)
    return exp_scenario.load_scenario(path)


# --- the maths -------------------------------------------------------------------------------------------------


def test_label_advantage_is_the_normalised_gain_over_blind() -> None:
    assert lx.label_advantage(0.8, 0.5) == pytest.approx(0.6)  # (AUC − 0.5) / 0.5
    assert lx.label_advantage(0.5, 0.5) == 0.0 and lx.label_advantage(0.45, 0.5) == 0.0
    assert lx.label_advantage(1.0, 0.5) == pytest.approx(1.0)
    assert lx.label_advantage(0.55, 0.4) == pytest.approx(0.25)  # (acc − majority) / (1 − majority)
    assert lx.label_advantage(0.3, 0.4) == 0.0


def _label_cell(defense: str | None, rep: int, accuracy: float, aucs: dict[str, float], completion: float) -> dict:
    attacks = {name: {"auc": auc} for name, auc in aucs.items()}
    attacks["completion"] = {"auc": completion, "labelled_rows": 50, "majority_rate": 0.88}
    attacks["direct"] = {"not_applicable": "needs ∂L/∂logits"}
    report = {"attacker": "passive-1", "n_classes": 2, "accuracy": accuracy, "majority_rate": 0.886,
              "baselines": {"auc": 0.5, "majority_rate": 0.883}, "n_samples": 1000, "attacks": attacks}  # fmt: skip
    return {"cell": {"values": {"training_defense": defense}, "repetition": rep}, "report": report}


def test_label_rows_carry_ap_delta_mp_and_dcs_from_their_inputs(tmp_path: Path) -> None:
    s = scenario(tmp_path, "attacker: passive-1\nsweep:\n  training_defense: ['dp_gaussian:noise_multiplier=4']\n")
    dp = "dp_gaussian:noise_multiplier=4"
    cells = [
        _label_cell(None, 0, 0.90, {"norm": 0.85, "cosine": 1.0, "noise_residual": 0.12}, 0.78),
        _label_cell(None, 1, 0.92, {"norm": 0.87, "cosine": 1.0, "noise_residual": 0.14}, 0.80),
        # defended: an AUC of 0.3 is a leak of 0.7 read upside down; completion (0.76, 0.74) is the strongest
        _label_cell(dp, 0, 0.895, {"norm": 0.52, "cosine": 0.30, "noise_residual": 0.49}, 0.76),
        _label_cell(dp, 1, 0.905, {"norm": 0.50, "cosine": 0.36, "noise_residual": 0.51}, 0.74),
    ]
    summary = exp_results.summarise(s, cells)
    assert summary["rows"] == [] and summary["verdict"] == summary["label_verdict"]
    none, defended = summary["label_rows"]
    assert none["gradient_defense"] == [] and defended["gradient_defense"] == [dp]
    assert none["strongest"]["attack"] == "cosine" and none["ap"] == pytest.approx(1.0)
    assert defended["strongest"] == {"attack": "completion", "kind": "labelled", "value": pytest.approx(0.75),
                                     "either_way": pytest.approx(0.75), "advantage": pytest.approx(0.5),
                                     "labelled_rows": 50}  # fmt: skip
    assert defended["strongest_gradient"]["attack"] == "cosine"
    assert defended["strongest_gradient"]["either_way"] == pytest.approx(0.67)  # mean of 0.70 and 0.64
    assert defended["strongest_aware"]["attack"] == "noise_residual"
    assert defended["strongest_naive"]["attack"] == "cosine"
    ap, dmp = (0.75 - 0.5) / 0.5, 0.91 - 0.90
    assert defended["ap"] == pytest.approx(ap) and defended["delta_mp"] == pytest.approx(dmp)
    assert defended["dcs"] == pytest.approx(1.0 / (1.0 + math.sqrt(0.5 * ap**2 + 0.5 * dmp**2)))
    assert none["dcs"] == pytest.approx(1.0 / (1.0 + math.sqrt(0.5 * 1.0**2)))  # ΔMP 0 against itself
    assert defended["meets_goal"] is False  # cosine reads 0.67 either way: above the 0.6 goal
    assert defended["attacks"]["direct"] == {"not_applicable": "needs ∂L/∂logits"}
    assert "best trade-off: training_defense=dp_gaussian:noise_multiplier=4" in summary["label_verdict"]
    text = exp_results.markdown(summary)
    assert "AP = max(0, (AUC − 0.5) / 0.5)" in text and f"| {defended['ap']:.4g} | {dmp:.4g} |" in text


def test_a_defense_that_holds_every_gradient_attack_meets_the_goal_and_names_what_remains(tmp_path: Path) -> None:
    s = scenario(tmp_path, "attacker: passive-1\nsweep:\n  training_defense: [max_norm]\n")
    cells = [_label_cell(None, 0, 0.90, {"norm": 0.9}, 0.8), _label_cell("max_norm", 0, 0.89, {"norm": 0.45}, 0.7)]
    summary = exp_results.summarise(s, cells)
    defended = summary["label_rows"][1]
    assert defended["meets_goal"] is True and defended["accuracy_cost"] == pytest.approx(0.01)
    assert summary["label_verdict"].startswith("meets the goal")
    assert "completion with 50 labelled rows 0.700" in summary["label_verdict"]


def test_multiclass_rows_are_judged_by_accuracy_against_the_majority_rate(tmp_path: Path) -> None:
    s = scenario(tmp_path, "attacker: passive-1\nsweep:\n  training_defense: [max_norm]\n")
    cells = []
    for defense, acc in ((None, 0.6), ("max_norm", 0.55)):
        report = {"attacker": "passive-1", "n_classes": 3, "accuracy": 0.9, "majority_rate": 0.4,
                  "baselines": {"majority_rate": 0.4}, "n_samples": 100,
                  "attacks": {"norm": {"accuracy": acc}}}  # fmt: skip
        cells.append({"cell": {"values": {"training_defense": defense}, "repetition": 0}, "report": report})
    row = exp_results.summarise(s, cells)["label_rows"][1]
    assert row["metric"] == "accuracy" and row["ap"] == pytest.approx((0.55 - 0.4) / (1 - 0.4))
    assert "meets_goal" not in row  # the AUC goal is for binary labels


# --- the scenario file -------------------------------------------------------------------------------------------


def test_training_defense_is_an_axis_of_gradient_chains_with_the_undefended_row_first(tmp_path: Path) -> None:
    s = scenario(
        tmp_path,
        "attacker: passive-1\nrepetitions: 2\nsweep:\n  training_defense:\n    - max_norm\n"
        "    - [max_norm, 'dp_gaussian:noise_multiplier=4,clip=0.0001']\n",
    )
    cells = exp_scenario.expand(s)
    assert [exp_scenario.gradient_chain(s, c) for c in cells[::2]] == [
        (),
        ("max_norm",),
        ("max_norm", "dp_gaussian:noise_multiplier=4,clip=0.0001"),
    ]
    assert s.sweep["training_defense"][1] == "max_norm + dp_gaussian:noise_multiplier=4,clip=0.0001"
    assert all(exp_scenario.attack_scenario(s, c).attacker == "passive-1" for c in cells)
    assert all(exp_scenario.chains(s, c) == ((), ()) for c in cells)  # nothing in the release chains
    # every training defense (and repetition) trains its own model
    assert len({exp_scenario.training_key(s, c) for c in cells}) == len(cells) == 6
    assert exp_results.defense_label(dict(cells[4].values)).startswith("training_defense=max_norm + dp_gaussian")


def test_the_attacker_axis_gives_its_cells_their_own_keys_and_leaves_the_others_alone(tmp_path: Path) -> None:
    plain = scenario(tmp_path, "sweep:\n  training_defense: [max_norm]\n")
    explicit = scenario(tmp_path, "attacker: active\nsweep:\n  training_defense: [max_norm]\n")
    swept = scenario(tmp_path, "sweep:\n  attacker: [active, passive-1]\n  training_defense: [max_norm]\n")
    keys = {exp_scenario.cell_key(plain, c) for c in exp_scenario.expand(plain)}
    # a scenario without the axis keeps its keys (its results folders resume), `attacker: active` or not
    assert {exp_scenario.cell_key(explicit, c) for c in exp_scenario.expand(explicit)} == keys
    by_attacker: dict[str, set[str]] = {}
    for c in exp_scenario.expand(swept):
        by_attacker.setdefault(exp_scenario.cell_attacker(swept, c), set()).add(exp_scenario.cell_key(swept, c))
    # a swept attacker is part of its cells' results (their rows carry it), the active one's too
    assert len(by_attacker["active"]) == len(by_attacker["passive-1"]) == 2
    assert not by_attacker["active"] & keys and not by_attacker["passive-1"] & (keys | by_attacker["active"])
    # the active party trains the same model with the axis or without it: its bases are shared
    trained = {exp_scenario.training_key(plain, c) for c in exp_scenario.expand(plain)}
    active = [c for c in exp_scenario.expand(swept) if exp_scenario.cell_attacker(swept, c) == "active"]
    assert {exp_scenario.training_key(swept, c) for c in active} == trained
    # each attacker point has its own undefended row
    undefended = [c for c in exp_scenario.expand(swept) if exp_scenario.gradient_chain(swept, c) == ()]
    assert sorted(exp_scenario.cell_attacker(swept, c) for c in undefended) == ["active", "passive-1"]


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        ("attacker: passive-2\n", "attacker", "must be one of active, passive-1"),
        ("sweep:\n  attacker: [active, 3]\n", "sweep.attacker.1", "an attacker is active or passive-N"),
        ("attacker: passive-1\nsweep:\n  training_defense: ['nosuch:x=1']\n", "sweep.training_defense.0", "nosuch"),
        ("sweep:\n  training_defense: ['max_norm:k=1']\n", "sweep.training_defense.0", "k"),
        ("attacker: passive-1\nsweep:\n  rounding.decimals: [1]\n", "sweep.rounding.decimals", "training_defense"),
        ("attacker: passive-1\nattacks: [esa]\n", "attacks.0", "esa infers features"),
        # options of an attack no cell runs (label attacks for the active party), or a key the attack lacks
        ("attack_options:\n  norm: {}\n", "attack_options.norm", "options for norm, which no cell"),
        ("attack_options:\n  nosuch: {k: 1}\n", "attack_options.nosuch", "options for nosuch"),
        ("attacker: passive-1\nattack_options:\n  completion: {nosuch: 1}\n", "attack_options.completion", "nosuch"),
        ("attacker: passive-1\nattack_options:\n  completion: 5\n", "attack_options.completion", "a mapping"),
    ],
)
def test_bad_attacker_settings_are_refused_at_their_line(tmp_path: Path, text: str, where: str, message: str) -> None:
    with pytest.raises(exp_scenario.ScenarioError, match=message) as info:
        scenario(tmp_path, text)
    assert f": {where}: " in str(info.value) and "s.yaml:" in str(info.value)


def test_a_training_defense_needs_the_coordinator_top_split_nn(tmp_path: Path) -> None:
    path = tmp_path / "lr.yaml"
    path.write_text("dataset: breast_cancer\nbackend: plain\nsweep:\n  training_defense: [max_norm]\n")
    with pytest.raises(exp_scenario.ScenarioError, match="coordinator-top"):
        exp_scenario.load_scenario(path)


def test_options_of_a_swept_attackers_attacks_reach_the_cells_that_run_them(tmp_path: Path) -> None:
    s = scenario(tmp_path, "attack_options:\n  completion: {k: 40}\nsweep:\n  attacker: [active, passive-1]\n")
    options = {exp_scenario.cell_attacker(s, c): exp_scenario.attack_scenario(s, c).attack_options
               for c in exp_scenario.expand(s)}  # fmt: skip
    assert options == {"active": {}, "passive-1": {"completion": {"k": 40}}}
