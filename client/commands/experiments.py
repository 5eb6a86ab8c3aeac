"""The commands that measure privacy over many runs: ``vflsec curve`` (varasteh's privacy-interpretability
curve), ``experiment`` (a scenario file's cells) and ``reproduce`` (the seed papers' claims)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
import typer.core

from vflsec.client import options as opt
from vflsec.client.commands.common import fail, federation_spec, refused


def curve(
    dataset: opt.Dataset = "wine",
    passive_features: opt.PassiveFeatures = "5",
    epsilons: Annotated[str, typer.Option(help="Comma-separated interpretability levels ε.")] = (
        "0.001,0.003,0.01,0.03,0.1,0.3"
    ),
    out: Annotated[Path, typer.Option(help="Folder for curve.png and curve.md.")] = Path("privacy-curve"),
    epochs: opt.AutoEpochs = 30,
    as_json: opt.Json = False,
) -> None:
    """Varasteh's privacy–interpretability curve through the services: LS / Half* MSE measured by the curious
    plugin against the achieved interpretability loss g, next to the passive party's forecast."""
    from vflsec.client.experiments.harness import AttackScenario, privacy_curve
    from vflsec.client.experiments.param_curve import write_curve

    # The plain backend is exact: the same seed trains the same model at every ε (harness.privacy_curve).
    spec = federation_spec(dataset, passive_features=passive_features, backend="plain", epochs=epochs)
    base = AttackScenario(spec, predictions=10**9)
    with refused():
        rows = privacy_curve(base, [float(e) for e in epsilons.split(",")])
    png, table = write_curve(rows, out, f"varasteh PPS on {dataset} (through the services)")
    typer.echo(table.read_text(), err=as_json)
    typer.echo(f"wrote {png} and {table}", err=as_json)
    if as_json:
        typer.echo(json.dumps({"dataset": dataset, "rows": rows}))



def experiment(
    scenario_file: Annotated[Path, typer.Argument(metavar="SCENARIO.yaml", help="The scenario file (examples/).")],
    out: Annotated[Path, typer.Option("--out", help="Results folder; a finished cell found there is not re-run.")] = (
        Path("experiment-results")
    ),
    workers: Annotated[
        int | None, typer.Option(min=1, help="Cells at once in the local process pool (default: the CPU count).")
    ] = None,
    ray: Annotated[
        str | None, typer.Option("--ray", metavar="ADDRESS", help="Run each cell as a task on this Ray cluster.")
    ] = None,
    as_json: opt.Json = False,
) -> None:
    """Every cell of a scenario file (sweep x repetitions) through the real services, resumable; writes
    results.json, results.md (accuracy, MSE mean ± std per attack, strongest attacker, DCS) and PNG plots."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from vflsec.client.experiments import results as exp_results
    from vflsec.client.experiments import runner as exp_runner
    from vflsec.client.experiments import scenario as exp_scenario
    from vflsec.client.experiments.labels import label_table

    try:
        scenario = exp_scenario.load_scenario(scenario_file)
    except (exp_scenario.ScenarioError, OSError) as exc:
        fail(str(exc))
    cells = exp_scenario.expand(scenario)
    console = Console(stderr=as_json)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, TextColumn("ETA"), TimeRemainingColumn(), console=console) as bar, refused():
        task = bar.add_task(f"{scenario.name}: cells", total=len(cells))

        def on_cell(cell: exp_scenario.Cell, result: dict | None) -> None:
            bar.advance(task)
            if result is None:
                bar.console.print(f"already finished: {cell.label}")
            else:
                bar.console.print(f"finished: {cell.label} (accuracy {result['report']['accuracy']:.4f})")

        summary = exp_runner.run_experiment(scenario, out, workers=workers, ray_address=ray, on_cell=on_cell)
    if summary["rows"]:
        console.print(exp_results.summary_table(summary))
    if summary.get("label_rows"):  # a passive attacker's label attacks
        console.print(label_table(summary))
    console.print(f"verdict: {summary['verdict']}", markup=False, soft_wrap=True)
    formula = summary["dcs_formula"] if summary["rows"] else summary["label_dcs_formula"]
    console.print(f"{formula}; every attack per row: {out / 'results.md'}", markup=False)
    console.print(f"wrote {out / 'results.json'}, {out / 'results.md'} and {', '.join(summary['plots'])}")
    if as_json:
        sys.stdout.write(json.dumps({k: v for k, v in summary.items() if k != "cells"}) + "\n")


class ClaimsHelp(typer.core.TyperCommand):
    """reproduce --help lists the registered claim names (the registry is imported for the help only)."""

    def format_epilog(self, ctx, formatter) -> None:  # type: ignore[no-untyped-def]
        from vflsec.client.experiments.reproduce.run import CLAIMS

        formatter.write_paragraph()
        formatter.write_text("Claims: " + ", ".join(CLAIMS))
        super().format_epilog(ctx, formatter)



def reproduce(
    claim: Annotated[str, typer.Argument(metavar="CLAIM|all", help="A claim's name, or all.")] = "all",
    fast: Annotated[bool, typer.Option("--fast", help="With all: only the fast subset (CI's, ≤ 5 min).")] = False,
    out: Annotated[
        Path | None, typer.Option("--out", help="Also write results.json and results.md to this folder.")
    ] = None,
    list_claims: Annotated[bool, typer.Option("--list", help="List the registered claims; run nothing.")] = False,
    as_json: opt.Json = False,
) -> None:
    """The seed papers' quantitative claims: per claim the paper's value, ours and a verdict (reproduced /
    differs with the reason / skipped when its dataset is missing). Exit 1 if a claim failed to run."""
    from vflsec.client.experiments.reproduce import run as rep

    if list_claims:
        listed = rep.listing()
        for name, c in listed["claims"].items():
            typer.echo(f"{name:<26} {c['kind']:<7} {c['source']}" + (" (fast)" if c["fast"] else ""), err=as_json)
        if as_json:
            typer.echo(json.dumps(listed))
        return
    try:
        claims = rep.select(claim, fast)
    except ValueError as exc:
        fail(str(exc))

    def on_claim(name: str, row: dict) -> None:
        reason = f" ({row['reason']})" if "reason" in row else ""
        figures = f"paper {row['paper']}, measured {row['measured']}"
        typer.echo(f"{name}: {row['verdict']}{reason}; {figures}", err=True)
        if out is not None:  # each claim's row as soon as it is measured: an interrupted run keeps what it ran
            rep.write({"claims": {name: row}}, out)

    document = rep.reproduce(claims, on_claim)
    if out is not None:
        typer.echo(f"wrote {', '.join(str(p) for p in rep.write(document, out))}", err=True)
    typer.echo(json.dumps(document) if as_json else rep.markdown(document))
    if document["summary"]["error"]:
        raise typer.Exit(1)

