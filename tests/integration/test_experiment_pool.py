"""The process-pool path (`--workers 2`): two cells of one training group in two spawned workers (the second
waits on the base's lock while the first trains it), both results whole, and a rerun redoes only a lost cell."""

from __future__ import annotations

import json
from pathlib import Path

from vflsec.client.experiments import runner as exp_runner
from vflsec.client.experiments import scenario as exp_scenario

SCENARIO = """
name: pool
dataset: breast_cancer
backend: plain
passive_fraction: 0.3
training: {epochs: 1}
predictions: 60
attacks: [esa, ls_clamped]
sweep:
  rounding.decimals: [1]
"""


def test_two_cells_in_two_workers_and_a_resumed_rerun(tmp_path: Path) -> None:
    path, out = tmp_path / "pool.yaml", tmp_path / "out"
    path.write_text(SCENARIO)
    scenario = exp_scenario.load_scenario(path)
    ran: list[tuple[str, bool]] = []
    summary = exp_runner.run_experiment(
        scenario, out, workers=2, on_cell=lambda c, r: ran.append((c.label, r is not None))
    )
    assert sorted(ran) == [("rounding.decimals=1, rep 0", True), ("rounding.decimals=none, rep 0", True)]
    none, rounded = summary["rows"]
    assert (none["defense"], rounded["score_release"]) == ("none", ["rounding:decimals=1"])
    for row in (none, rounded):  # each worker's cell ran through the services and scored both attacks
        assert 0.5 < row["accuracy"]["mean"] <= 1.0
        assert {a["metric"] for a in row["attacks"].values()} == {"mse"}
    # One trained base served both workers: both released the same model (no parameter-release chain).
    first, second = (c["report"]["w_passive"] for c in summary["cells"])
    assert first == second and first is not None
    cells = sorted((out / "cells").glob("*.json"))
    assert len(cells) == 2 and not (out / "train").exists()

    kept, lost = cells
    kept_bytes = kept.read_bytes()
    lost.unlink()  # as if that cell's worker had died before writing it
    ran.clear()
    again = exp_runner.run_experiment(
        scenario, out, workers=2, on_cell=lambda c, r: ran.append((c.label, r is not None))
    )
    assert sorted(flag for _, flag in ran) == [False, True]  # one cell read back, one run again
    assert kept.read_bytes() == kept_bytes and lost.exists()
    assert len(json.loads((out / "results.json").read_text())["cells"]) == 2
    assert [r["defense"] for r in again["rows"]] == ["none", "rounding.decimals=1"]
