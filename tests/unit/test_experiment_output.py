"""`experiment` output (issue 31, item 8): a verdict naming the defense that meets the goal (or saying none does),
withhold shown as blocked rather than "—", a rich table for the terminal, results readable as the plots are."""

from __future__ import annotations

import io
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from vflsec.client.experiments import results as exp_results
from vflsec.client.experiments import runner as exp_runner
from vflsec.client.experiments import scenario as exp_scenario


def _row(defense: str, ap: float | None, delta_mp: float | None, *, released: bool = True) -> dict:
    row = {"defense": defense, "values": {}, "score_release": [defense] if released else [], "param_release": [],
           "accuracy": {"mean": 0.9, "std": 0.0}, "baselines": {"half": {"mean": 0.08, "std": 0.0}}, "attacks": {},
           "strongest": None}  # fmt: skip
    if ap is None:
        row["blocked"] = "blocked: nothing released that an attack could use"
    else:
        row |= {"ap": ap, "dcs": exp_results.dcs(ap, delta_mp or 0.0)}
    if delta_mp is not None:
        row["delta_mp"] = delta_mp
    return row


def test_the_verdict_names_the_defenses_that_meet_the_goal_or_says_none_does() -> None:
    none = _row("none", 0.6, None, released=False)
    leaky, costly, free = _row("rounding", 0.5, 0.0), _row("label_only", 0.0, 0.2), _row("withhold", None, 0.0)
    assert exp_results.verdict([none, leaky, costly, free]).endswith("): withhold")
    costs = "these stop every attack at an accuracy cost: label_only (−0.200)"
    assert costs in exp_results.verdict([none, leaky, costly])
    trade_off = f"rounding (DCS {exp_results.dcs(0.5, 0.0):.3f})"
    assert exp_results.verdict([none, leaky]).endswith(
        "every defense leaves an attack better than Half; best trade-off: " + trade_off
    )
    assert exp_results.verdict([none]) == "no defense in this sweep"


def test_the_terminal_table_shows_blocked_rows_and_results_are_readable(tmp_path) -> None:
    summary = {"name": "s", "dataset": "wine", "model": "lr", "backend": "plain", "sweep": {"defense": []},
               "rows": [_row("withhold", None, 0.0)]}  # fmt: skip
    out = io.StringIO()
    Console(file=out, width=200).print(exp_results.summary_table(summary))
    assert "blocked: nothing released" in out.getvalue() and "withhold" in out.getvalue()
    exp_runner.write_atomic(tmp_path / "results.md", "x")
    assert stat.S_IMODE((tmp_path / "results.md").stat().st_mode) == 0o644


# --- the plots: the undefended point on top, withhold drawn (not dropped) -----------------------------------------


def _cell(values: dict, attacks: dict, accuracy: float, score: list[str], param: list[str]) -> dict:
    report = {"attacks": attacks, "accuracy": accuracy, "baselines": {"half": 0.1, "rg": 0.18, "zero": 0.3},
              "score_release": score, "param_release": param}  # fmt: skip
    return {"cell": {"values": values, "repetition": 0}, "report": report}


def _results(scenario: exp_scenario.Scenario, figure: Callable[[str], dict]) -> list[dict]:
    """A report per cell of the scenario: nothing applies under withhold, ``figure(defense)`` under the others."""
    results = []
    for cell in exp_scenario.expand(scenario):
        score, param = exp_scenario.chains(scenario, cell)
        defense = dict(cell.values)["defense"]
        if defense == "withhold":
            attacks = {"gia": {"not_applicable": "no passive block released"}, "pra": {"not_applicable": "none"}}
        else:
            attacks = figure(defense)
        results.append(_cell(dict(cell.values), attacks, 0.9 if defense is None else 0.85, list(score), list(param)))
    return results


def _mse(defense: str | None) -> dict:
    mse = 0.01 if defense is None else 0.06  # the undefended point lies below every defended one
    return {"gia": {"mse": mse, "mse_clipped": mse, "aware": False}}


@pytest.fixture
def which_defense() -> exp_scenario.Scenario:
    return exp_scenario.load_scenario(Path(__file__).parents[2] / "examples" / "which_defense.yaml")


def test_privacy_utility_draws_withhold_at_blind_half_and_the_undefended_point_on_top(
    which_defense: exp_scenario.Scenario, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = exp_results.summarise(which_defense, _results(which_defense, _mse))
    withhold = next(r for r in summary["rows"] if r["defense"] == "defense=withhold")
    assert withhold["blocked"].startswith(exp_results.BLOCKED_NOTE) and withhold["strongest"] is None

    points = exp_results.privacy_utility_points(summary)
    assert len(points) == len(summary["rows"])  # no row dropped
    assert points[-1]["kind"] == "undefended" and points[-1]["label"] == "no defense"  # drawn last, named
    assert (points[-1]["y"], [p["kind"] for p in points].count("undefended")) == (0.01, 1)
    blocked = [p for p in points if p["kind"] == "blocked"]
    assert [(p["defense"], p["y"], p["x"]) for p in blocked] == [("withhold", 0.1, 0.85)]  # at blind Half
    assert exp_results.BLOCKED_NOTE in blocked[0]["label"]

    series = exp_results.axis_series(summary, "defense")[""]
    place = which_defense.sweep["defense"].index("withhold")
    assert series["blocked"] == [{"x": place, "y": 0.1, "defense": "withhold"}]
    assert series["none"] == 0.01 and place not in [p["x"] for p in series["points"]]
    assert len(series["points"]) == len(which_defense.sweep["defense"]) - 1

    figures = {}  # the artists matplotlib was given, kept past plot()'s close
    monkeypatch.setattr("matplotlib.pyplot.close", lambda fig: figures.setdefault(fig.axes[0].get_title(), fig))
    names = {p.name for p in exp_results.plot(summary, tmp_path)}
    assert {"privacy_utility.png", "mse_vs_defense.png"} <= names
    pu = next(f for t, f in figures.items() if t.startswith("privacy–utility")).axes[0]
    by_defense = next(f for t, f in figures.items() if t.startswith("strongest attack vs defense")).axes[0]
    assert "withhold: blocked: nothing released" in [t.get_text() for t in pu.texts]
    assert [t.get_text() for t in by_defense.texts] == ["blocked:\nnothing released"]
    assert by_defense.get_xticklabels()[place].get_text() == "withhold"  # the note sits at withhold's place
    data = [line for line in pu.get_lines() if line.get_marker() not in (None, "None", "")]
    star = next(line for line in data if line.get_marker() == "*")
    assert star.get_zorder() > max(line.get_zorder() for line in data if line is not star)
    assert (star.get_color(), list(star.get_ydata())) == ("black", [0.01])
    assert "no defense" in [t.get_text() for t in pu.get_legend().get_texts()]


def test_plots_of_rows_judged_by_cbr_only_note_withhold(
    which_defense: exp_scenario.Scenario, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trees' attack (pra) is judged by CBR, so no row has an MSE-judged strongest attacker (and their reports carry
    no ``undefended`` block): a defended row is not "blocked" then, and withhold is named in the CBR plot."""

    def cbr(defense: str | None) -> dict:
        value = 0.9 if defense is None else 0.7
        metric = {"name": "cbr", "label": "correct branching rate (luo §VI)", "higher_is_better": True,
                  "value": value, "baseline": {"name": "random_path", "value": 0.5}}  # fmt: skip
        return {"pra": {"mse": 0.05, "mse_clipped": 0.05, "aware": False, "metric": metric}}

    summary = exp_results.summarise(which_defense, _results(which_defense, cbr))
    assert [r["defense"] for r in summary["rows"] if "blocked" in r] == ["defense=withhold"]
    # only withhold has a place there: no MSE-judged attacker elsewhere
    points = exp_results.privacy_utility_points(summary)
    assert [(p["kind"], p["defense"]) for p in points] == [("blocked", "withhold")]
    legends = {}
    monkeypatch.setattr(
        "matplotlib.pyplot.close", lambda fig: legends.setdefault(fig.axes[0].get_title(), fig.axes[0].get_legend())
    )
    names = {p.name for p in exp_results.plot(summary, tmp_path)}
    assert names == {"cbr_vs_defense.png"}
    texts = [t.get_text() for legend in legends.values() for t in legend.get_texts()]
    assert "pra" in texts and "not drawn: withhold (blocked: nothing released, no attack ran)" in texts
