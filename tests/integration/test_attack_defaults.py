"""`vflsec attack` on the small bundled datasets with the default queries (issue 31, items 1, 2 and 5): the queried
rows are held out of training, the query set shrinks (and says so) when the data cannot give both, and the slow
opt-in attacks are named in the report with the way to add them."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from vflsec.client.cli import app
from vflsec.client.experiments import runs


def _run(*args: str) -> tuple[dict, str]:
    result = CliRunner().invoke(app, ["attack", *args, "--backend", "plain", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output.strip().splitlines()[-1]), " ".join(result.output.split())


@pytest.mark.parametrize("dataset", ["iris", "breast_cancer"])
def test_default_queries_are_held_out_and_am_runs(monkeypatch, dataset: str) -> None:
    monkeypatch.setattr(runs, "run_processes", runs.run_in_process)
    report, output = _run("--dataset", dataset, "--attacks", "am,esa", "--epochs", "3")
    # --predictions 1000 is more than half the aligned rows: half are queried, the other half train, none both.
    assert report["query_rows_in_training"] == 0
    assert report["n_queried"] == report["n_samples"]
    assert report["n_queried"] in (report["n_train"], report["n_train"] - 1)
    assert "not the 1000 asked" in report["queries_note"] and report["queries_note"] in output
    assert "mse" in report["attacks"]["am"], report["attacks"]["am"]  # AM has training rows of its own to fit
    assert "left_out" not in report  # an explicit attack list leaves nothing out behind the user's back


def test_default_attacks_on_wine_name_what_they_leave_out(monkeypatch) -> None:
    monkeypatch.setattr(runs, "run_processes", runs.run_in_process)
    report, output = _run("--dataset", "wine")
    assert report["query_rows_in_training"] == 0 and report["n_queried"] + report["n_train"] <= 178
    assert set(report["attacks"]) == set(runs.DEFAULT_ATTACKS) and "rcc1" in report["left_out"]
    assert all("mse" in r for r in report["attacks"].values()), report["attacks"]
    assert "add with --attacks +rcc1" in output
    # Progress when piped (item 4): every phase announced and timed, one line per attack with its time.
    assert all(f"{phase}: " in output for phase in ("load", "deal", "align", "train", "predict", "attack"))
    assert all(f"attack {name}: MSE " in output for name in runs.DEFAULT_ATTACKS)
    added, _ = _run("--dataset", "wine", "--attacks", "+rcc1", "--epochs", "3")
    assert set(added["attacks"]) == {*runs.DEFAULT_ATTACKS, "rcc1"} and added["left_out"] == {}
