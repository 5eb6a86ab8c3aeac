"""The ``vflsec`` command line."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer

app = typer.Typer(
    help="vflsec: vertical federated learning with measured privacy.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(help="Benchmarks: figures measured side by side in one run.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")

ReleaseOption = Annotated[
    list[str] | None,
    typer.Option("--release", help="Score-release step STEP[:key=value,...] at the coordinator; repeatable, in order."),
]
ParamReleaseOption = Annotated[
    list[str] | None,
    typer.Option("--param-release", help="Parameter-release step STEP[:key=value,...]; repeatable, in order."),
]


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _check_release_specs(release: list[str] | None, param_release: list[str] | None) -> None:
    """Fail on a bad defense spec at configuration time, before any process starts."""
    from vflsec.services.defenses.release import ParamReleaseChain, ReleaseConfigError, ScoreReleaseChain

    try:
        ScoreReleaseChain.from_specs(release or [])
        ParamReleaseChain.from_specs(param_release or [])
    except ReleaseConfigError as exc:
        _fail(str(exc))


def _passive_features(value: str | None) -> int | float | list[str] | None:
    """A count (last N columns), a fraction in (0, 1), or comma-separated column names."""
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return [c.strip() for c in value.split(",") if c.strip()]
    return int(number) if number.is_integer() and number >= 1 else number


@app.command()
def serve(
    role: Annotated[str, typer.Argument(help="coordinator | active | passive")],
    config: Annotated[Path, typer.Option("--config", help="The party's TOML config file.")],
) -> None:
    """Run one party's gRPC service until SIGTERM/SIGINT."""
    from vflsec.services.app import serve as serve_party
    from vflsec.services.config import ConfigError, load_config

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(config, role)
    except ConfigError as exc:
        _fail(str(exc))
    serve_party(cfg)


certs_app = typer.Typer(
    help="Mutual-TLS identities. Per host: `init-ca` once at the CA, `request` on each party's host (its key never "
    "leaves it), `sign` each CSR at the CA. Without a sub-command: everything on one machine (demo, tests).",
)
app.add_typer(certs_app, name="certs")


def _names(value: str) -> list[str]:
    return [name.strip() for name in value.split(",") if name.strip()]


@certs_app.callback(invoke_without_command=True)
def certs(
    ctx: typer.Context,
    out: Annotated[Path | None, typer.Option("--out", help="Folder for the CA and the party certificates.")] = None,
    parties: Annotated[str, typer.Option(help="Comma-separated party ids, e.g. coordinator,active,passive-1.")] = (
        "coordinator,active,passive-1"
    ),
    hosts: Annotated[str, typer.Option(help="Extra host names / IPs for every certificate (comma-separated).")] = "",
) -> None:
    """All-in-one on one trusted machine: a CA and one key + certificate per party (the operator's included)."""
    if ctx.invoked_subcommand is not None:
        return
    if out is None:
        _fail("--out is required (or use a sub-command: init-ca, request, sign)")
    from vflsec.services.transport.tls import make_pki

    names = _names(parties)
    try:
        pki = make_pki(out, names, hosts=_names(hosts))
    except (ValueError, OSError) as exc:  # a bad id or host, a CSR the CA refuses, an unreadable CA
        _fail(str(exc))
    for party in [*names, "operator"]:
        typer.echo(f"{party}: {pki.files(party).cert}")


@certs_app.command("init-ca")
def certs_init_ca(
    out: Annotated[Path, typer.Option("--out", help="The CA's folder: ca.pem (public) and ca.key (created 0600).")],
    days: Annotated[int, typer.Option(min=3650, help="Validity of the CA certificate in days.")] = 3650,
) -> None:
    """Create the federation's CA (refuses to replace one). ca.key never leaves this folder."""
    from vflsec.services.transport.tls import CertificateAuthority

    try:
        CertificateAuthority.create(out, days)
    except FileExistsError as exc:
        _fail(str(exc))
    typer.echo(f"CA: {out / 'ca.pem'} (give it to every party); keep {out / 'ca.key'} here")


@certs_app.command("request")
def certs_request(
    party: Annotated[str, typer.Option("--party", help="This host's party id (its role follows from the id).")],
    out: Annotated[Path, typer.Option("--out", help="This party's tls/ folder: key.pem and PARTY.csr go here.")],
    hosts: Annotated[str, typer.Option(help="Names / IPs this party is reached under (comma-separated).")] = "",
) -> None:
    """Make this party's key (key.pem, created 0600; an existing one is reused) and a CSR for the CA."""
    from cryptography.hazmat.primitives import serialization

    from vflsec.services.transport.tls import key_fingerprint, request_certificate

    key = out / "key.pem"
    existed = key.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        csr = request_certificate(party, key, _names(hosts))
    except (ValueError, OSError) as exc:
        _fail(str(exc))
    path = out / f"{party}.csr"
    path.write_bytes(csr.public_bytes(serialization.Encoding.PEM))
    typer.echo(f"key: {key} ({'reused' if existed else 'new'}; it never leaves this host)")
    typer.echo(f"csr: {path} (send it to the CA; install the certificate it returns as {out / 'cert.pem'})")
    typer.echo(f"key fingerprint: {key_fingerprint(csr.public_key())} (tell the CA's operator out of band)")


@certs_app.command("sign")
def certs_sign(
    ca: Annotated[Path, typer.Option("--ca", help="The CA's folder (ca.pem, ca.key).")],
    csr: Annotated[Path, typer.Option("--csr", help="A party's CSR (from `vflsec certs request`).")],
    out: Annotated[Path, typer.Option("--out", help="Where to write the signed certificate (PEM).")],
    party: Annotated[str, typer.Option("--party", help="The party id you approve; the CSR must ask for exactly it.")],
    role: Annotated[str | None, typer.Option(help="The role you approve (checked against the id's role).")] = None,
    hosts: Annotated[
        str | None, typer.Option(help="Names / IPs the certificate may carry besides the defaults (comma-separated).")
    ] = None,
    fingerprint: Annotated[
        str | None, typer.Option(help="The key fingerprint the party's host printed (`certs request`), to match.")
    ] = None,
    days: Annotated[int, typer.Option(min=1, help="Validity in days (capped at the CA's own expiry).")] = 365,
) -> None:
    """Sign a party's CSR after checking it asks only for the approved identity, role and names."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from vflsec.services.transport.tls import CertificateAuthority, key_fingerprint, role_of, sign_request

    try:
        request = x509.load_pem_x509_csr(csr.read_bytes())
        cert = sign_request(
            CertificateAuthority.load(ca),
            request,
            party=party,
            role=role,
            hosts=None if hosts is None else _names(hosts),
            fingerprint=fingerprint,
            days=days,
        )
    except (ValueError, OSError) as exc:  # CsrRefused is a ValueError
        _fail(f"{csr}: {exc}")
    out.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    typer.echo(f"issued {party} (role {role_of(party)}) until {cert.not_valid_after_utc:%Y-%m-%d}: {out}")
    typer.echo(f"names: {', '.join(str(name.value) for name in names)}")
    if fingerprint is None:
        typer.echo(f"key fingerprint: {key_fingerprint(cert.public_key())} (not checked: pass --fingerprint)")


@app.command()
def demo(
    dataset: Annotated[str, typer.Option(help="breast_cancer | wine | digits | iris | a UCI name | a CSV path.")] = (
        "breast_cancer"
    ),
    label: Annotated[str | None, typer.Option(help="Label column of a CSV dataset.")] = None,
    passive: Annotated[int, typer.Option("--passive", min=1, max=8, help="Number of passive parties.")] = 1,
    passive_features: Annotated[
        str | None, typer.Option(help="Passive columns: a count (the last N), a fraction, or names.")
    ] = None,
    backend: Annotated[str, typer.Option(help="ckks | plain")] = "ckks",
    epochs: Annotated[int, typer.Option(min=1)] = 30,
    batch_size: Annotated[
        int, typer.Option(min=0, help="0: 64, raised to the federation's minimum batch (2 x the widest block).")
    ] = 0,
    learning_rate: Annotated[float, typer.Option(min=0.0)] = 0.1,
    seed: Annotated[int, typer.Option()] = 0,
    compare_plain: Annotated[bool, typer.Option(help="Also train on the plain backend and report both.")] = False,
    scaling: Annotated[str, typer.Option(help="Each party scales its own columns: standard | minmax | none.")] = (
        "standard"
    ),
    release: ReleaseOption = None,
    param_release: ParamReleaseOption = None,
    workdir: Annotated[Path | None, typer.Option(help="Keep configs, certificates and logs here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object as the last line.")] = False,
) -> None:
    """Start coordinator, active and passive parties as processes, align, train, predict, report."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from vflsec.client.demo import DemoOptions, run_demo

    if backend not in ("ckks", "plain"):
        _fail("--backend must be ckks or plain")
    _check_release_specs(release, param_release)
    options = DemoOptions(
        dataset=dataset,
        label=label,
        n_passive=passive,
        passive_features=_passive_features(passive_features),
        backend=backend,
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        seed=seed,
        compare_plain=compare_plain,
        scaling=scaling,
        score_release=release or [],
        param_release=param_release or [],
        workdir=workdir,
    )
    console = Console(stderr=as_json)
    if backend == "plain" or compare_plain:
        note = "note: the coordinator allows the plain backend for this demo ([policy] allowed_backends)"
        console.print(note, markup=False)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=as_json,
    ) as bar:
        tasks: dict[str, int] = {}

        def progress(run_backend: str, epoch: int, n_epochs: int, batch: int, n_batches: int) -> None:
            if run_backend not in tasks:
                tasks[run_backend] = bar.add_task(f"training ({run_backend})", total=n_epochs * n_batches)
            bar.update(tasks[run_backend], completed=(epoch - 1) * n_batches + batch)

        result = run_demo(options, progress)
    _report(result, as_json, console)


def _report(result: dict, as_json: bool, console) -> None:  # type: ignore[no-untyped-def]
    from rich.table import Table

    table = Table(title=f"vflsec demo: {result['dataset']}", show_header=False)
    for key, value in result.items():
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    console.print(table)
    if as_json:
        sys.stdout.write(json.dumps(result) + "\n")


@app.command()
def prepare(
    out: Annotated[Path, typer.Option("--out", help="Folder for the federation: one sub-folder per party.")],
    dataset: Annotated[str, typer.Option(help="Dataset name or CSV path.")] = "breast_cancer",
    label: Annotated[str | None, typer.Option(help="Label column of a CSV dataset.")] = None,
    passive: Annotated[int, typer.Option("--passive", min=1, max=8)] = 2,
    passive_features: Annotated[str | None, typer.Option(help="Count, fraction or names.")] = None,
    compose: Annotated[
        bool, typer.Option(help="Listen on 0.0.0.0 at fixed ports; peers by party id (docker compose).")
    ] = False,
    seed: Annotated[int, typer.Option()] = 0,
    release: ReleaseOption = None,
    param_release: ParamReleaseOption = None,
    allow_plain: Annotated[
        bool, typer.Option(help="Let the coordinator run plain sessions (no encryption; for `run --compare-plain`).")
    ] = False,
) -> None:
    """Write certificates, per-party data files and configs for a federation (the demo's dealer step)."""
    from vflsec.client.federation import FederationSpec, compose_ports, write_federation
    from vflsec.services.data import datasets

    _check_release_specs(release, param_release)
    spec = FederationSpec(
        dataset=datasets.load_dataset(dataset, label=label),
        n_passive=passive,
        passive_features=_passive_features(passive_features),
        score_release=release or [],
        param_release=param_release or [],
        seed=seed,
        compose_ports=compose_ports(passive) if compose else None,
        allow_plain=allow_plain,
    )
    layout = write_federation(spec, out)
    if allow_plain:
        typer.echo("note: the coordinator allows the plain backend ([policy] allowed_backends = ckks, plain)")
    for party, config in layout.configs.items():
        typer.echo(f"{party}: {config}")


@app.command()
def run(
    active: Annotated[str, typer.Option(help="The active party's address host:port.")],
    tls_dir: Annotated[Path, typer.Option(help="The operator's tls/ folder (ca.pem, cert.pem, key.pem).")],
    labels: Annotated[Path, typer.Option(help="The active party's data file (the operator's labels).")],
    backend: Annotated[str, typer.Option(help="ckks | plain")] = "ckks",
    epochs: Annotated[int, typer.Option(min=1)] = 30,
    batch_size: Annotated[
        int, typer.Option(min=0, help="0: 64, raised to the federation's minimum batch (2 x the widest block).")
    ] = 0,
    learning_rate: Annotated[float, typer.Option(min=0.0)] = 0.1,
    seed: Annotated[int, typer.Option()] = 0,
    compare_plain: Annotated[bool, typer.Option()] = False,
    wait: Annotated[float, typer.Option(help="Seconds to wait for the active party to be healthy.")] = 120.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object as the last line.")] = False,
) -> None:
    """Drive a federation that already runs (compose, separate hosts): align, train, predict, report."""
    from rich.console import Console

    from vflsec.client.demo import DemoOptions, evaluate, operator_labels
    from vflsec.client.federation import wait_for
    from vflsec.services.transport.server import peer_channel
    from vflsec.services.transport.tls import TlsFiles

    files = TlsFiles.from_dir(tls_dir)
    options = DemoOptions(
        dataset=str(labels),
        backend=backend,
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        seed=seed,
        compare_plain=compare_plain,
    )
    with peer_channel(active, "active", files, 256 * 1024 * 1024) as channel:
        wait_for(channel, "active", wait)
        result = evaluate(channel, operator_labels(labels), options)
    _report(result, as_json, Console(stderr=as_json))


@app.command()
def health(
    address: Annotated[str, typer.Option(help="host:port of the service.")],
    party: Annotated[str, typer.Option(help="The service's party id (its certificate must say so).")],
    tls_dir: Annotated[Path, typer.Option(help="A tls/ folder (ca.pem, cert.pem, key.pem) to call with.")],
    timeout: Annotated[float, typer.Option()] = 3.0,
) -> None:
    """gRPC health check over mutual TLS; exit 0 when SERVING (used by compose health checks)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from vflsec.services.transport.server import peer_channel
    from vflsec.services.transport.tls import TlsFiles

    files = TlsFiles.from_dir(tls_dir)
    with peer_channel(address, party, files, 4 * 1024 * 1024) as channel:
        try:
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError as exc:
            _fail(f"{party} at {address}: {exc.code().name}: {exc.details()}")
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(status.status)
    typer.echo(f"{party} at {address}: {name}")
    if status.status != health_pb2.HealthCheckResponse.SERVING:
        raise typer.Exit(1)


@app.command()
def attack(
    dataset: Annotated[str, typer.Option(help="Dataset name or CSV path.")] = "digits",
    label: Annotated[str | None, typer.Option(help="Label column of a CSV dataset.")] = None,
    passive: Annotated[int, typer.Option("--passive", min=1, max=8)] = 1,
    passive_features: Annotated[
        str | None, typer.Option(help="Passive columns: a count (the last N), a fraction, or names.")
    ] = None,
    attacks: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated attack names (see docs/attacks.md). Default: every applicable LR attack, the "
            "defense-aware ones for the release chains included."
        ),
    ] = None,
    predictions: Annotated[int, typer.Option(min=1, help="Samples the active party queries after training.")] = 1000,
    backend: Annotated[str, typer.Option(help="ckks | plain")] = "ckks",
    epochs: Annotated[int, typer.Option(min=1)] = 30,
    seed: Annotated[int, typer.Option()] = 0,
    withhold_model: Annotated[bool, typer.Option(help="Do not fetch the model (black-box setting).")] = False,
    windows: Annotated[int, typer.Option(min=1, help="Average over this many cyclic windows of passive columns.")] = 1,
    release: ReleaseOption = None,
    param_release: ParamReleaseOption = None,
    markdown: Annotated[Path | None, typer.Option(help="Also write the table as markdown here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object as the last line.")] = False,
) -> None:
    """Train through the real services with the curious plugin on the active party, attack its recordings,
    and compare the reconstructions with the passive parties' true features (MSE vs blind baselines)."""
    from rich.console import Console
    from rich.table import Table

    from vflsec.client.harness import AttackScenario, headline, markdown_table, run_attack_scenario
    from vflsec.services.attacks import ATTACKS

    names = None if attacks is None else [a.strip() for a in attacks.split(",") if a.strip()]
    unknown = sorted(set(names or ()) - set(ATTACKS))
    if unknown:
        _fail(f"unknown attack(s) {unknown}; known: {', '.join(sorted(ATTACKS))}")
    _check_release_specs(release, param_release)
    scenario = AttackScenario(
        dataset=dataset,
        label=label,
        n_passive=passive,
        passive_features=_passive_features(passive_features),
        attacks=names,
        predictions=predictions,
        backend=backend,
        epochs=epochs,
        seed=seed,
        score_release=release or [],
        param_release=param_release or [],
        release_model=not withhold_model,
        windows=windows,
    )
    console = Console(stderr=as_json)
    with console.status("training, querying and attacking…"):
        report = run_attack_scenario(scenario)
    table = Table(
        title=f"feature inference on {report['dataset']} (d_passive = {report['d_passive']}, "
        f"n = {report['n_samples']}, accuracy = {report['accuracy']:.4f})"
    )
    for column in ("attack", "MSE (clipped)", "raw MSE", "seconds"):
        table.add_column(column)
    for name, mse in report["baselines"].items():
        table.add_row(f"{name} (baseline)", f"{mse:.6g}", "", "")
    for name, r in report["attacks"].items():
        label = f"{name} (aware)" if r.get("aware") else name
        if "not_applicable" in r:
            table.add_row(label, f"n/a: {r['not_applicable']}", "", "")
        else:
            table.add_row(label, f"{r['mse_clipped']:.6g}", f"{r['mse']:.6g}", f"{r['seconds']:.3f}")
    console.print(table)
    if report.get("strongest"):
        console.print(headline(report))
    if markdown is not None:
        markdown.write_text(markdown_table(report))
    if as_json:
        sys.stdout.write(json.dumps(report) + "\n")


@bench_app.command("he")
def bench_he(
    rows: Annotated[int, typer.Option(help="Rows of the synthetic set when Credit default is absent.")] = 30000,
    epochs: Annotated[int, typer.Option(min=1)] = 1,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """HE-LR training epoch time and inference throughput, ckks vs plain, through the real services."""
    from vflsec.client.bench_he import run

    result = run(rows=rows, epochs=epochs, log=lambda line: typer.echo(line, err=as_json))
    if as_json:
        typer.echo(json.dumps(result))


@bench_app.command("release")
def bench_release(
    batch: Annotated[int, typer.Option(min=1)] = 1000,
    ks: Annotated[str, typer.Option(help="Comma-separated class counts.")] = "10,100,1000,10000",
    repeats: Annotated[int, typer.Option(min=1)] = 5,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Latency of every score-release defense per batch and per vector, next to a per-row PRIVEE reference."""
    from vflsec.client import bench_release as bench

    result = bench.run(batch, tuple(int(k) for k in ks.split(",")), repeats)
    typer.echo(bench.table(result), err=as_json)
    if as_json:
        typer.echo(json.dumps(result))


@bench_app.command("attacks")
def bench_attacks(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Attack run times on synthetic LR tasks (RCC2, RCC1 on 1,000 samples; GRN on 10,000 predictions)."""
    from vflsec.client import bench_attacks as bench

    result = bench.run()
    for label, seconds in result["seconds"].items():
        typer.echo(f"{label:<22} {seconds:8.3f} s   MSE {result['mse'][label]:.5f}", err=as_json)
    if as_json:
        typer.echo(json.dumps(result))


@bench_app.command("plugin")
def bench_plugin(
    rows: Annotated[int, typer.Option(help="Rows of the synthetic set when Credit default is absent.")] = 30000,
    backend: Annotated[str, typer.Option(help="ckks | plain")] = "ckks",
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Inference throughput with and without the curious plugin recording (through the real services)."""
    from vflsec.client.bench_plugin import run

    result = run(rows=rows, backend=backend, log=lambda line: typer.echo(line, err=as_json))
    if as_json:
        typer.echo(json.dumps(result))


@bench_app.command("load")
def bench_load(
    requests: Annotated[int, typer.Option(min=1)] = 1000,
    concurrency: Annotated[int, typer.Option(min=1)] = 32,
    samples: Annotated[int, typer.Option(min=1, help="Samples per request.")] = 4,
    backend: Annotated[str, typer.Option(help="ckks | plain")] = "ckks",
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Concurrent prediction requests against one federation: p50/p99 latency, throughput, nothing dropped."""
    from vflsec.client.bench_load import run

    result = run(requests, concurrency, samples, backend, log=lambda line: typer.echo(line, err=as_json))
    if as_json:
        typer.echo(json.dumps(result))


@app.command()
def risk(
    address: Annotated[str, typer.Option(help="host:port of the passive party.")],
    party: Annotated[str, typer.Option(help="The passive party's id (its certificate must say so).")],
    tls_dir: Annotated[Path, typer.Option(help="The caller's tls/ folder (operator or coordinator).")],
    session: Annotated[str, typer.Option(help="The trained session whose block would be disclosed.")],
    param_release: ParamReleaseOption = None,
    warn_fraction: Annotated[float, typer.Option(min=0.0, max=1.0)] = 0.5,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """A passive party's forecast of the attack MSE (LS, Half*) its disclosed block would allow, before any
    release (rassouli Theorem 2); exits 3 when a forecast falls below ``warn_fraction`` x the Half baseline."""
    import grpc

    from vflsec.client.operator import forecast_risk
    from vflsec.services.transport.tls import TlsFiles

    _check_release_specs(None, param_release)
    try:
        result = forecast_risk(address, party, TlsFiles.from_dir(tls_dir), session, param_release or [], warn_fraction)
    except grpc.RpcError as exc:
        _fail(f"{party}: {exc.code().name}: {exc.details()}")
    for key, value in result.items():
        typer.echo(f"{key:>15}: {value}", err=as_json)
    if as_json:
        typer.echo(json.dumps(result))
    if result["warnings"]:
        raise typer.Exit(3)


@app.command()
def curve(
    dataset: Annotated[str, typer.Option(help="Dataset name or CSV path.")] = "wine",
    passive_features: Annotated[str | None, typer.Option(help="Count, fraction or names.")] = "5",
    epsilons: Annotated[str, typer.Option(help="Comma-separated interpretability levels ε.")] = (
        "0.001,0.003,0.01,0.03,0.1,0.3"
    ),
    out: Annotated[Path, typer.Option(help="Folder for curve.png and curve.md.")] = Path("privacy-curve"),
    epochs: Annotated[int, typer.Option(min=1)] = 30,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Varasteh's privacy–interpretability curve through the services: LS / Half* MSE measured by the curious
    plugin against the achieved interpretability loss g, next to the passive party's forecast."""
    from vflsec.client.harness import AttackScenario, privacy_curve
    from vflsec.client.param_curve import write_curve

    base = AttackScenario(
        dataset=dataset,
        passive_features=_passive_features(passive_features),
        predictions=10**9,
        backend="plain",
        epochs=epochs,
    )
    rows = privacy_curve(base, [float(e) for e in epsilons.split(",")])
    png, table = write_curve(rows, out, f"varasteh PPS on {dataset} (through the services)")
    typer.echo(table.read_text(), err=as_json)
    typer.echo(f"wrote {png} and {table}", err=as_json)
    if as_json:
        typer.echo(json.dumps({"dataset": dataset, "rows": rows}))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
