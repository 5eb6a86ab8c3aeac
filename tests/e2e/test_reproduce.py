"""`vflsec reproduce`: the fast subset as CI runs it (one JSON object on stdout), and each claim as a test.

A claim is expected `reproduced`, or `differs` exactly when the registry records the known difference (so a
claim that starts to reproduce, or stops, fails here); `skipped` only when its dataset is missing.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vflsec.client.experiments.reproduce import claims as rep_claims
from vflsec.client.experiments.reproduce import run as rep


@pytest.fixture(scope="module")
def fast_document() -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "vflsec.client.cli", "reproduce", "all", "--fast", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = done.stdout.strip().splitlines()  # ONE JSON object, nothing else on stdout
    return json.loads(line)


def test_fast_subset_emits_one_document_with_every_fast_claim(fast_document: dict[str, Any]) -> None:
    fast = [name for name, c in rep.CLAIMS.items() if c.fast]
    assert list(fast_document["claims"]) == fast
    for row in fast_document["claims"].values():
        assert {"source", "paper", "measured", "verdict", "rule", "kind", "runs", "reproduced_runs"} <= set(row)
        assert len(row["commit"]) >= 40 and row["date"].endswith("Z")
        assert row["verdict"] in rep.VERDICTS
        assert ("reason" in row) == (row["verdict"] != "reproduced")
    assert sum(fast_document["summary"].values()) == len(fast)


def _check(name: str, row: dict[str, Any]) -> None:
    """`reproduced`, or `differs` for the registered known difference only: its predicate must hold on the row's
    own figures (a `differs` for another reason, e.g. a broken attack, fails here)."""
    c = rep.CLAIMS[name]
    if row["verdict"] == "skipped":
        assert rep.missing_datasets(c), row
        pytest.skip(row["reason"])
    assert rep.same_registration(row, c) and row["reproduced_runs"] <= row["runs"] == c.runs, row
    if c.known_difference and c.runs > 1 and row["verdict"] == "reproduced":
        return  # a claim of several runs known to vary: every run reproducing is an outcome it allows
    expected = "differs" if c.known_difference else "reproduced"
    assert row["verdict"] == expected, row
    if expected == "differs":
        assert c.differs_as_known is not None and c.differs_as_known(row), f"{name} differs, not as known: {row}"


@pytest.mark.parametrize("name", [n for n, c in rep.CLAIMS.items() if c.fast])
def test_fast_claim(name: str, fast_document: dict[str, Any]) -> None:
    _check(name, fast_document["claims"][name])


# Claims too long for CI's 20 minutes (luo Table III: three Bank splits of 4,000 queries, ~90-170 s) are marked
# `long`: deselected by default (pyproject addopts), run with `pytest -m long` or `vflsec reproduce NAME`.
# ye_masquerade_bank is run there too: since review 6 the defended layer (masquerade's fixed Q, P's start) is
# drawn from the passive party's OS entropy at every run, so its verdict varies from run to run (6 runs on
# 2026-11-24: reproduced 4 times); the claim now runs 6 times and reports how many reproduced (its known
# difference accepts at least half), which takes minutes.
# ye_masquerade_log2n trains eight Bank and Credit models and runs the sampled searches (~4 min a run), and its
# verdict depends on the draw of ye's random Q (a draw that leaves the column far from the span hides it): three runs.
# luo_grn_rf_cbr_bank fits a surrogate and GRN per split on Bank (~2 min each).
LONG_CLAIMS = frozenset({"luo_table3_grn_ablation", "ye_masquerade_bank", "ye_masquerade_log2n", "luo_grn_rf_cbr_bank"})


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.long) if n in LONG_CLAIMS else n
        for n, c in rep.CLAIMS.items()
        if not c.fast
    ],
)
def test_slow_claim(name: str) -> None:
    _check(name, rep.run_claim(rep.CLAIMS[name]))


def test_missing_dataset_is_skipped_with_the_reason(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("VFLSEC_DATASETS", str(tmp_path))  # an empty datasets folder
    row = rep.run_claim(rep.CLAIMS["varasteh_half_bank"])
    assert row["verdict"] == "skipped" and row["measured"] is None
    assert "bank" in row["reason"] and str(tmp_path) in row["reason"]


def test_unknown_claim_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="known: all, luo_worked_example"):
        rep.select("luo_table_iv", fast=False)


def test_write_round_trips_and_tabulates(tmp_path) -> None:
    document = rep.reproduce([rep.CLAIMS["luo_worked_example"]])
    json_path, md_path = rep.write(document, tmp_path)
    written = json.loads(json_path.read_text())
    assert written["claims"]["luo_worked_example"] == json.loads(json.dumps(document["claims"]["luo_worked_example"]))
    # the whole registry: the claims not run are listed as not measured, never left out
    assert list(written["claims"]) == list(rep.CLAIMS)
    assert written["summary"]["not measured"] == len(rep.CLAIMS) - 1
    assert "| luo_worked_example | luo §IV-A Example 1 |" in md_path.read_text()


def test_check_accepts_a_differs_only_as_the_registered_known_difference() -> None:
    """_check on the published rows (measured, nothing run) and on those rows altered: a claim with a known
    difference that differs for another reason, or a claim without one that differs, must fail it."""
    table = Path(__file__).resolve().parents[2] / "docs" / "reproduction" / "results.json"
    rows = json.loads(table.read_text())["claims"]

    def fails(name: str, row: dict[str, Any]) -> bool:
        try:
            _check(name, row)
        except AssertionError:
            return True
        return False

    def altered(name: str, change: Any) -> dict[str, Any]:
        row = copy.deepcopy(rows[name])
        change(row)
        return row

    # luo's GRN-RF CBR: known to stay below luo's 80 %; a differs at 0.85 would be something else
    assert not fails("luo_grn_rf_cbr_bank", rows["luo_grn_rf_cbr_bank"])
    assert fails("luo_grn_rf_cbr_bank", altered("luo_grn_rf_cbr_bank", lambda r: r["measured"].update(cbr_grn_rf=0.85)))
    # luo Table III: known as GRN not beating Half; a GRN far below Half whose ordering fails is another difference
    assert not fails("luo_table3_grn_ablation", rows["luo_table3_grn_ablation"])
    beaten = altered("luo_table3_grn_ablation", lambda r: r["measured"].update(grn=0.05))
    assert fails("luo_table3_grn_ablation", beaten)
    # PRIVEE: known as a ratio under 3 at no accuracy cost; a run that lost accuracy is not that
    assert not fails("privee_grn_ratio", rows["privee_grn_ratio"])
    lost = altered("privee_grn_ratio", lambda r: r["per_run"][1]["measured"].update(accuracy_change=-0.2))
    assert fails("privee_grn_ratio", lost)
    # no known difference: any differs fails, and so does a row of another registration (its runs)
    theorem1 = rows["theorem1_ordering"]
    assert not fails("theorem1_ordering", theorem1)
    assert fails("theorem1_ordering", altered("theorem1_ordering", lambda r: r.update(verdict="differs", reason="x")))
    assert fails("theorem1_ordering", altered("theorem1_ordering", lambda r: r.update(runs=2)))
    # a claim of several runs known to vary: all runs reproduced, or at least half; fewer is not the known variation
    ye = {**rep.registered(rep.CLAIMS["ye_masquerade_bank"]), "measured": {}, "details": {}}
    assert not fails("ye_masquerade_bank", ye | {"verdict": "reproduced", "reproduced_runs": rep_claims.YE_RUNS})
    assert not fails("ye_masquerade_bank", ye | {"verdict": "differs", "reproduced_runs": rep_claims.YE_RUNS // 2})
    assert fails("ye_masquerade_bank", ye | {"verdict": "differs", "reproduced_runs": 1})
    # ye_masquerade_log2n, each run judged: differs as known when a run's attacks find the column at ⌈log₂ n⌉ while
    # finding it at m = 1 and drop=binary holds; not when they fail at m = 1 too (the claim could not have failed)
    details = {"majority": {"bank": 0.63}, "drop_binary": {"bank": 0.6}, "drop_random_m1": {"bank": 1.0}}
    found = {"measured": {"bank_log2n": 1.0}, "details": details, "reproduced": False}
    hidden = {"measured": {"bank_log2n": 0.6}, "details": details, "reproduced": True}
    blind = {**found, "details": {**details, "drop_random_m1": {"bank": 0.6}}}
    log2n = {**rep.registered(rep.CLAIMS["ye_masquerade_log2n"]), "measured": {}, "details": {}, "verdict": "differs"}
    assert not fails("ye_masquerade_log2n", log2n | {"reproduced_runs": 1, "per_run": [found, hidden, found]})
    assert fails("ye_masquerade_log2n", log2n | {"reproduced_runs": 1, "per_run": [found, hidden, blind]})
