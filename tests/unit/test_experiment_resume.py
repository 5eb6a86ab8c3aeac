"""Resume logic and the summary, on pure functions: which cells are finished, atomic writes, DCS, ratios."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from vflsec.client.experiments import results as exp_results
from vflsec.client.experiments import runner as exp_runner
from vflsec.client.experiments import scenario as exp_scenario


@pytest.fixture
def sweep(tmp_path: Path) -> exp_scenario.Scenario:
    path = tmp_path / "s.yaml"
    path.write_text("dataset: wine\nbackend: plain\nrepetitions: 2\nsweep:\n  rounding.decimals: [1, 2]\n")
    return exp_scenario.load_scenario(path)


def test_write_atomic_replaces_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "cells" / "a.json"
    exp_runner.write_atomic(target, "old")
    exp_runner.write_atomic(target, "new")
    assert target.read_text() == "new"
    assert [p.name for p in target.parent.iterdir()] == ["a.json"]


def test_finished_cells_are_not_pending_and_a_half_written_one_is(tmp_path: Path, sweep: exp_scenario.Scenario) -> None:
    out = tmp_path / "out"
    cells = exp_scenario.expand(sweep)
    done_cell, torn_cell = cells[0], cells[1]
    folder = out / "cells"
    exp_runner.write_atomic(folder / f"{exp_scenario.cell_key(sweep, done_cell)}.json", json.dumps({"report": {}}))
    (folder / f"{exp_scenario.cell_key(sweep, torn_cell)}.json").write_text('{"report": {"accu')  # killed mid-write
    (out / "cells" / ".x.json.123.tmp").write_text("{")  # a temporary never renamed counts for nothing
    done, todo = exp_runner.pending(sweep, out)
    assert done == [done_cell]
    assert set(todo) == set(cells) - {done_cell} and torn_cell in todo
    assert exp_runner.finished(out, exp_scenario.cell_key(sweep, torn_cell)) is None


def test_pending_interleaves_training_groups(tmp_path: Path, sweep: exp_scenario.Scenario) -> None:
    _, todo = exp_runner.pending(sweep, tmp_path)
    keys = [exp_scenario.training_key(sweep, c) for c in todo]
    assert len(set(keys)) == 2 and keys[0] != keys[1]  # two workers start on two different trainings


def test_a_finished_cell_is_read_back_not_rerun(tmp_path: Path, sweep: exp_scenario.Scenario) -> None:
    cell = exp_scenario.expand(sweep)[0]
    stored = {"key": "k", "cell": {}, "report": {"accuracy": 0.5}}
    exp_runner.write_atomic(tmp_path / "cells" / f"{exp_scenario.cell_key(sweep, cell)}.json", json.dumps(stored))
    assert exp_runner.cell_task(sweep, cell, tmp_path) == stored  # no federation is started for it


def test_dcs_formula() -> None:
    assert exp_results.dcs(0.0, 0.0) == 1.0
    assert exp_results.dcs(1.0, 0.0) == pytest.approx(1 / (1 + math.sqrt(0.5)))
    assert exp_results.dcs(0.6, 0.2) == pytest.approx(1 / (1 + math.sqrt(0.5 * 0.36 + 0.5 * 0.04)))


def report(accuracy: float, esa: float, half: float, aware: float | None = None) -> dict:
    attacks = {"esa": {"mse": esa * 1.1, "mse_clipped": esa, "aware": False}}
    attacks["aware_rounding"] = (
        {"not_applicable": "no rounding step"} if aware is None else {"mse": aware, "mse_clipped": aware, "aware": True}
    )
    return {
        "accuracy": accuracy,
        "attacks": attacks,
        "baselines": {"half": half, "rg": 2 * half, "zero": 1.5 * half},
        "score_release": [],
        "param_release": [],
    }


def result(decimals: int | None, rep: int, rep_report: dict) -> dict:
    if decimals is not None:
        rep_report["score_release"] = [f"rounding:decimals={decimals}"]
    return {"cell": {"values": {"rounding.decimals": decimals}, "repetition": rep}, "report": rep_report}


def test_summary_rows_strongest_ratio_and_dcs(sweep: exp_scenario.Scenario) -> None:
    results = [
        result(None, 0, report(0.90, 0.02, 0.10)),
        result(None, 1, report(0.92, 0.04, 0.10)),
        result(1, 0, report(0.80, 0.09, 0.10, aware=0.05)),
        result(1, 1, report(0.84, 0.09, 0.10, aware=0.07)),
    ]
    summary = exp_results.summarise(sweep, results)
    none, rounded = summary["rows"]
    assert none["defense"] == "none" and none["strongest"]["attack"] == "esa"
    assert none["attacks"]["esa"]["mse_clipped"]["mean"] == pytest.approx(0.03)
    assert none["attacks"]["esa"]["mse_clipped"]["std"] == pytest.approx(0.01)
    assert none["attacks"]["aware_rounding"] == {"not_applicable": "no rounding step"}
    assert rounded["strongest"] == {"attack": "aware_rounding", "aware": True, "mse": pytest.approx(0.06)}
    assert rounded["ratio_to_undefended"] == pytest.approx(0.06 / 0.03)
    assert rounded["ap"] == pytest.approx(1 - 0.06 / 0.10)
    assert rounded["delta_mp"] == pytest.approx(0.91 - 0.82)
    assert rounded["dcs"] == pytest.approx(exp_results.dcs(0.4, 0.09))
    assert none["dcs"] == pytest.approx(exp_results.dcs(1 - 0.03 / 0.10, 0.0))
    text = exp_results.markdown(summary)
    assert "DCS = 1 / (1 + sqrt((1 − β)·AP² + β·ΔMP²)), β = 0.5" in text
    assert "| rounding.decimals=1 | 0.82 ± 0.02 |" in text and "aware_rounding (aware) | 0.06 ± 0.01" in text


def test_an_attack_that_ran_in_some_repetitions_only_is_not_averaged(sweep: exp_scenario.Scenario) -> None:
    results = [result(1, 0, report(0.8, 0.09, 0.1, aware=0.05)), result(1, 1, report(0.8, 0.09, 0.1))]
    (row,) = exp_results.summarise(sweep, results)["rows"]
    assert "not_applicable" in row["attacks"]["aware_rounding"] and row["strongest"]["attack"] == "esa"
    assert "ratio_to_undefended" not in row  # no undefended row in these results
