"""`vflsec attack` with default epochs (issue 16, fast runs): the epochs follow the training rows by the stated
rule, the report says so in one line and in its JSON, and it carries the run's phase timings."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from vflsec.client.cli import app
from vflsec.client.experiments import runs


def test_default_epochs_are_stated_and_the_phases_timed(monkeypatch) -> None:
    monkeypatch.setattr(runs, "run_processes", runs.run_in_process)
    args = ["attack", "--dataset", "breast_cancer", "--backend", "plain", "--predictions", "60", "--attacks", "esa"]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    n_train = report["n_train"]
    assert n_train < 6_667 and report["epochs"] == report["epochs_trained"] == 30  # small tables keep 30
    rule = f"default 30 = min(30, max(3, 200,000 / {n_train} training rows))"
    assert report["epochs_note"] == rule and f"epochs 30: {rule}" in " ".join(result.output.split())
    phases = ("load", "deal", "align", "train", "predict", "attack")
    assert all(report[f"{p}_seconds"] > 0 for p in phases), {p: report[f"{p}_seconds"] for p in phases}
    assert list(report)[-1] == "peak_rss_mb" and report["peak_rss_mb"] == {}  # in-process parties: no own peak
    explicit = CliRunner().invoke(app, [*args, "--epochs", "2", "--json"])
    assert explicit.exit_code == 0, explicit.output
    report = json.loads(explicit.output.strip().splitlines()[-1])
    assert (report["epochs"], report["epochs_note"], report["epochs_trained"]) == (2, "as requested", 2)
