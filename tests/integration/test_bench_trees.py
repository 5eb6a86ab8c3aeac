"""`vflsec bench trees`: the federated tree (each party its own process, ckks and plain) against scikit-learn's
one-tree HistGradientBoostingClassifier on the same rows, at a tiny size; the figures are checked for being computed
from each other, never for their speed."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from vflsec.client.cli import app


def test_bench_trees_reports_both_sides_on_the_same_rows() -> None:
    args = ["bench", "trees", "--rows", "400", "--features", "6", "--depth", "3", "--bins", "8", "--threads", "1"]
    run = CliRunner().invoke(app, [*args, "--json"])
    assert run.exit_code == 0, run.output
    r = json.loads(run.stdout.strip().splitlines()[-1])
    assert (r["rows"], r["features"], r["depth"], r["bins"], r["threads"]) == (400, 6, 3, 8, 1)
    assert r["train_rows"] + r["test_rows"] == 400 and r["test_rows"] == 80  # the seeded, stratified 20 %
    sides = {"ckks", "plain", "hgb"}
    for key in ("train_seconds", "cpu_seconds", "accuracy", "auc"):
        assert set(r[key]) == sides, key
    assert all(t > 0 for t in r["train_seconds"].values())
    assert all(0.0 <= r[key][side] <= 1.0 for key in ("accuracy", "auc") for side in sides)
    # Each ratio is the quotient of the two times it names, and the goal reads the ckks one.
    t = r["train_seconds"]
    for name, ratio in r["ratios"].items():
        over, under = name.split("_over_")
        assert math.isclose(ratio, t[over] / t[under])
    assert r["goal"] == {"ckks_over_hgb_at_most": 17.0, "met": r["ratios"]["ckks_over_hgb"] <= 17.0}
    # CKKS opens exact integer counts: the same tree, the same held-out predictions.
    assert r["same_predictions_ckks_plain"] and r["accuracy"]["ckks"] == r["accuracy"]["plain"]
    settings = r["hgb"]["settings"]
    assert (settings["max_iter"], settings["max_depth"], settings["max_bins"]) == (1, 3, 8)
    assert settings["early_stopping"] is False and len(r["hgb"]["train_seconds_fits"]) >= 1
    for backend in ("ckks", "plain"):
        peaks = r["peak_rss_mb"][backend]
        assert set(peaks) == {"coordinator", "active", "passive-1"} and all(mb > 10 for mb in peaks.values())
        assert r["federated"][backend]["align_seconds"] > 0
    assert "x HGB" in run.stderr  # the summary table beside the JSON


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--rows", "30"], "--rows must be at least 41"),
        (["--bins", "100"], "--bins must lie in [2, 64]"),
        (["--depth", "13"], "--depth must lie in [1, 12]"),
        (["--depth", "0"], "--depth must lie in [1, 12]"),
        (["--features", "1"], "--features must be at least 2"),
        (["--backends", "paillier"], "--backends must name"),
        (["--threads", "999"], "--threads must lie in"),
    ],
)
def test_bench_trees_refuses_bad_options_with_one_line(extra: list[str], named: str) -> None:
    run = CliRunner().invoke(app, ["bench", "trees", *extra])
    assert run.exit_code == 2 and named in run.output and "Traceback" not in run.output, run.output
