"""`vflsec experiment` end to end on a tiny scenario: two cells (undefended, rounding) through the real services
(in-process gRPC servers, mTLS), one trained federation serving both; the Ray path on a local Ray instance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vflsec.client.experiments import runner as exp_runner
from vflsec.client.experiments import runs
from vflsec.client.experiments import scenario as exp_scenario

TINY = """
name: tiny
dataset: breast_cancer
backend: plain
passive_fraction: 0.3
training: {epochs: 2}
predictions: 100
attacks: [esa, ls_clamped]
sweep:
  rounding.decimals: [1]
"""


def tiny(tmp_path: Path) -> exp_scenario.Scenario:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return exp_scenario.load_scenario(path)


def test_two_cells_share_one_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trainings: list[str] = []
    train = runs.train_session

    def counted(scenario: runs.AttackScenario, operator: object, *progress: object) -> tuple[str, list[str]]:
        trainings.append(scenario.spec.name)
        return train(scenario, operator, *progress)  # type: ignore[arg-type]

    monkeypatch.setattr(runs, "train_session", counted)
    out = tmp_path / "out"
    summary = exp_runner.run_experiment(tiny(tmp_path), out, workers=1)
    assert trainings == ["breast_cancer"]  # the rounding cell resumed the undefended cell's trained session
    none, rounded = summary["rows"]
    assert (none["defense"], rounded["defense"]) == ("none", "rounding.decimals=1")
    assert rounded["score_release"] == ["rounding:decimals=1"]
    # Same model, released through each cell's own coordinator chain: rounding changes what ESA sees.
    assert none["attacks"]["esa"]["mse_clipped"]["mean"] != rounded["attacks"]["esa"]["mse_clipped"]["mean"]
    assert 0.5 < none["accuracy"]["mean"] <= 1.0 and "dcs" in rounded and "ratio_to_undefended" in rounded
    stored = json.loads((out / "results.json").read_text())
    assert len(stored["cells"]) == 2 and stored["dcs_formula"].startswith("DCS = 1 / (1 + sqrt(")
    assert "| rounding.decimals=1 |" in (out / "results.md").read_text()
    assert {Path(p).name for p in summary["plots"]} == {"privacy_utility.png", "mse_vs_rounding_decimals.png"}
    assert all(Path(p).stat().st_size > 10_000 for p in summary["plots"])
    assert not (out / "train").exists()  # the trained base is removed once every cell is on disk
    # A second run finds every cell finished and runs none.
    ran: list[object] = []
    exp_runner.run_experiment(tiny(tmp_path), out, workers=1, on_cell=lambda cell, result: ran.append(result))
    assert ran == [None, None] and trainings == ["breast_cancer"]


@pytest.mark.slow
def test_cells_as_ray_tasks_on_a_local_instance(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    try:
        summary = exp_runner.run_experiment(tiny(tmp_path), tmp_path / "out", ray_address="local")
    finally:
        ray.shutdown()
    assert [row["defense"] for row in summary["rows"]] == ["none", "rounding.decimals=1"]
    assert all("mse_clipped" in row["attacks"]["esa"] for row in summary["rows"])


def test_a_splitnn_scenario_restores_its_trained_federation_per_cell(tmp_path: Path) -> None:
    """Two cells of one split-NN coordinator-top training: the second restores the trained federation from its
    checkpoints (a coordinator that pulled no passive block at FinishTraining included)."""
    path = tmp_path / "nn.yaml"
    path.write_text(
        "name: nn\ndataset: breast_cancer\nmodel: splitnn\nbackend: plain\ntraining: {epochs: 2}\n"
        "predictions: 60\nsweep:\n  rounding.decimals: [1]\n"
    )
    summary = exp_runner.run_experiment(exp_scenario.load_scenario(path), tmp_path / "out", workers=1)
    none, rounded = summary["rows"]
    assert summary["model"] == "splitnn" and rounded["score_release"] == ["rounding:decimals=1"]
    assert 0.5 < none["accuracy"]["mean"] <= 1.0 and 0.5 < rounded["accuracy"]["mean"] <= 1.0
