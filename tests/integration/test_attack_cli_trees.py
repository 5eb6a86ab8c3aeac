"""`vflsec attack --model tree|forest` through the real services (parties in-process, mTLS, CKKS): the curious
active party's recordings of a released tree feed luo's PRA, scored by MSE and luo's correct branching rate next
to the random-path baseline when the run asks for luo's setting (`--param-release thresholds`); by default (as under
`withhold`) the passive thresholds never arrive and the attacks say why."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from vflsec.client.cli import app
from vflsec.client.experiments import runs


def attack(monkeypatch, *args: str) -> dict:
    monkeypatch.setattr(runs, "run_processes", runs.run_in_process)  # same services, one process: CI-fast
    result = CliRunner().invoke(app, ["attack", "--dataset", "wine", "--json", *args])
    assert result.exit_code == 0, result.output
    assert "grown once over its training rows: epochs 1" in result.output  # the default follows the bound
    return json.loads(result.output.strip().splitlines()[-1])


def test_pra_on_a_released_tree_beats_the_random_path(monkeypatch) -> None:
    report = attack(
        monkeypatch, "--model", "tree", "--predictions", "80", "--param-release", "thresholds"
    )  # 80: half of wine's aligned rows, held out of training; thresholds: luo's setting, one explicit option away
    assert report["model"] == "tree" and report["backend"] == "ckks" and report["n_samples"] == 80
    assert report["query_rows_in_training"] == 0
    pra = report["attacks"]["pra"]
    assert 0 <= report["cbr_random_path"] <= 1 and 0 <= pra["cbr"] <= 1
    # Measured 0.757 vs 0.495 (wine, 160 queried rows); a margin far below that gap.
    assert pra["cbr"] > report["cbr_random_path"] + 0.1, (pra, report["cbr_random_path"])


def test_withheld_thresholds_leave_pra_nothing_to_restrict(monkeypatch) -> None:
    report = attack(monkeypatch, "--model", "tree", "--predictions", "40")  # the default chain: thresholds stay home
    assert "thresholds were withheld" in report["attacks"]["pra"]["not_applicable"]
    assert "cbr_random_path" not in report
