"""A federation's commands: ``vflsec demo`` (deal, start, train, report on one machine), ``prepare`` (deal it
for separate hosts), ``run`` (drive one that runs) and ``risk`` (a passive party's forecast before a release)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from vflsec.client import options as opt
from vflsec.client.commands.common import (
    backend_for,
    data_notes,
    epochs_for,
    fail,
    federation_spec,
    print_early_stopping,
    progress_bars,
    refused,
    scaling_within_bound,
    spec_of,
)


@opt.federation_options(dataset="breast_cancer", epochs=30)
def demo(
    ctx: typer.Context,
    federation: opt.Federation,
    compare_plain: opt.ComparePlain = False,
    scaling: Annotated[
        str,
        typer.Option(
            help="Each party scales its own columns: standard | minmax | none. Default standard, or minmax where "
            "standard would put a value beyond the parties' bound |x| <= 64 (the CLI says so)."
        ),
    ] = "standard",
    workdir: Annotated[Path | None, typer.Option(help="Keep configs, certificates and logs here.")] = None,
    as_json: opt.Json = False,
) -> None:
    """Start coordinator, active and passive parties as processes, align, train, predict, report."""
    from rich.console import Console

    from vflsec.client.federation.demo import run_demo

    console = Console(stderr=as_json, soft_wrap=True)  # a line stays whole when piped
    dataset, model = federation.values["dataset"], federation.values["model"]
    backend = backend_for(ctx, federation.values["backend"], model, federation.values["topology"], console)
    spec = spec_of(
        federation,
        backend=backend,
        epochs=epochs_for(ctx, federation.values["epochs"], model, console),
        scaling=scaling,
        allow_plain=compare_plain,  # the comparison run is a plain session
    )
    with refused(), progress_bars(console, as_json) as (bar, _, phases):
        tasks: dict[str, int] = {}
        with phases("load", f"reading {dataset}"):
            data_notes(spec, console)  # parsed once per process; the bound check and the dealer share it
        spec = scaling_within_bound(ctx, spec, console)
        if backend == "plain" or compare_plain:
            note = "note: the coordinator allows the plain backend for this demo ([policy] allowed_backends)"
            console.print(note, markup=False)

        def progress(run_backend: str, epoch: int, n_epochs: int, batch: int, n_batches: int) -> None:
            if run_backend not in tasks:
                tasks[run_backend] = bar.add_task(f"training ({run_backend})", total=n_epochs * n_batches)
            bar.update(tasks[run_backend], completed=(epoch - 1) * n_batches + batch)

        result = run_demo(spec, compare_plain=compare_plain, workdir=workdir, progress=progress, phases=phases)
    _report(result, as_json, console)
    console.print(  # the demo trains; the attack answers what the active party could learn of the passive columns
        f"next: does this split leak? vflsec attack --dataset {dataset} (README.md, Quickstart)",
        markup=False,
        soft_wrap=True,
    )



def _report(result: dict, as_json: bool, console) -> None:  # type: ignore[no-untyped-def]
    from rich.table import Table

    table = Table(title=f"vflsec demo: {result['dataset']}", show_header=False)
    for key, value in result.items():
        if key != "early_stopping":  # its own line below (and the JSON)
            table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    console.print(table)
    print_early_stopping(result, console)
    if "majority_rate" in result:
        from vflsec.client.experiments.harness import accuracy_warning

        warning = accuracy_warning(result["accuracy"], result["majority_rate"])
        if warning:
            console.print(f"warning: {warning}")
    if as_json:
        sys.stdout.write(json.dumps(result) + "\n")



def prepare(
    out: Annotated[Path, typer.Option("--out", help="Folder for the federation: one sub-folder per party.")],
    dataset: opt.Dataset = "breast_cancer",
    label: opt.Label = None,
    passive: opt.Passive = 2,
    passive_features: opt.PassiveFeatures = None,
    encoding: opt.Encoding = "onehot",
    compose: Annotated[
        bool, typer.Option(help="Listen on 0.0.0.0 at fixed ports; peers by party id (docker compose).")
    ] = False,
    seed: opt.Seed = 0,
    release: opt.Release = None,
    param_release: opt.ParamRelease = None,
    allow_plain: Annotated[
        bool, typer.Option(help="Let the coordinator run plain sessions (no encryption; for `run --compare-plain`).")
    ] = False,
    embedding_release: opt.EmbeddingRelease = None,
) -> None:
    """Write certificates, per-party data files and configs for a federation (the demo's dealer step)."""
    from vflsec.client.federation.launcher import compose_ports, write_federation

    embedding = opt.embedding_steps(embedding_release)
    if embedding and not allow_plain:  # the defense acts in active-top sessions, which run on the plain backend
        fail("--embedding-release acts in split-NN active-top sessions only, which run on the plain backend: "
              "add --allow-plain")  # fmt: skip
    # The passive parties' TOMLs get the chain, checked as the split-NN active-top sessions it acts in will use it.
    active_top = {"model": "splitnn", "topology": "active-top", "backend": "plain"} if embedding else {}
    spec = federation_spec(
        dataset,
        release,
        param_release,
        label=label,
        n_passive=passive,
        passive_features=passive_features,
        encoding=encoding,
        seed=seed,
        compose_ports=compose_ports(passive) if compose else None,
        allow_plain=allow_plain,
        embedding_release=embedding,
        **active_top,
    )
    with refused():
        layout = write_federation(spec, out)
    if allow_plain:
        typer.echo("note: the coordinator allows the plain backend ([policy] allowed_backends = ckks, plain)")
    for party, config in layout.configs.items():
        typer.echo(f"{party}: {config}")



def run(
    active: Annotated[str, typer.Option(help="The active party's address host:port.")],
    tls_dir: opt.TlsDir,
    labels: Annotated[Path, typer.Option(help="The active party's data file (the operator's labels).")],
    backend: opt.Backend = "ckks",
    model: opt.Model = "lr",
    topology: opt.Topology = "coordinator-top",
    embedding: opt.Embedding = 16,
    hidden: opt.Hidden = "32",
    epochs: opt.AutoEpochs = 30,
    batch_size: opt.BatchSize = 0,
    learning_rate: opt.LearningRate = 0.1,
    seed: opt.Seed = 0,
    compare_plain: opt.ComparePlain = False,
    gradient_defense: opt.GradientDefense = None,
    wait: Annotated[float, typer.Option(help="Seconds to wait for the active party to be healthy.")] = 120.0,
    as_json: opt.Json = False,
) -> None:
    """Drive a federation that already runs (compose, separate hosts): align, train, predict, report."""
    from rich.console import Console

    from vflsec.client.federation.demo import evaluate, operator_labels
    from vflsec.client.federation.launcher import wait_for
    from vflsec.services.transport.server import peer_channel
    from vflsec.services.transport.tls import TlsFiles

    # The federation was dealt elsewhere: the spec carries the operator's session, named by its labels file.
    spec = federation_spec(
        str(labels),
        backend=backend,
        model=model,
        topology=topology,
        embedding=embedding,
        hidden=opt.widths(hidden),
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        seed=seed,
        gradient_defense=gradient_defense or (),
    )
    files = TlsFiles.from_dir(tls_dir)
    with peer_channel(active, "active", files, 256 * 1024 * 1024) as channel, refused():
        wait_for(channel, "active", wait)
        result = evaluate(channel, operator_labels(labels), spec, compare_plain=compare_plain)
    _report(result, as_json, Console(stderr=as_json))




def risk(
    address: Annotated[str, typer.Option(help="host:port of the passive party.")],
    party: Annotated[str, typer.Option(help="The passive party's id (its certificate must say so).")],
    tls_dir: opt.TlsDir,
    session: Annotated[str, typer.Option(help="The trained session whose block would be disclosed.")],
    param_release: opt.ParamRelease = None,
    warn_fraction: Annotated[float, typer.Option(min=0.0, max=1.0)] = 0.5,
    as_json: opt.Json = False,
) -> None:
    """A passive party's forecast of the attack MSE (LS, Half*) its disclosed block would allow, before any
    release (rassouli Theorem 2); exits 3 when a forecast falls below ``warn_fraction`` x the Half baseline."""
    import grpc

    from vflsec.client.federation.launcher import check_release_chains
    from vflsec.client.federation.operator import forecast_risk
    from vflsec.services.transport.tls import TlsFiles

    with refused():
        check_release_chains(param_release=param_release or (), family="lr")  # disclosure is of LR's W_p
    try:
        result = forecast_risk(address, party, TlsFiles.from_dir(tls_dir), session, param_release or [], warn_fraction)
    except grpc.RpcError as exc:
        fail(f"{party}: {exc.code().name}: {exc.details()}")
    for key, value in result.items():
        typer.echo(f"{key:>15}: {value}", err=as_json)
    if as_json:
        typer.echo(json.dumps(result))
    if result["warnings"]:
        raise typer.Exit(3)

