"""`vflsec bench scale` on the smallest grid: every party its own process, both backends, peak RSS, the plot."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from vflsec.client.bench.scale import _columns, write_scale_federation
from vflsec.client.cli import app
from vflsec.services.data import datasets


def test_streamed_shards_hold_the_grid_points_rows_and_columns(tmp_path: Path) -> None:
    layout = write_scale_federation(1234, 2, 3, tmp_path)
    shards = {p: datasets.read_party_csv(tmp_path / p / "data.csv") for p in ("active", "passive-1", "passive-2")}
    assert [s.columns for s in shards.values()] == _columns(2, 3) == layout.split.parties
    assert all(s.ids.tolist() == shards["active"].ids.tolist() and s.X.shape == (1234, 3) for s in shards.values())
    y = shards["active"].y
    assert y is not None and 0.2 < y.mean() < 0.8  # both classes, from a model over every party's columns


def test_bench_scale_smallest_grid(tmp_path: Path) -> None:
    plot, table = tmp_path / "scale.png", tmp_path / "scale.md"
    args = ["bench", "scale", "--rows-grid", "400,800", "--passive-grid", "1", "--features-grid", "3", "--json"]
    args += ["--plot", str(plot), "--markdown", str(table)]
    run = CliRunner().invoke(app, args)
    assert run.exit_code == 0, run.output
    result = json.loads(run.stdout.strip().splitlines()[-1])
    rows = result["sweeps"]["rows"]
    assert [p["rows"] for p in rows] == [400, 800]
    for point in rows:
        assert set(point["peak_rss_mib"]) == {"coordinator", "active", "passive-1"}
        assert all(mib > 10 for mib in point["peak_rss_mib"].values())  # a real process's high-water mark
        for backend in ("ckks", "plain"):
            assert point[backend]["train_epoch_seconds"] > 0 and point[backend]["inference_samples_per_second"] > 0
    assert all(isinstance(result["rows_exponent"][b]["train_epoch"], float) for b in ("ckks", "plain"))
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| rows | 800 | 1 | 3 |" in table.read_text()


def test_bench_scale_refuses_a_grid_below_the_minimum_batch() -> None:
    """The active block counts its bias column: 300 features -> 301 columns -> a minimum batch of 602."""
    args = ["bench", "scale", "--rows-grid", "1000", "--passive-grid", "1", "--features-grid", "300"]
    run = CliRunner().invoke(app, [*args, "--batch", "100"])
    assert run.exit_code == 2 and "minimum batch 602" in run.output and "at least 602" in run.output, run.output
    run = CliRunner().invoke(app, ["bench", "scale", "--rows-grid", "400", *args[4:]])
    assert run.exit_code == 2 and "400 rows cannot fill one minimum batch of 602" in run.output, run.output
