"""`experiment` output (issue 31, item 8): a verdict naming the defense that meets the goal (or saying none does),
withhold shown as blocked rather than "—", a rich table for the terminal, results readable as the plots are."""

from __future__ import annotations

import io
import stat

from rich.console import Console

from vflsec.client import experiment as exp


def _row(defense: str, ap: float | None, delta_mp: float | None, *, released: bool = True) -> dict:
    row = {"defense": defense, "values": {}, "score_release": [defense] if released else [], "param_release": [],
           "accuracy": {"mean": 0.9, "std": 0.0}, "baselines": {"half": {"mean": 0.08, "std": 0.0}}, "attacks": {},
           "strongest": None}  # fmt: skip
    if ap is None:
        row["blocked"] = "blocked: nothing released that an attack could use"
    else:
        row |= {"ap": ap, "dcs": exp.dcs(ap, delta_mp or 0.0)}
    if delta_mp is not None:
        row["delta_mp"] = delta_mp
    return row


def test_the_verdict_names_the_defenses_that_meet_the_goal_or_says_none_does() -> None:
    none = _row("none", 0.6, None, released=False)
    leaky, costly, free = _row("rounding", 0.5, 0.0), _row("label_only", 0.0, 0.2), _row("withhold", None, 0.0)
    assert exp.verdict([none, leaky, costly, free]).endswith("): withhold")
    assert "these stop every attack at an accuracy cost: label_only (−0.200)" in exp.verdict([none, leaky, costly])
    assert exp.verdict([none, leaky]).endswith("every defense leaves an attack better than Half; best trade-off: "
                                               f"rounding (DCS {exp.dcs(0.5, 0.0):.3f})")  # fmt: skip
    assert exp.verdict([none]) == "no defense in this sweep"


def test_the_terminal_table_shows_blocked_rows_and_results_are_readable(tmp_path) -> None:
    summary = {"name": "s", "dataset": "wine", "model": "lr", "backend": "plain", "sweep": {"defense": []},
               "rows": [_row("withhold", None, 0.0)]}  # fmt: skip
    out = io.StringIO()
    Console(file=out, width=200).print(exp.summary_table(summary))
    assert "blocked: nothing released" in out.getvalue() and "withhold" in out.getvalue()
    exp.write_atomic(tmp_path / "results.md", "x")
    assert stat.S_IMODE((tmp_path / "results.md").stat().st_mode) == 0o644
