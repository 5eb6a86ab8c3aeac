"""``vflsec bench``: each sub-command runs one measurement of client/bench/ and prints it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from vflsec.client import options as opt
from vflsec.client.commands.common import fail, refused

app = typer.Typer(help="Benchmarks: figures measured side by side in one run.", no_args_is_help=True)


@app.command("he")
def bench_he(
    rows: opt.Rows = 30000,
    epochs: opt.Epochs = 1,
    processes: Annotated[
        bool,
        typer.Option(
            "--processes",
            help='Also with each party its own `vflsec serve` process (the deployment shape); under "processes".',
        ),
    ] = False,
    profile: Annotated[
        bool,
        typer.Option(
            "--profile",
            help="Also where the ckks epoch's time goes: party processes under cProfile (every thread), grouped "
            'into phases (encrypt, ct x pt, (de)serialisation, gRPC, Python); under "profile".',
        ),
    ] = False,
    as_json: opt.Json = False,
) -> None:
    """Training epoch time and inference throughput, ckks vs plain, through the real services: LR, and a split-NN
    coordinator-top epoch and a decision tree beside it."""
    from vflsec.client.bench.he import run

    result = run(
        rows=rows, epochs=epochs, log=lambda line: typer.echo(line, err=as_json), processes=processes, profile=profile
    )
    if as_json:
        typer.echo(json.dumps(result))


@app.command("release")
def bench_release(
    batch: Annotated[int, typer.Option(min=1)] = 1000,
    ks: Annotated[str, typer.Option(help="Comma-separated class counts.")] = "10,100,1000,10000",
    repeats: Annotated[int, typer.Option(min=1)] = 5,
    as_json: opt.Json = False,
) -> None:
    """Latency of every score-release defense per batch and per vector, next to a per-row PRIVEE reference."""
    from vflsec.client.bench import release as bench

    result = bench.run(batch, tuple(int(k) for k in ks.split(",")), repeats)
    typer.echo(bench.table(result), err=as_json)
    if as_json:
        typer.echo(json.dumps(result))


@app.command("attacks")
def bench_attacks(as_json: opt.Json = False) -> None:
    """Attack run times on synthetic tasks (RCC2, RCC1 on 1,000 samples; GRN on 10,000 predictions; ye Algorithm 2
    on 41,188 embeddings)."""
    from vflsec.client.bench import attacks as bench

    result = bench.run()
    for label, seconds in result["seconds"].items():
        typer.echo(f"{label:<22} {seconds:8.3f} s   MSE {result['mse'][label]:.5f}", err=as_json)
    for label, case in result["binary"].items():  # ye's binary attacks: accuracy, not MSE
        typer.echo(f"{label:<22} {case['seconds']:8.3f} s   accuracy {case['accuracy']:.4f}", err=as_json)
    if as_json:
        typer.echo(json.dumps(result))


@app.command("embedding")
def bench_embedding(
    sample: Annotated[
        int | None,
        typer.Option("--sample", min=2, metavar="N", help="A seeded sample of N rows (default: all of Bank, 41,188)."),
    ] = None,
    epochs: opt.Epochs = 10,
    runs: Annotated[int, typer.Option(min=1, help="Sessions per defense, interleaved (a fresh PRF key each).")] = 3,
    as_json: opt.Json = False,
) -> None:
    """A passive party's embedding defenses side by side (split-NN active-top, Bank, through the real services):
    epoch time and its ratio to none, test accuracy mean and spread, for none / masquerade m=1 / masquerade at
    m=⌈log₂ n⌉ / embedding noise."""
    from vflsec.client.bench.embedding import run

    result = run(rows=sample, epochs=epochs, runs=runs, log=lambda line: typer.echo(line, err=as_json))
    if as_json:
        typer.echo(json.dumps(result))


@app.command("cli")
def bench_cli(
    backends: Annotated[str, typer.Option("--backends", help="Comma-separated: plain, ckks.")] = "plain,ckks",
    as_json: opt.Json = False,
) -> None:
    """Issue 16's `vflsec attack` on Bank with the former defaults (--epochs 30) and today's, one after the other
    per backend: wall and CPU seconds (the whole process tree), phases, accuracy, ratios."""
    from vflsec.client.bench import cli as bench

    result = bench.run([b.strip() for b in backends.split(",") if b.strip()], log=lambda s: typer.echo(s, err=True))
    typer.echo(bench.table(result), err=as_json)
    if as_json:
        typer.echo(json.dumps(result))


@app.command("plugin")
def bench_plugin(
    rows: opt.Rows = 30000,
    backend: opt.Backend = "ckks",
    as_json: opt.Json = False,
) -> None:
    """Inference throughput with and without the curious plugin recording (through the real services)."""
    from vflsec.client.bench.plugin import run

    result = run(rows=rows, backend=backend, log=lambda line: typer.echo(line, err=as_json))
    if as_json:
        typer.echo(json.dumps(result))


@app.command("align")
def bench_align(
    rows: opt.Rows = 100_000,
    passive: opt.Passive = 1,
    # The option's first name, kept hidden so that scripts written for it keep working.
    parties: Annotated[int | None, typer.Option("--parties", min=1, hidden=True)] = None,
    transport: Annotated[
        str,
        typer.Option(
            help="grpc: every party a `vflsec serve` process, the shipped streamed exchange over loopback mTLS; "
            "pipes: the PSI computation alone, messages through pipes."
        ),
    ] = "grpc",
    protocol: Annotated[
        str,
        typer.Option(
            help="oprf: OT-extension PSI (consistency-checked; the parties' default); ecdh: ristretto255 ECDH PSI; "
            "both: OPRF then ECDH, side by side in one report."
        ),
    ] = "both",
    as_json: opt.Json = False,
) -> None:
    """PSI alignment seconds against a yardstick (1M X25519 multiplications on one core, measured in the run) and,
    for ECDH, its floor (curve operations x per-op cost / workers), and each party's peak memory; --rows ids per
    party (90 % common), one process per party ($VFLSEC_PSI_WORKERS sets ECDH's workers)."""
    from vflsec.client.bench.align import TRANSPORTS, run
    from vflsec.services.crypto.psi import PROTOCOLS

    if rows < 10:
        fail(f"--rows must be at least 10, got {rows}")
    if transport not in TRANSPORTS:
        fail(f"--transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
    if parties is not None and passive not in (1, parties):
        fail(f"--parties is the old name of --passive: give one of them, not --passive {passive} --parties {parties}")
    if protocol not in (*PROTOCOLS, "both"):
        fail(f"--protocol must be one of {', '.join((*PROTOCOLS, 'both'))}, got {protocol!r}")
    import grpc

    try:
        result = run(
            rows, parties or passive, log=lambda line: typer.echo(line, err=as_json), transport=transport,
            protocol=protocol,
        )  # fmt: skip
    except grpc.RpcError as exc:  # a party's refusal (a cap, a budget): its own words, one line
        fail(f"the alignment was refused: {exc.code().name}: {exc.details()}")
    if not result["correct"]:
        fail("the alignment did not return exactly the known common ids")
    if as_json:
        typer.echo(json.dumps(result))


@app.command("trees")
def bench_trees(
    rows: opt.Rows = 10_000,  # creditcard's shape: 285000
    features: Annotated[int, typer.Option("--features", help="Columns, split evenly between the two parties.")] = 30,
    depth: Annotated[int, typer.Option("--depth", help="The tree's depth, both sides.")] = 5,
    bins: Annotated[int, typer.Option("--bins", help="Quantile bins per feature, both sides.")] = 16,
    threads: Annotated[
        int, typer.Option("--threads", help="CPUs both sides are confined to (0: every CPU this process may use).")
    ] = 0,
    backends: Annotated[str, typer.Option("--backends", help="Comma-separated: ckks, plain.")] = "ckks,plain",
    as_json: opt.Json = False,
) -> None:
    """One federated decision tree (each party its own process: real PSI, gRPC, CKKS) against scikit-learn's
    HistGradientBoostingClassifier growing one tree of the same depth and bins on the same rows and CPUs: seconds,
    their ratio (goal: ckks <= 17x), held-out accuracy and AUC, each party's peak RSS. The default takes under a
    minute; creditcard's shape: --rows 285000 --features 30 --depth 5 (a few minutes)."""
    from vflsec.client.bench import trees as bench

    chosen = [b.strip() for b in backends.split(",") if b.strip()]
    try:
        bench.check(rows, features, depth, bins, chosen)
        bench.cores(threads)
    except ValueError as exc:
        fail(str(exc))
    with refused():
        result = bench.run(
            rows, features, depth, bins, threads, chosen, log=lambda line: typer.echo(line, err=as_json)
        )
    typer.echo(bench.summary(result), err=as_json)
    if as_json:
        typer.echo(json.dumps(result))


@app.command("load")
def bench_load(
    requests: Annotated[int, typer.Option(min=1)] = 1000,
    concurrency: Annotated[int, typer.Option(min=1)] = 32,
    samples: Annotated[int, typer.Option(min=1, help="Samples per request.")] = 4,
    backend: opt.Backend = "ckks",
    processes: Annotated[
        bool,
        typer.Option(
            "--processes",
            help="Also run the load with each party its own `vflsec serve` process (the deployment shape); "
            'reported beside the in-process figure, under "processes" in --json.',
        ),
    ] = False,
    as_json: opt.Json = False,
) -> None:
    """Concurrent prediction requests against one federation: p50/p99 latency, throughput, nothing dropped."""
    from vflsec.client.bench.load import run

    result = run(
        requests, concurrency, samples, backend, log=lambda line: typer.echo(line, err=as_json), processes=processes
    )
    if as_json:
        typer.echo(json.dumps(result))


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise typer.BadParameter(f"expected positive integers, got {text!r}")
    return values


@app.command("scale")
def bench_scale(
    rows: Annotated[str, typer.Option("--rows-grid", help="Rows sweep (comma-separated).")] = "10000,100000,1000000",
    passive: Annotated[str, typer.Option("--passive-grid", help="Passive-parties sweep; the first is the base.")] = (
        "1,2,4,8"
    ),
    features: Annotated[
        str, typer.Option("--features-grid", help="Features-per-party sweep; the first is the base.")
    ] = "10,50,100,500",
    base_rows: Annotated[
        int, typer.Option(min=0, help="Rows of the passive and feature sweeps (0: the smallest of --rows-grid).")
    ] = 0,
    epochs: opt.Epochs = 1,
    batch_size: Annotated[
        int,
        typer.Option("--batch", min=0, help="0: 1024, raised per point to the minimum batch (2 x the widest block)."),
    ] = 0,
    plot: Annotated[Path | None, typer.Option(help="Write the three sweeps as a PNG here.")] = None,
    markdown: Annotated[Path | None, typer.Option(help="Write the table and exponents as Markdown here.")] = None,
    as_json: opt.Json = False,
) -> None:
    """HE-LR epoch and inference time, ckks vs plain, each party its own process, as rows, passive parties and
    features per party grow (synthetic data streamed to each party's shard); each party's peak RSS."""
    from vflsec.client.bench.scale import markdown_table, run

    try:
        result = run(
            _ints(rows), _ints(passive), _ints(features), base_rows=base_rows or None, epochs=epochs,
            batch_size=batch_size, plot=plot, log=lambda line: typer.echo(line, err=as_json),
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if markdown is not None:
        markdown.write_text(markdown_table(result))
    if as_json:
        typer.echo(json.dumps(result))

