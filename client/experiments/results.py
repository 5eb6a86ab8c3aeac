"""An experiment's summary: per row the accuracy, the MSE mean ± std per attack, the strongest attacker and the
DCS score; results.md, the terminal's table and the PNG plots."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vflsec.client.experiments import harness
from vflsec.client.experiments.labels import is_label_report, label_markdown, summarise_labels
from vflsec.client.experiments.scenario import DEFENSE_AXIS, FIXED_AXES, Cell, Scenario, gradient_chain
from vflsec.client.experiments.stats import MARKERS as _MARKERS
from vflsec.client.experiments.stats import axis_label as _axis_label
from vflsec.client.experiments.stats import cells as _cells
from vflsec.client.experiments.stats import dcs, defense_label, save_plot
from vflsec.client.experiments.stats import pm as _pm
from vflsec.client.experiments.stats import row_group as _group
from vflsec.client.experiments.stats import stat as _stat

# --- summary: tables, DCS, plots ----------------------------------------------------------------------------

DCS_FORMULA = (
    "DCS = 1 / (1 + sqrt((1 − β)·AP² + β·ΔMP²)), β = 0.5; AP = max(0, 1 − MSE_strongest / MSE_Half) (the "
    "strongest attacker's advantage over blind Half: 0 no better, 1 exact); ΔMP = max(0, accuracy of the "
    "undefended row − accuracy of this row)"
)
MSE_UNIT = "MSE per passive feature (features min-max scaled to [0, 1])"
_Y_STRONGEST = "strongest attack's MSE\n(per passive feature, features min-max scaled to [0, 1])"
_Y_ATTACK = "MSE\n(per passive feature, features min-max scaled to [0, 1])"
BLOCKED_NOTE = "blocked: nothing released"  # a defense that leaves no attack anything to work on (withhold)


_Y_METRIC = {
    "mse": _Y_ATTACK,
    "accuracy": "attack accuracy (ye §6.3)\n(fraction of rows recovered, up to complement)",
    "cbr": "correct branching rate (luo §VI)\n(fraction of passive branchings taken as the truth does)",
}
_BASELINE_LABEL = {
    "half": "blind Half baseline",
    "majority": "majority-bit baseline",
    "random_path": "random-path baseline",
}


def summarise(scenario: Scenario, results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Rows (a sweep point, averaged over its repetitions): accuracy, every attack's clipped and raw MSE
    (mean ± std), the blind baselines, the strongest attacker, its ratio to the undefended row and the DCS. A
    passive attacker's cells (label attacks) are summarised apart, as ``label_rows`` (summarise_labels)."""
    every = list(results)
    results = [r for r in every if not is_label_report(r["report"])]
    by_row: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        by_row.setdefault(json.dumps(r["cell"]["values"], sort_keys=False), []).append(r)
    rows = []
    for cells in by_row.values():
        values = cells[0]["cell"]["values"]
        reports = [c["report"] for c in cells]
        attacks: dict[str, Any] = {}
        for name in reports[0]["attacks"]:
            metrics = [_own_metric(rep, name) for rep in reports]
            ran = [(rep["attacks"][name], m) for rep, m in zip(reports, metrics, strict=True) if m is not None]
            if len(ran) == len(reports):
                first = ran[0][1]
                attacks[name] = {
                    "metric": first["name"],
                    "label": first["label"],
                    "higher_is_better": first["higher_is_better"],
                    "value": _stat([m["value"] for _, m in ran]),
                    "baseline": {
                        "name": first["baseline"]["name"],
                        "value": _stat([m["baseline"]["value"] for _, m in ran]),
                    },
                    "mse_clipped": _stat([a["mse_clipped"] for a, _ in ran]),
                    "mse": _stat([a["mse"] for a, _ in ran]),
                    "aware": ran[0][0]["aware"],
                }
            else:
                reason = next(
                    (rep["attacks"][name].get("not_applicable") for rep in reports if name in rep["attacks"]), None
                )
                reason = reason or next((m.get("not_applicable") for m in metrics if m), None)
                attacks[name] = {"not_applicable": reason or f"ran in {len(ran)} of {len(reports)} repetitions"}
        # The strongest attacker and the DCS compare MSEs: attacks judged by another figure stand beside them.
        ran = {n: a for n, a in attacks.items() if a.get("metric") == "mse"}
        best = min(ran, key=lambda n: ran[n]["mse_clipped"]["mean"]) if ran else None
        rows.append(
            {
                "values": values,
                "defense": defense_label(values, [*reports[0]["score_release"], *reports[0]["param_release"]]),
                "score_release": reports[0]["score_release"],
                "param_release": reports[0]["param_release"],
                "gradient_defense": list(gradient_chain(scenario, Cell(tuple(values.items()), 0))),
                "repetitions": len(reports),
                "accuracy": _stat([rep["accuracy"] for rep in reports]),
                "baselines": {b: _stat([rep["baselines"][b] for rep in reports]) for b in reports[0]["baselines"]},
                "attacks": attacks,
                "strongest": None
                if best is None
                else {"attack": best, "aware": ran[best]["aware"], "mse": ran[best]["mse_clipped"]["mean"]},
            }
        )
    for row in rows:
        reference = _undefended(row, rows)
        half = row["baselines"]["half"]["mean"]
        if row["strongest"] is None:  # no MSE-judged attack ran: another figure (CBR, ye's accuracy), or none at all
            nothing_ran = all("not_applicable" in a for a in row["attacks"].values())
            if nothing_ran and (row["score_release"] or row["param_release"]):  # nothing released to work on
                row["blocked"] = f"{BLOCKED_NOTE} that an attack could use"
                if reference is not None:
                    row["delta_mp"] = max(0.0, reference["accuracy"]["mean"] - row["accuracy"]["mean"])
            continue
        ap = max(0.0, 1.0 - row["strongest"]["mse"] / half)
        row["ap"] = ap
        if reference is not None and reference["strongest"] is not None:
            row["ratio_to_undefended"] = row["strongest"]["mse"] / reference["strongest"]["mse"]
            row["delta_mp"] = max(0.0, reference["accuracy"]["mean"] - row["accuracy"]["mean"])
            row["dcs"] = dcs(ap, row["delta_mp"])
    return {
        "name": scenario.name,
        "dataset": scenario.spec.name,
        "model": scenario.model,
        "backend": scenario.spec.backend,
        "sweep": scenario.sweep,
        "repetitions": scenario.repetitions,
        "predictions": scenario.predictions,
        "dcs_formula": DCS_FORMULA,
        "mse_unit": MSE_UNIT,
        "rows": rows,
        "verdict": verdict(rows),
        "cells": every,
        "scenario": scenario.source,
    } | summarise_labels(scenario, [r for r in every if is_label_report(r["report"])], rows)


# A defense "stops every attack" when the strongest attacker's advantage over Half is at most this (the attack
# command's verdict uses the same margin), "at no accuracy cost" when it loses at most this much accuracy.
STOPS_AP, FREE_DMP = harness.LEAK_MARGIN, 0.01


def verdict(rows: Sequence[dict[str, Any]]) -> str:
    """One line naming the defenses that stop every attack at no accuracy cost, or saying that none does."""
    defended = [r for r in rows if not _undefended_row(r)]
    if not defended:
        return "no defense in this sweep"
    stops = [r for r in defended if "blocked" in r or r.get("ap", 1.0) <= STOPS_AP]
    free = [r for r in stops if r.get("delta_mp", 0.0) <= FREE_DMP]
    rule = f"strongest attacker's advantage over Half ≤ {STOPS_AP:g}, accuracy cost ≤ {FREE_DMP:g}"
    if free:
        return f"meets the goal ({rule}): {', '.join(r['defense'] for r in free)}"
    if stops:
        cost = ", ".join(f"{r['defense']} (−{r.get('delta_mp', 0.0):.3f})" for r in stops)
        return f"none meets the goal ({rule}); these stop every attack at an accuracy cost: {cost}"
    scored = [r for r in defended if "dcs" in r]
    best = max(scored, key=lambda r: r["dcs"]) if scored else None
    tail = f"; best trade-off: {best['defense']} (DCS {best['dcs']:.3f})" if best else ""
    return f"none meets the goal ({rule}): every defense leaves an attack better than Half{tail}"


def _own_metric(report: dict[str, Any], name: str) -> dict[str, Any] | None:
    """One attack's own figure in one cell's report (harness.own_metric); a cell written before attacks carried it
    is read as MSE against Half. None: the attack did not run, or its figure has no value here."""
    result = report["attacks"].get(name, {})
    if "mse_clipped" not in result:
        return None
    label, higher, baseline = harness.METRICS["mse"]
    metric = result.get("metric") or {"name": "mse", "label": label, "higher_is_better": higher,
                                      "value": result["mse_clipped"],
                                      "baseline": {"name": baseline, "value": report["baselines"]["half"]}}  # fmt: skip
    return None if metric["value"] is None else metric


def _undefended(row: dict[str, Any], rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The row without any defense at the same fixed-axis point (passive fraction), if the sweep has one."""
    fixed = {a: v for a, v in row["values"].items() if a in FIXED_AXES}
    for other in rows:
        if _undefended_row(other) and {a: v for a, v in other["values"].items() if a in FIXED_AXES} == fixed:
            return other
    return None


def markdown(summary: dict[str, Any]) -> str:
    title = f"# {summary['name']}: {summary['dataset']}, {summary['model']}, backend {summary['backend']}"
    labels = label_markdown(summary)  # a passive attacker's rows, if any
    if labels and not summary["rows"]:
        return f"{title}\n\n{labels}"
    fixed = [a for a in summary["sweep"] if a in FIXED_AXES]
    lines = [
        title,
        "",
        f"{summary['repetitions']} repetition(s) per row (mean ± std), {summary['predictions']} queried samples; "
        f"MSE: {summary['mse_unit']}, clipped to the cube (raw MSE in results.json). Strongest: the attack "
        "(naive or defense-aware) judged by MSE with the lowest mean MSE. Ratio: strongest MSE / the undefended row's.",
        "",
        f"{summary['dcs_formula']}.",
        "",
        *([f"Verdict: {summary['verdict']}.", ""] if "verdict" in summary else []),
        "| defense | " + "".join(f"{a} | " for a in fixed) + "accuracy | Half | RG | zero | strongest | "
        "MSE strongest | ratio to none | AP | ΔMP | DCS |",
        "|---|" + "---|" * (len(fixed) + 10),
    ]
    for row in summary["rows"]:
        best = row["strongest"]
        aware = " (aware)" if best is not None and best["aware"] else ""
        strongest_name = row.get("blocked", "—") if best is None else best["attack"] + aware
        mse = "—" if best is None else _pm(row["attacks"][best["attack"]]["mse_clipped"])
        ratio, ap, dmp, score = _cells(row, "ratio_to_undefended", "ap", "delta_mp", "dcs")
        lines.append(
            f"| {row['defense']} | "
            + "".join(f"{row['values'].get(a)} | " for a in fixed)
            + f"{_pm(row['accuracy'])} | {_pm(row['baselines']['half'])} | {_pm(row['baselines']['rg'])} | "
            f"{_pm(row['baselines']['zero'])} | {strongest_name} | {mse} | {ratio} | "
            f"{ap} | {dmp} | {score} |"
        )
    lines += [
        "",
        "## Every attack per row (mean ± std)",
        "",
        "Each attack by its own figure, beside the blind baseline that figure must beat: MSE (lower is better) "
        "against Half; ye's attack accuracy (higher is better; per binary passive column the best found vector, "
        "up to complement) against the majority bit; luo's correct branching rate (higher is better) against a "
        "random path. Every attack's clipped and raw MSE stand beside it.",
        "",
    ]
    for row in summary["rows"]:
        point = ", ".join(f"{a}={v}" for a, v in row["values"].items() if a in FIXED_AXES)
        lines += [f"### {row['defense']}" + (f" ({point})" if point else ""), ""]
        lines += ["| attack | metric | value | blind baseline | MSE | raw MSE |", "|---|---|---|---|---|---|"]
        for name, a in row["attacks"].items():
            label = name + (" (aware)" if a.get("aware") else "")
            if "not_applicable" in a:
                lines.append(f"| {label} | | not applicable: {a['not_applicable']} | | | |")
            else:
                better = "higher" if a["higher_is_better"] else "lower"
                lines.append(
                    f"| {label} | {a['label']} ({better} is better) | {_pm(a['value'])} | "
                    f"{a['baseline']['name']} {_pm(a['baseline']['value'])} | {_pm(a['mse_clipped'])} | "
                    f"{_pm(a['mse'])} |"
                )
        lines.append("")
    return "\n".join(lines) + (f"\n\n{labels}" if labels else "")


def summary_table(summary: dict[str, Any]) -> Any:
    """The headline table of results.md as a rich Table for the terminal (markdown wraps mid-row)."""
    from rich.table import Table

    fixed = [a for a in summary["sweep"] if a in FIXED_AXES]
    table = Table(title=f"{summary['name']}: {summary['dataset']}, {summary['model']}, {summary['backend']}")
    for column in ("defense", *fixed, "accuracy", "Half", "strongest", "MSE strongest", "ratio", "AP", "ΔMP", "DCS"):
        table.add_column(column, overflow="fold")
    for row in summary["rows"]:
        best = row["strongest"]
        name = row.get("blocked", "—") if best is None else best["attack"] + (" (aware)" if best["aware"] else "")
        mse = "—" if best is None else _pm(row["attacks"][best["attack"]]["mse_clipped"])
        nums = _cells(row, "ratio_to_undefended", "ap", "delta_mp", "dcs")
        table.add_row(row["defense"], *(str(row["values"].get(a)) for a in fixed), _pm(row["accuracy"]),
                      _pm(row["baselines"]["half"]), name, mse, *nums)  # fmt: skip
    return table


def _undefended_row(row: dict[str, Any]) -> bool:
    return not row["score_release"] and not row["param_release"] and not row.get("gradient_defense")


def _short(defense: str) -> str:
    """A row's defense as the plots' notes name it: "withhold", not "defense=withhold"."""
    return defense.removeprefix(f"{DEFENSE_AXIS}=")


def privacy_utility_points(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The points of privacy_utility.png in drawing order: defended rows, then rows whose defense blocks every
    attack, drawn at their split's blind Half baseline (nothing is released, so the attacker can only guess
    blindly), then the undefended rows last, so that they are drawn on top of the others."""
    fixed = [a for a in summary["sweep"] if a in FIXED_AXES]
    points: dict[str, list[dict[str, Any]]] = {"defended": [], "blocked": [], "undefended": []}
    for row in summary["rows"]:
        group = _group(row, fixed)
        suffix = f" ({group})" if group else ""
        point = {"defense": _short(row["defense"]), "group": group, "x": row["accuracy"]["mean"],
                 "xerr": row["accuracy"]["std"]}  # fmt: skip
        if "blocked" in row:
            label = f"{_short(row['defense'])}: {BLOCKED_NOTE} (at blind Half){suffix}"
            y = row["baselines"]["half"]["mean"]
            points["blocked"].append(point | {"kind": "blocked", "y": y, "yerr": 0.0, "label": label})
        elif row["strongest"] is not None:
            kind = "undefended" if _undefended_row(row) else "defended"
            s = row["attacks"][row["strongest"]["attack"]]["mse_clipped"]
            label = f"no defense{suffix}" if kind == "undefended" else f"{row['defense']}{suffix}"
            points[kind].append(point | {"kind": kind, "y": s["mean"], "yerr": s["std"], "label": label})
    return [*points["defended"], *points["blocked"], *points["undefended"]]


# How privacy_utility.png draws each kind of point: the undefended one on top, large and black.
_POINT_STYLE = {
    "defended": {"fmt": "o", "markersize": 6, "zorder": 2},
    "blocked": {"fmt": "X", "markersize": 10, "color": "dimgrey", "markeredgecolor": "white", "zorder": 3},
    "undefended": {"fmt": "*", "markersize": 16, "color": "black", "markeredgecolor": "white", "zorder": 5},
}


def axis_series(summary: dict[str, Any], axis: str) -> dict[str, dict[str, Any]]:
    """Per fixed-axis point, what mse_vs_<axis>.png draws: the strongest attacker's MSE at each value of ``axis``
    (``points``: x, mean, std), the rows that block every attack at their value (``blocked``: x, the blind Half),
    the undefended row's strongest MSE (``none``, or None) and the blind Half baseline (``half``). x is the value
    of a numeric axis, else the value's place in the sweep (categories keep the file's order)."""
    fixed = [a for a in summary["sweep"] if a in FIXED_AXES]
    numeric = all(isinstance(v, int | float) for v in summary["sweep"][axis])
    series: dict[str, dict[str, Any]] = {}
    for row in summary["rows"]:
        group = series.setdefault(_group(row, fixed), {"points": [], "blocked": [], "none": None, "half": None})
        group["half"] = group["half"] if group["half"] is not None else row["baselines"]["half"]["mean"]
        value = row["values"].get(axis)
        if value is None:  # the undefended row of a swept parameter: a level, not a point on the axis
            if _undefended_row(row) and row["strongest"] is not None:
                group["none"] = row["attacks"][row["strongest"]["attack"]]["mse_clipped"]["mean"]
            continue
        x = value if numeric else summary["sweep"][axis].index(value)
        if "blocked" in row:
            group["blocked"].append({"x": x, "y": row["baselines"]["half"]["mean"], "defense": _short(row["defense"])})
        elif row["strongest"] is not None:
            s = row["attacks"][row["strongest"]["attack"]]["mse_clipped"]
            group["points"].append({"x": x, "mean": s["mean"], "std": s["std"]})
    for group in series.values():
        if numeric:
            group["points"].sort(key=lambda p: p["x"])
    return {g: s for g, s in series.items() if s["points"] or s["blocked"]}


def plot(summary: dict[str, Any], out: Path) -> list[Path]:
    """Privacy–utility (strongest MSE vs accuracy), strongest MSE vs each release axis, MSE per attack vs the
    passive fraction; every axis labelled with its unit, every figure with a legend. A defense that blocks every
    attack is drawn at the blind Half baseline and annotated; the undefended point is drawn on top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in summary["rows"] if r["strongest"] is not None]  # the MSE figures' rows
    written: list[Path] = []
    if not summary["rows"]:
        return written
    title = f"{summary['name']} ({summary['dataset']}, {summary['backend']})"

    def save(fig: Any, ax: Any, name: str) -> None:
        written.append(save_plot(fig, ax, out / name))

    fixed = [a for a in summary["sweep"] if a in FIXED_AXES]
    all_groups: dict[str, list[dict[str, Any]]] = {}
    for row in summary["rows"]:
        all_groups.setdefault(_group(row, fixed), []).append(row)

    if rows:
        fig, ax = plt.subplots(figsize=(9.0, 4.6))
        halves: dict[str, float] = {}
        for point in privacy_utility_points(summary):
            halves.setdefault(point["group"], all_groups[point["group"]][0]["baselines"]["half"]["mean"])
            ax.errorbar(point["x"], point["y"], xerr=point["xerr"], yerr=point["yerr"], capsize=3,
                        label=point["label"], **_POINT_STYLE[point["kind"]])  # fmt: skip
            if point["kind"] != "defended":
                note = "no defense" if point["kind"] == "undefended" else f"{point['defense']}: {BLOCKED_NOTE}"
                ax.annotate(note, (point["x"], point["y"]), xytext=(6, 6), textcoords="offset points", fontsize=7,
                            zorder=6)  # fmt: skip
        for i, (group, half) in enumerate(halves.items()):  # Half depends on the passive columns: a line per split
            label = "blind Half baseline" + (f" ({group})" if group else "")
            ax.axhline(half, color="grey", linestyle=("--", "-.", ":")[i % 3], label=label, zorder=1)
        ax.set_xlabel("accuracy on the queried samples (fraction correct)")
        ax.set_ylabel(_Y_STRONGEST, fontsize=8)
        ax.set_title(f"privacy–utility: {title}", fontsize=9)
        save(fig, ax, "privacy_utility.png")

    for axis in (a for a in summary["sweep"] if a not in FIXED_AXES and rows):
        fig, ax = plt.subplots(figsize=(9.0, 4.6))
        values = summary["sweep"][axis]
        numeric = all(isinstance(v, int | float) for v in values)
        for i, (group, series) in enumerate(axis_series(summary, axis).items()):
            color, suffix = f"C{i}", f" ({group})" if group else ""
            points = series["points"]
            if points:
                ax.errorbar([p["x"] for p in points], [p["mean"] for p in points], capsize=3, color=color,
                            yerr=[p["std"] for p in points], marker="o", label=f"strongest attack{suffix}",
                            linestyle="-" if numeric else "none")  # categories: no line between them  # fmt: skip
            for j, b in enumerate(series["blocked"]):  # no MSE to draw: the attacker is left with a blind guess
                ax.plot(b["x"], b["y"], "X", color=color, markersize=10, zorder=4,
                        label=f"{BLOCKED_NOTE} (at blind Half){suffix}" if j == 0 else None)  # fmt: skip
                ax.annotate(BLOCKED_NOTE.replace(": ", ":\n"), (b["x"], b["y"]), xytext=(0, -9),
                            textcoords="offset points", fontsize=7, ha="center", va="top")  # fmt: skip
            if series["none"] is not None:
                ax.axhline(series["none"], linestyle=":", color=color, label=f"no defense{suffix}")
            ax.axhline(series["half"], color=color, linestyle="--", alpha=0.6, label=f"blind Half baseline{suffix}")
        ax.set_xlabel(_axis_label(axis))
        if numeric and min(values) > 0 and max(values) / min(values) > 20:
            ax.set_xscale("log")
        if numeric:
            ax.set_xticks(sorted(values), [str(v) for v in sorted(values)])
        else:
            ax.set_xticks(range(len(values)), [str(v) for v in values], rotation=25, ha="right", fontsize=8)
            ax.set_xlim(-0.5, len(values) - 0.5)
        ax.set_ylabel(_Y_STRONGEST, fontsize=8)
        ax.set_title(f"strongest attack vs {axis}: {title}", fontsize=9)
        save(fig, ax, f"mse_vs_{axis.replace('.', '_')}.png")

    def per_attack(members: list[dict[str, Any]], axis: str, metric: str, xlabel: str, name: str, what: str) -> None:
        """Every attack judged by ``metric`` against ``axis`` over ``members`` (one row per x), with the baseline.
        Rows that block every attack have no figure (nor a baseline: no attack ran); the legend names them."""
        blocked = [_short(r["defense"]) for r in members if "blocked" in r]
        members = [r for r in members if "blocked" not in r]
        if not members:
            return
        attacks = [n for n in members[0]["attacks"] if all(r["attacks"].get(n, {}).get("metric") == metric
                                                           for r in members)]  # fmt: skip
        if not attacks:
            return
        numeric = all(isinstance(r["values"][axis], int | float) for r in members)
        xs = [r["values"][axis] if numeric else str(r["values"][axis]) for r in members]
        fig, ax = plt.subplots(figsize=(9.0, 4.6))
        for i, attack in enumerate(attacks):  # distinct markers and dashes: attacks that tie stay visible
            stats = [r["attacks"][attack]["value"] for r in members]
            ax.errorbar(xs, [s["mean"] for s in stats], yerr=[s["std"] for s in stats], capsize=2, label=attack,
                        marker=_MARKERS[i % len(_MARKERS)], markersize=8 - 0.4 * i, alpha=0.8,
                        linestyle=("-", "--", "-.", ":")[i % 4] if numeric else "none")  # fmt: skip
        baseline = members[0]["attacks"][attacks[0]]["baseline"]["name"]
        ax.plot(xs, [r["attacks"][attacks[0]]["baseline"]["value"]["mean"] for r in members], "k--",
                label=_BASELINE_LABEL[baseline])  # fmt: skip
        if blocked:  # a legend entry without a line: the note sits beside the legend, over no data
            ax.plot([], [], " ", label=f"not drawn: {', '.join(blocked)} ({BLOCKED_NOTE}, no attack ran)")
        if numeric:
            ax.set_xticks(sorted(set(xs)), [str(x) for x in sorted(set(xs))])
        else:
            plt.setp(ax.get_xticklabels(), rotation=25, ha="right", fontsize=8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(_Y_METRIC[metric], fontsize=8)
        ax.set_title(f"{harness.METRICS[metric][0]} per attack vs {axis}{what}: {title}", fontsize=8)
        save(fig, ax, name)

    metrics = sorted({a["metric"] for r in summary["rows"] for a in r["attacks"].values() if "metric" in a})
    for axis in (a for a in summary["sweep"] if a not in FIXED_AXES):  # MSE's is the strongest-attack plot above
        for metric in (m for m in metrics if m != "mse"):
            for group, members in all_groups.items():
                swept = [r for r in members if r["values"].get(axis) is not None]
                if all(isinstance(r["values"][axis], int | float) for r in swept):
                    swept.sort(key=lambda r: r["values"][axis])
                suffix = f" ({group})" if group else ""
                tag = re.sub(r"[^A-Za-z0-9]+", "_", f"{axis}_{group}".strip("_"))
                per_attack(swept, axis, metric, _axis_label(axis), f"{metric}_vs_{tag}.png", suffix)

    if "passive_fraction" in summary["sweep"]:
        defenses: dict[str, list[dict[str, Any]]] = {}
        for row in summary["rows"]:
            defenses.setdefault(row["defense"], []).append(row)
        for defense, members in defenses.items():
            members.sort(key=lambda r: r["values"]["passive_fraction"])
            tag = re.sub(r"[^A-Za-z0-9]+", "_", defense)
            for metric in metrics:
                per_attack(members, "passive_fraction", metric,
                           "passive fraction (share of feature columns held by the passive parties)",
                           f"{metric}_vs_passive_fraction_{tag}.png", f", defense {defense}")  # fmt: skip
    return written
