"""`vflsec attack` end to end (plain backend, parties in-process): the aware attackers run by default, the
announced chains reach them with their public parameters through the curious store, and --json keeps its keys."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from vflsec.client.cli import app
from vflsec.client.experiments import runs


def run_cli(monkeypatch, *options: str) -> dict:
    monkeypatch.setattr(runs, "run_processes", runs.run_in_process)  # same services, one process: CI-fast
    args = ["attack", "--dataset", "wine", "--passive-features", "2", "--backend", "plain", "--epochs", "10"]
    result = CliRunner().invoke(app, [*args, "--predictions", "60", *options, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_attack_runs_the_aware_attackers_for_the_chain_and_keeps_its_json_keys(monkeypatch, tmp_path) -> None:
    report = run_cli(monkeypatch, "--param-release", "ppsa:H=flip", "--markdown", str(tmp_path / "table.md"))
    assert {"baselines", "accuracy", "attacks", "strongest"} <= set(report)
    aware = {"aware_ls", "aware_cls", "aware_rcc2", "aware_ls_min_norm"}
    assert set(runs.DEFAULT_ATTACKS) | aware == set(report["attacks"])
    # (aware_interval needs bounds: a parameter defense leaves exact equations)
    for name, r in report["attacks"].items():
        assert {"mse", "mse_clipped", "aware"} <= set(r) and r["aware"] == name.startswith("aware_")
    # PPS-A flip is undone from the announced H and the released bias: the headline is the undone MSE.
    assert report["attacks"]["aware_ls"]["mse"] <= 1e-6 < report["attacks"]["ls_clamped"]["mse"]
    assert report["strongest"]["aware"] and report["strongest"]["mse"] <= 1e-6
    table = (tmp_path / "table.md").read_text()
    assert f"strongest: {report['strongest']['attack']} (aware)" in table and "best naive: " in table


def test_score_chain_params_reach_the_aware_attacker(monkeypatch) -> None:
    report = run_cli(monkeypatch, "--release", "privee:epsilon=0.1,basis=householder")
    attacks = report["attacks"]
    assert "not_applicable" not in attacks["aware_ls"]
    assert attacks["aware_ls"]["mse_clipped"] < min(attacks[n]["mse_clipped"] for n in runs.DEFAULT_ATTACKS)
    assert report["strongest"]["mse"] < report["baselines"]["half"]
