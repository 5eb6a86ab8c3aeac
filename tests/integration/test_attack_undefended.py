"""`vflsec attack --release STEP` answers "what does this defense cost" (issue 31, item 3): the same trained model,
queried on the same rows, released with and without the chain; accuracy and the strongest MSE of both, each
against Half, and a one-line verdict."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from vflsec.client.cli import app
from vflsec.client.experiments import harness, runs


def test_a_defended_attack_reports_the_undefended_figures_beside_it(monkeypatch) -> None:
    monkeypatch.setattr(runs, "run_processes", runs.run_in_process)
    args = ["attack", "--dataset", "wine", "--backend", "plain", "--epochs", "3", "--attacks", "esa,half_star,aware_ls"]
    result = CliRunner().invoke(app, [*args, "--release", "rounding:decimals=1", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    undefended, half = report["undefended"], report["baselines"]["half"]
    assert undefended["half"] == half  # the same queried rows: the same blind baseline
    assert set(undefended["attacks"]) == {"esa", "half_star"}  # the aware attack targets the chain only
    assert 0.0 < undefended["accuracy"] <= 1.0 and undefended["strongest"]["mse"] == undefended["mse"]
    assert undefended["advantage"] == max(0.0, 1.0 - undefended["mse"] / half)
    assert report["advantage"] == max(0.0, 1.0 - report["strongest"]["mse"] / half)
    leaks = report["strongest"]["mse"] < (1.0 - harness.LEAK_MARGIN) * half
    assert report["verdict"].startswith("leaks:" if leaks else "protects:")
    assert f"undefended strongest {undefended['mse']:.4g}" in report["verdict"]
    output = " ".join(result.output.split())
    assert f"verdict: {report['verdict']}" in output and "min-max scaled to [0, 1]" in output


def test_an_undefended_attack_has_no_undefended_block(monkeypatch) -> None:
    monkeypatch.setattr(runs, "run_processes", runs.run_in_process)
    args = ["attack", "--dataset", "iris", "--backend", "plain", "--epochs", "2", "--attacks", "esa", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert "undefended" not in report and "verdict" not in report
