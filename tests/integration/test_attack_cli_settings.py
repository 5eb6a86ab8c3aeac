"""`vflsec attack` set up as a paper's experiment (issue 16), through the real services (plain backend, parties
in-process): target encoding dealt before the split, random passive columns, per-attack options, training
options, and the JSON that records them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from vflsec.client.cli import app
from vflsec.client.experiments import harness, runs


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> str:
    """A small table with two categorical columns that carry the label, and three numeric ones."""
    rng = np.random.default_rng(0)
    n = 500
    colour = rng.choice(["red", "green", "blue", "grey"], n)
    shape = rng.choice(["round", "square", "flat"], n)
    a, b, c = rng.normal(size=(3, n))
    logit = 1.5 * a - b + 2.0 * (colour == "red") - 1.5 * (shape == "flat")
    y = np.where(logit + rng.normal(scale=0.5, size=n) > 0, "yes", "no")
    path = tmp_path_factory.mktemp("data") / "small.csv"
    rows = [",".join(map(str, r)) for r in zip(colour, a, shape, b, c, y, strict=True)]
    path.write_text("\n".join(["colour,a,shape,b,c,label", *rows]) + "\n")
    return str(path)


def attack(monkeypatch, *args: str) -> tuple[int, str]:
    monkeypatch.setattr(runs, "run_processes", runs.run_in_process)  # same services, one process: CI-fast
    common = ["attack", "--backend", "plain", "--epochs", "5", "--predictions", "80", "--json"]
    result = CliRunner().invoke(app, [*common, *args])
    return result.exit_code, result.output


def test_target_encoding_random_columns_and_attack_options_reach_the_report(monkeypatch, table) -> None:
    code, out = attack(
        monkeypatch, "--dataset", table, "--encoding", "target", "--passive-features", "random:2:5",
        "--attacks", "ram,half_star,sign_only", "--attack-option", "ram.n_refine=20",
        "--attack-option", "ram.folds=3", "--train-rows", "250", "--optimizer", "sgd", "--learning-rate", "0.5",
        "--l2", "0",
    )  # fmt: skip
    assert code == 0, out
    report = json.loads(out.strip().splitlines()[-1])
    assert report["encoding"] == "target" and report["d_passive"] == 2 and report["d_active"] == 3
    assert report["n_train"] == 250 and report["n_samples"] == 80
    ram = report["attacks"]["ram"]
    assert ram["options"]["n_refine"] == 20 and ram["options"]["folds"] == 3 and ram["options"]["refine"] is True
    assert report["attacks"]["half_star"]["options"] == {"clamp": False}  # defaults are recorded too
    assert "sign_only needs exactly one passive feature" in report["attacks"]["sign_only"]["not_applicable"]
    assert 0.0 <= report["majority_rate"] <= 1.0 and "accuracy_warning" in report
    assert f"majority class {report['majority_rate']:.4f}" in out


def test_sign_only_runs_under_withhold_and_reports_its_case(monkeypatch, table) -> None:
    # withhold keeps every passive block at its owner; the active block is the active party's own.
    code, out = attack(
        monkeypatch, "--dataset", table, "--encoding", "ordinal", "--passive-features", "shape",
        "--param-release", "withhold", "--attacks", "sign_only,half_star",
        "--attack-option", "sign_only.use_bias=false",
    )  # fmt: skip
    assert code == 0, out
    report = json.loads(out.strip().splitlines()[-1])
    sign_only = report["attacks"]["sign_only"]
    assert sign_only["case"] == "2" and sign_only["options"] == {"sign_relation": "same", "use_bias": False}
    assert "w_passive" in report["attacks"]["half_star"]["not_applicable"]


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("ram.epochs=3", "attack 'ram' has no parameter(s) ['epochs'] (accepted: refine, alpha"),
        ("grn.epochs=3", "--attack-option for grn, which this run does not attack with"),
        ("ram=3", "expected ATTACK.KEY=VALUE"),
    ],
)
def test_a_bad_attack_option_is_refused_before_anything_runs(monkeypatch, table, option, message) -> None:
    monkeypatch.setattr(harness, "run_scenario", lambda *a, **k: pytest.fail("a federation was started"))
    code, out = attack(monkeypatch, "--dataset", table, "--attacks", "ram", "--attack-option", option)
    assert code == 2 and message in " ".join(out.split()), out


@pytest.mark.parametrize(
    ("args", "option", "added"),
    [
        (("--model", "splitnn", "--topology", "active-top"), "labelled_rows.k=40", "labelled_rows"),
        ((), "rcc1.box_tol=1e-6", "rcc1"),
    ],
)
def test_an_option_of_an_opt_in_attack_adds_it_to_the_defaults(monkeypatch, table, args, option, added) -> None:
    scenarios = []

    def capture(scenario, *rest, **kwargs):
        scenarios.append(scenario)
        raise SystemExit(0)  # nothing runs: only what the CLI asked for is checked

    monkeypatch.setattr(harness, "run_attack_scenario", capture)
    code, out = attack(monkeypatch, "--dataset", table, *args, "--attack-option", option)
    assert code == 0 and len(scenarios) == 1, out
    assert scenarios[0].attacks is None and list(scenarios[0].extra_attacks) == [added]
    assert set(scenarios[0].attack_options) == {added}
