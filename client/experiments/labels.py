"""A passive attacker's rows of an experiment (issue 29): the label attacks a curious passive party runs on the
gradients it receives in training, per training defense, summarised as the feature rows are (results.py adds them to
its summary): accuracy, the strongest attacker against its blind baseline, the naive ones beside it, the advantage AP,
the accuracy lost ΔMP and VFLAIR's DCS; a results.md section, a terminal table and plots.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vflsec.client.experiments import harness
from vflsec.client.experiments.runs import LABEL_AWARE_ATTACKS
from vflsec.client.experiments.scenario import (
    ATTACKER_AXIS,
    FIXED_AXES,
    TRAINING_DEFENSE_AXIS,
    Cell,
    Scenario,
    gradient_chain,
)
from vflsec.client.experiments.stats import (
    MARKERS,
    axis_label,
    cells,
    dcs,
    defense_label,
    pm,
    row_group,
    save_plot,
    stat,
)

LABEL_DCS_FORMULA = (
    "DCS = 1 / (1 + sqrt((1 − β)·AP² + β·ΔMP²)), β = 0.5; AP = max(0, (F − B) / (1 − B)), the strongest label "
    "attacker's advantage over blind (0 no better, 1 exact): binary labels F = its AUC taken either way round, "
    "max(AUC, 1 − AUC), B = 0.5, so AP = max(0, (AUC − 0.5) / 0.5); more classes F = its accuracy, B = the majority "
    "rate of the rows it is scored on; ΔMP = max(0, accuracy of the undefended row − accuracy of this row)"
)
# An attack given k labelled rows (model completion) reads the party's own trained bottom, not the gradients.
KINDS = {"naive": "naive", "aware": "defense-aware", "labelled": "labelled rows"}


def label_advantage(figure: float, blind: float) -> float:
    """The attacker's advantage over blind, max(0, (figure − blind) / (1 − blind)): an AUC (taken either way round)
    against 0.5, or an accuracy against the majority rate."""
    return max(0.0, (figure - blind) / (1.0 - blind)) if blind < 1.0 else 0.0


def _kind(name: str, result: dict[str, Any]) -> str:
    if "labelled_rows" in result:
        return "labelled"
    return "aware" if name in LABEL_AWARE_ATTACKS else "naive"


def _attack_stats(name: str, reports: Sequence[dict[str, Any]], binary: bool) -> dict[str, Any]:
    """One label attack over a row's repetitions: its figure, either way round (binary), its blind baseline and
    advantage; or why it did not run."""
    figure = "auc" if binary else "accuracy"
    ran = [(rep, rep["attacks"][name]) for rep in reports if figure in rep["attacks"].get(name, {})]
    if len(ran) < len(reports):
        reason = next((rep["attacks"].get(name, {}).get("not_applicable") for rep in reports), None)
        return {"not_applicable": reason or f"ran in {len(ran)} of {len(reports)} repetitions"}
    values = [a[figure] for _, a in ran]
    either = [max(v, 1.0 - v) for v in values] if binary else values
    # blind: AUC 0.5; for more classes the majority rate of the rows the attack is scored on (its own, if given rows)
    blind = [0.5 if binary else a.get("majority_rate", rep["baselines"]["majority_rate"]) for rep, a in ran]
    first = ran[0][1]
    stats: dict[str, Any] = {
        "metric": figure,
        "label": "AUC" if binary else "accuracy",
        "kind": _kind(name, first),
        "value": stat(values),
        "either_way": stat(either),
        "baseline": {"name": "blind AUC" if binary else "majority rate", "value": stat(blind)},
    }
    stats["advantage"] = label_advantage(stats["either_way"]["mean"], stats["baseline"]["value"]["mean"])
    if "labelled_rows" in first:
        stats["labelled_rows"] = first["labelled_rows"]
    return stats


def _best(attacks: dict[str, dict[str, Any]], kinds: Sequence[str]) -> dict[str, Any] | None:
    """The attack of these kinds with the largest advantage over blind (ties: the first), or None if none ran."""
    ran = {n: a for n, a in attacks.items() if a.get("kind") in kinds}
    if not ran:
        return None
    name = max(ran, key=lambda n: ran[n]["advantage"])
    a = ran[name]
    best = {"attack": name, "kind": a["kind"], "value": a["value"]["mean"], "either_way": a["either_way"]["mean"],
            "advantage": a["advantage"]}  # fmt: skip
    return best | ({"labelled_rows": a["labelled_rows"]} if "labelled_rows" in a else {})


def label_row(scenario: Scenario, cells: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A sweep point's label cells averaged over their repetitions: accuracy, every label attack, the strongest (naive,
    defense-aware and model completion alike: Kerckhoffs), the best of each kind and the best gradient attack."""
    values = cells[0]["cell"]["values"]
    reports = [c["report"] for c in cells]
    binary = reports[0]["n_classes"] == 2
    attacks = {name: _attack_stats(name, reports, binary) for name in reports[0]["attacks"]}
    chain = list(gradient_chain(scenario, Cell(tuple(values.items()), 0)))
    return {
        "values": values,
        "defense": defense_label(values, chain),
        "attacker": reports[0]["attacker"],
        "gradient_defense": chain,
        "repetitions": len(reports),
        "n_classes": reports[0]["n_classes"],
        "metric": "auc" if binary else "accuracy",
        "accuracy": stat([rep["accuracy"] for rep in reports]),
        "majority_rate": stat([rep["majority_rate"] for rep in reports]),  # of the queried rows
        "blind": stat([rep["baselines"]["auc" if binary else "majority_rate"] for rep in reports]),
        "n_samples": reports[0]["n_samples"],
        "attacks": attacks,
        "strongest": _best(attacks, list(KINDS)),
        "strongest_naive": _best(attacks, ["naive"]),
        "strongest_aware": _best(attacks, ["aware"]),
        "strongest_gradient": _best(attacks, ["naive", "aware"]),  # what a gradient defense can stop
        "completion": _best(attacks, ["labelled"]),  # what remains when it does
    }


def summarise_labels(
    scenario: Scenario, results: Sequence[dict[str, Any]], feature_rows: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """The summary's keys for a passive attacker's cells (none without them): ``label_rows`` with AP, ΔMP and the DCS
    against the undefended row of the same attacker and passive fraction, the formula and a verdict (also the
    summary's ``verdict`` when every row is a label row)."""
    if not results:
        return {}
    by_row: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        by_row.setdefault(json.dumps(r["cell"]["values"], sort_keys=False), []).append(r)
    rows = [label_row(scenario, cells) for cells in by_row.values()]
    for row in rows:
        if row["strongest"] is not None:
            row["ap"] = row["strongest"]["advantage"]
        reference = _reference(row, rows)
        if reference is None:
            continue
        row["delta_mp"] = max(0.0, reference["accuracy"]["mean"] - row["accuracy"]["mean"])
        row["accuracy_cost"] = reference["accuracy"]["mean"] - row["accuracy"]["mean"]  # signed, as `attack` reports
        if "ap" in row:
            row["dcs"] = dcs(row["ap"], row["delta_mp"])
        gradient = row["strongest_gradient"]
        if row["n_classes"] == 2 and gradient is not None and row["gradient_defense"]:
            row["meets_goal"] = bool(
                gradient["either_way"] <= harness.MAX_AUC_GOAL and row["accuracy_cost"] <= harness.MAX_COST_GOAL
            )
        row["above_majority"] = row["accuracy"]["mean"] - row["majority_rate"]["mean"]
    out: dict[str, Any] = {
        "label_rows": rows,
        "label_dcs_formula": LABEL_DCS_FORMULA,
        "label_verdict": label_verdict(rows),
        "label_remaining": harness.REMAINING_NOTE,
    }
    if not feature_rows:
        out["verdict"] = out["label_verdict"]
    return out


def _reference(row: dict[str, Any], rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The undefended label row of the same attacker and fixed-axis point, if the sweep has one."""
    fixed = {a: v for a, v in row["values"].items() if a in FIXED_AXES}
    for other in rows:
        same = {a: v for a, v in other["values"].items() if a in FIXED_AXES} == fixed
        if same and not other["gradient_defense"] and other["attacker"] == row["attacker"]:
            return other
    return None


def label_verdict(rows: Sequence[dict[str, Any]]) -> str:
    """One line on issue 29's goal (every gradient attack ≤ 0.6 AUC either way at ≤ 2 pp accuracy cost): the training
    defenses that meet it, with what model completion still reads; else the best trade-off by DCS."""
    defended = [r for r in rows if r["gradient_defense"]]
    if not defended:
        return "no training defense in this sweep"
    rule = (
        f"every gradient label attack ≤ {harness.MAX_AUC_GOAL} AUC either way, accuracy cost ≤ "
        f"{harness.MAX_COST_GOAL * 100:.0f} pp"
    )

    def remains(r: dict[str, Any]) -> str:
        c = r["completion"]
        trivial = " (model at or below the majority rate)" if r["above_majority"] <= 0.0 else ""
        tail = "" if c is None else f"; completion with {c['labelled_rows']} labelled rows {c['value']:.3f}"
        return f"{r['defense']} (strongest gradient attack {r['strongest_gradient']['either_way']:.3f}{tail}){trivial}"

    met = [r for r in defended if r.get("meets_goal")]
    if met:
        return f"meets the goal ({rule}): " + "; ".join(remains(r) for r in met)
    scored = [r for r in defended if "dcs" in r]
    best = max(scored, key=lambda r: r["dcs"]) if scored else None
    tail = f"; best trade-off: {best['defense']} (DCS {best['dcs']:.3f})" if best else ""
    return f"none meets the goal ({rule}){tail}"


def is_label_report(report: dict[str, Any]) -> bool:
    """A passive attacker's cell report (label attacks), not the active party's (feature attacks)."""
    return report.get("attacker", "active") != "active"


# --- results.md, the terminal ----------------------------------------------------------------------------------


def _fig(best: dict[str, Any] | None, key: str = "either_way") -> str:
    if best is None:
        return "—"
    given = f", k = {best['labelled_rows']}" if "labelled_rows" in best else ""
    return f"{best['attack']} {best[key]:.4g}{given}"


def label_markdown(summary: dict[str, Any]) -> str:
    """results.md's section for the label rows: the headline table, then every attack per row."""
    rows = summary.get("label_rows", [])
    if not rows:
        return ""
    binary = rows[0]["n_classes"] == 2
    figure = "AUC either way" if binary else "accuracy"
    fixed = [a for a in summary["sweep"] if a in FIXED_AXES and a != ATTACKER_AXIS]
    lines = [
        "## Label inference by a curious passive party",
        "",
        f"{rows[0]['repetitions']} repetition(s) per row (mean ± std). The passive party's label attacks read the "
        "gradients it receives in training; each is scored on every training row the party holds (model completion on "
        "those it was not given). "
        + (
            "AUC either way = max(AUC, 1 − AUC): an AUC below 0.5 is the same leak read upside down; blind is 0.5. "
            if binary
            else "Blind is the majority rate. "
        )
        + "Strongest: the attack with the largest advantage over blind among every one that ran — naive, "
        "defense-aware (Kerckhoffs: `axis_projection`, `noise_residual` know the defense) and model completion with k "
        "labelled rows (`completion`) alike. Accuracy: the main task's, on the queried rows.",
        "",
        f"{summary['label_dcs_formula']}.",
        "",
        f"Verdict: {summary['label_verdict']}.",
        "",
        f"{summary['label_remaining'][:1].upper()}{summary['label_remaining'][1:]}.",
        "",
        "| training defense | attacker | " + "".join(f"{a} | " for a in fixed) + "accuracy | majority (queried) | "
        f"strongest ({figure}) | blind | best naive | best defense-aware | completion | strongest gradient attack | "
        "AP | ΔMP | DCS |",
        "|---|---|" + "---|" * (len(fixed) + 11),
    ]
    for row in rows:
        ap, dmp, score = cells(row, "ap", "delta_mp", "dcs")
        lines.append(
            f"| {row['defense']} | {row['attacker']} | "
            + "".join(f"{row['values'].get(a)} | " for a in fixed)
            + f"{pm(row['accuracy'])} | {row['majority_rate']['mean']:.4g} | {_fig(row['strongest'])} | "
            f"{row['blind']['mean']:.4g} | {_fig(row['strongest_naive'])} | {_fig(row['strongest_aware'])} | "
            f"{_fig(row['completion'])} | {_fig(row['strongest_gradient'])} | {ap} | {dmp} | "
            f"{score} |"
        )
    lines += ["", "### Every label attack per row (mean ± std)", ""]
    for row in rows:
        lines += [f"#### {row['defense']} ({row['attacker']})", ""]
        lines += [f"| attack | kind | {'AUC' if binary else 'accuracy'} | {figure} | blind | advantage |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for name, a in row["attacks"].items():
            if "not_applicable" in a:
                lines.append(f"| {name} | | not applicable: {a['not_applicable']} | | | |")
                continue
            kind = KINDS[a["kind"]] + (f" (k = {a['labelled_rows']})" if "labelled_rows" in a else "")
            lines.append(f"| {name} | {kind} | {pm(a['value'])} | {pm(a['either_way'])} | "
                         f"{pm(a['baseline']['value'])} | {a['advantage']:.4g} |")  # fmt: skip
        lines.append("")
    return "\n".join(lines)


def label_table(summary: dict[str, Any]) -> Any:
    """The label rows' headline as a rich Table for the terminal."""
    from rich.table import Table

    table = Table(title=f"{summary['name']}: label inference by a passive party ({summary['dataset']})")
    columns = ("training defense", "attacker", "accuracy", "strongest", "best naive", "completion",
               "strongest gradient", "AP", "ΔMP", "DCS")  # fmt: skip
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in summary.get("label_rows", []):
        nums = cells(row, "ap", "delta_mp", "dcs")
        table.add_row(row["defense"], row["attacker"], pm(row["accuracy"]), _fig(row["strongest"]),
                      _fig(row["strongest_naive"]), _fig(row["completion"]), _fig(row["strongest_gradient"]),
                      *nums)  # fmt: skip
    return table


# --- plots ------------------------------------------------------------------------------------------------------


def plot_labels(summary: dict[str, Any], out: Path) -> list[Path]:
    """label_privacy_utility.png (the strongest label attack, and the strongest gradient attack, against accuracy;
    blind and the goal as lines; the undefended point on top, large and black) and, per training-defense sweep, every
    label attack against the defense (label_<figure>_vs_training_defense*.png)."""
    rows = [r for r in summary.get("label_rows", []) if r["strongest"] is not None]
    if not rows:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    binary = rows[0]["n_classes"] == 2
    ylabel = ("AUC either way, max(AUC, 1 − AUC)\n(0.5: blind)" if binary
              else "label accuracy\n(blind: the majority rate)")  # fmt: skip
    title = f"{summary['name']} ({summary['dataset']}, {summary['model']}, label attacks by a passive party)"
    written: list[Path] = []

    def save(fig: Any, ax: Any, name: str, below: bool = False) -> None:  # below: long labels (defense and attack)
        written.append(save_plot(fig, ax, out / name, below))

    def guides(ax: Any, blind: float) -> None:
        ax.axhline(blind, color="grey", linestyle="--", label="blind baseline" + (" (0.5)" if binary else ""))
        if binary:
            ax.axhline(harness.MAX_AUC_GOAL, color="tab:green", linestyle=":", label=f"goal: ≤ {harness.MAX_AUC_GOAL}")

    def short(row: dict[str, Any]) -> str:
        return row["defense"].removeprefix(f"{TRAINING_DEFENSE_AXIS}=")

    fig, ax = plt.subplots(figsize=(9.0, 6.0))
    undefended = [r for r in rows if not r["gradient_defense"]]
    for i, row in enumerate(r for r in rows if r["gradient_defense"]):  # defended first, the undefended on top
        color = f"C{i % 10}"
        x, xerr = row["accuracy"]["mean"], row["accuracy"]["std"]
        s = row["attacks"][row["strongest"]["attack"]]["either_way"]
        ax.errorbar(x, s["mean"], xerr=xerr, yerr=s["std"], fmt="o", color=color, capsize=3, markersize=7,
                    label=f"{short(row)}: strongest ({row['strongest']['attack']})")  # fmt: skip
        g = row["strongest_gradient"]
        if g is not None and g["attack"] != row["strongest"]["attack"]:
            gs = row["attacks"][g["attack"]]["either_way"]
            ax.errorbar(x, gs["mean"], yerr=gs["std"], fmt="o", mfc="none", color=color, capsize=3, markersize=7,
                        label=f"{short(row)}: strongest gradient attack ({g['attack']})")  # fmt: skip
    for row in undefended:
        s = row["attacks"][row["strongest"]["attack"]]["either_way"]
        ax.errorbar(row["accuracy"]["mean"], s["mean"], xerr=row["accuracy"]["std"], yerr=s["std"], fmt="*",
                    markersize=16, color="black", markeredgecolor="white", zorder=5, capsize=3,
                    label=f"no defense ({row['attacker']}): strongest ({row['strongest']['attack']})")  # fmt: skip
        ax.annotate("no defense", (row["accuracy"]["mean"], s["mean"]), xytext=(6, 6), textcoords="offset points",
                    fontsize=7, zorder=6)  # fmt: skip
    guides(ax, rows[0]["blind"]["mean"])
    majority = float(np.mean([r["majority_rate"]["mean"] for r in rows]))  # a model that learnt only the prior
    ax.axvline(majority, color="grey", linestyle="-.", label=f"majority-class accuracy ({majority:.3f})")
    ax.margins(x=0.15, y=0.08)  # the undefended star is often the top-right point: keep it off the frame
    ax.set_xlabel("main-task accuracy on the queried samples (fraction correct)")
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(f"privacy–utility (labels): {title}", fontsize=8)
    save(fig, ax, "label_privacy_utility.png", below=True)

    if TRAINING_DEFENSE_AXIS in summary["sweep"]:
        groups: dict[str, list[dict[str, Any]]] = {}
        fixed = [a for a in summary["sweep"] if a in FIXED_AXES]
        for row in rows:
            groups.setdefault(row_group(row, fixed), []).append(row)
        for group, members in groups.items():
            names = [n for n in members[0]["attacks"] if all("either_way" in r["attacks"].get(n, {}) for r in members)]
            labels = [short(r) for r in members]
            fig, ax = plt.subplots(figsize=(9.0, 4.6))
            for i, name in enumerate(names):
                stats = [r["attacks"][name]["either_way"] for r in members]
                kind = KINDS[members[0]["attacks"][name]["kind"]]
                ax.errorbar(range(len(members)), [s["mean"] for s in stats], yerr=[s["std"] for s in stats],
                            marker=MARKERS[i % len(MARKERS)], linestyle="none", capsize=2, alpha=0.85,
                            markersize=8 - 0.4 * i, label=f"{name} ({kind})")  # fmt: skip
            guides(ax, members[0]["blind"]["mean"])
            ax.set_xticks(range(len(members)), labels, rotation=25, ha="right", fontsize=7)
            ax.set_xlim(-0.5, len(members) - 0.5)
            ax.set_xlabel(axis_label(TRAINING_DEFENSE_AXIS))
            ax.set_ylabel(ylabel, fontsize=8)
            suffix = f" ({group})" if group else ""
            ax.set_title(f"label attacks vs training defense{suffix}: {title}", fontsize=8)
            tag = re.sub(r"[^A-Za-z0-9]+", "_", group).strip("_")
            metric = "auc" if binary else "accuracy"
            save(fig, ax, f"label_{metric}_vs_training_defense" + (f"_{tag}" if tag else "") + ".png")
    return written
