"""The ``vflsec`` command line."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
import typer.core

from vflsec.client import options as opt

if TYPE_CHECKING:
    from vflsec.client.federation import FederationSpec

app = typer.Typer(
    help="vflsec: vertical federated learning with measured privacy.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Click's plain help: option names and defaults stay whole in an 80-column terminal (rich's table cuts them).
    rich_markup_mode=None,
)
bench_app = typer.Typer(help="Benchmarks: figures measured side by side in one run.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")

def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


@contextlib.contextmanager
def _refused() -> Iterator[None]:
    """A spec the system would refuse (FederationSpec's validation, the minimum batch): the validator's message
    and exit 2, before any process starts. A party process that stops at start (its shard or defense refused): the
    end of its log, which says why, and exit 2; the log's path only if it is still there (a temporary folder is
    gone by now)."""
    from vflsec.client.federation import PartyExited, SpecError

    try:
        yield
    except SpecError as exc:
        _fail(str(exc))
    except PartyExited as exc:
        log = exc.log_file if exc.log_file is not None and exc.log_file.exists() else "its log"
        _fail(f"{exc.party} exited during start-up" + (f"; the end of {log}:\n{exc.tail}" if exc.tail else ""))


def _spec(
    dataset: str, release: list[str] | None = None, param_release: list[str] | None = None, **fields: Any
) -> FederationSpec:
    """The one option bag for the launcher, from what a command collected."""
    from vflsec.client.federation import FederationSpec

    with _refused():
        return FederationSpec(dataset, score_release=release or (), param_release=param_release or (), **fields)


def _data_notes(spec: FederationSpec, console) -> None:  # type: ignore[no-untyped-def]
    """Load the dataset (a one-line error, exit 2, if it cannot be used) and warn of what loading decided."""
    with _refused():
        notes = spec.data.notes
    for note in notes:
        console.print(f"warning: {spec.name}: {note}", markup=False, soft_wrap=True)


def _backend_for(ctx: typer.Context, backend: str, model: str, topology: str, console) -> str:  # type: ignore[no-untyped-def]
    """The default backend follows the topology: active-top sends z_B in the clear, so it has only the plain one
    (an explicit --backend ckks is refused by the spec with the reason)."""
    source = ctx.get_parameter_source("backend")  # typer's own click: compared by name, not imported
    if model == "splitnn" and topology == "active-top" and source is not None and source.name == "DEFAULT":
        if backend != "plain":
            note = "note: --topology active-top runs on the plain backend (z_B reaches the active party in clear)"
            console.print(note, markup=False)
        return "plain"
    return backend


def _scaling_within_bound(ctx: typer.Context, spec: FederationSpec, console) -> FederationSpec:  # type: ignore[no-untyped-def]
    """A default scaling never trips the parties' feature bound: standard scaling of a rare category (Bank's
    ``default=yes``, 3 rows) reaches |x| ~ 117, so the default falls back to min-max and says so; an explicit
    --scaling keeps its clear error from write_federation."""
    from vflsec.services.crypto import he

    source = ctx.get_parameter_source("scaling")
    if source is None or source.name != "DEFAULT" or spec.scaling == "minmax":
        return spec
    with _refused():
        peak = spec.scaled_peak()
    if peak <= he.FEATURE_BOUND:
        return spec
    console.print(
        f"note: standard scaling would reach |x| = {peak:.4g} > {he.FEATURE_BOUND:g} (the parties' bound); "
        "scaling min-max instead",
        markup=False,
    )
    return dataclasses.replace(spec, scaling="minmax")


def _epochs_for(ctx: typer.Context, epochs: int, model: str, console) -> int:  # type: ignore[no-untyped-def]
    """A tree or forest is grown once: the default epochs follow that bound (an explicit other value is refused by
    the spec, which names the bound)."""
    source = ctx.get_parameter_source("epochs")
    if model in ("tree", "forest") and source is not None and source.name == "DEFAULT":
        console.print(f"note: a {model} is grown once over its training rows: epochs 1", markup=False)
        return 1
    return epochs


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
    from vflsec.client.profiling import maybe_profile

    with maybe_profile(cfg.party_id):  # VFLSEC_PROFILE_DIR set: where this party's time goes (bench he --profile)
        try:
            serve_party(cfg)
        except (ValueError, OSError) as exc:  # its data, a file it names or a defense refused at start: no traceback
            _fail(f"{role} {cfg.party_id} cannot start: {exc}")


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
    ctx: typer.Context,
    dataset: opt.Dataset = "breast_cancer",
    label: opt.Label = None,
    passive: opt.Passive = 1,
    passive_features: opt.PassiveFeatures = None,
    encoding: opt.Encoding = "onehot",
    backend: opt.Backend = "ckks",
    model: opt.Model = "lr",
    topology: opt.Topology = "coordinator-top",
    embedding: opt.Embedding = 16,
    hidden: opt.Hidden = "32",
    max_depth: opt.MaxDepth = 0,
    trees: opt.Trees = 0,
    epochs: opt.AutoEpochs = 30,
    batch_size: opt.BatchSize = 0,
    learning_rate: opt.LearningRate = 0.1,
    optimizer: opt.Optimizer = "adam",
    l2: opt.L2 = 1e-4,
    train_rows: opt.TrainRows = None,
    early_stopping_patience: opt.EarlyStoppingPatience = 0,
    validation_fraction: opt.ValidationFraction = 0.2,
    seed: opt.Seed = 0,
    compare_plain: opt.ComparePlain = False,
    scaling: Annotated[
        str,
        typer.Option(
            help="Each party scales its own columns: standard | minmax | none. Default standard, or minmax where "
            "standard would put a value beyond the parties' bound |x| <= 64 (the CLI says so)."
        ),
    ] = "standard",
    release: opt.Release = None,
    param_release: opt.ParamRelease = None,
    embedding_release: opt.EmbeddingRelease = None,
    gradient_defense: opt.GradientDefense = None,
    workdir: Annotated[Path | None, typer.Option(help="Keep configs, certificates and logs here.")] = None,
    as_json: opt.Json = False,
) -> None:
    """Start coordinator, active and passive parties as processes, align, train, predict, report."""
    from rich.console import Console

    from vflsec.client.demo import run_demo

    console = Console(stderr=as_json, soft_wrap=True)  # a line stays whole when piped
    backend = _backend_for(ctx, backend, model, topology, console)
    spec = _spec(
        dataset,
        release,
        param_release,
        label=label,
        n_passive=passive,
        passive_features=passive_features,
        encoding=encoding,
        backend=backend,
        model=model,
        topology=topology,
        embedding=embedding,
        hidden=opt.widths(hidden),
        max_depth=max_depth,
        trees=trees,
        epochs=_epochs_for(ctx, epochs, model, console),
        batch_size=batch_size,
        learning_rate=learning_rate,
        optimizer=optimizer,
        l2=l2,
        train_rows=train_rows,
        early_stopping_patience=early_stopping_patience,
        validation_fraction=validation_fraction,
        seed=seed,
        scaling=scaling,
        allow_plain=compare_plain,  # the comparison run is a plain session
        embedding_release=opt.embedding_steps(embedding_release),
        gradient_defense=gradient_defense or (),
    )
    with _refused(), _progress(console, as_json) as (bar, _, phases):
        tasks: dict[str, int] = {}
        with phases("load", f"reading {dataset}"):
            _data_notes(spec, console)  # parsed once per process; the bound check and the dealer share it
        spec = _scaling_within_bound(ctx, spec, console)
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


@contextlib.contextmanager
def _progress(console, as_json: bool) -> Iterator[tuple[Any, Callable[[str], None], Any]]:  # type: ignore[no-untyped-def]
    """The long commands' progress: one line per phase (and per attack) everywhere, piped output included (on
    stderr with --json), and bars in a terminal. Yields the bars, the line printer and the timed phases."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from vflsec.client.demo import Phases

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=as_json or not console.is_terminal,  # bars in a terminal; the phase lines everywhere
    ) as bar:

        def log(line: str) -> None:  # phase lines print above the bars
            bar.console.print(line, markup=False)

        @contextlib.contextmanager
        def phase_bar(what: str, total: int | None) -> Iterator[Callable[..., None]]:
            task = bar.add_task(what, total=total)  # None: a pulse and the elapsed time until it ends
            counted = [total]

            def advance(n: int, new_total: int | None = None) -> None:
                if new_total is not None and new_total != counted[0]:
                    counted[0] = new_total
                    bar.update(task, total=new_total)
                bar.advance(task, n)

            yield advance
            if counted[0] is None:  # no counts to keep: its phase line says how long it took
                bar.remove_task(task)
            else:
                bar.update(task, completed=counted[0])

        yield bar, log, Phases(log, phase_bar)


def _print_early_stopping(result: dict, console) -> None:  # type: ignore[no-untyped-def]
    """The early-stopping line of a demo or attack report that asked for it."""
    if "early_stopping" in result:
        from vflsec.client.training import TrainingRecord

        console.print(TrainingRecord.from_dict(result["early_stopping"]).summary())


def _report(result: dict, as_json: bool, console) -> None:  # type: ignore[no-untyped-def]
    from rich.table import Table

    table = Table(title=f"vflsec demo: {result['dataset']}", show_header=False)
    for key, value in result.items():
        if key != "early_stopping":  # its own line below (and the JSON)
            table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    console.print(table)
    _print_early_stopping(result, console)
    if "majority_rate" in result:
        from vflsec.client.harness import accuracy_warning

        warning = accuracy_warning(result["accuracy"], result["majority_rate"])
        if warning:
            console.print(f"warning: {warning}")
    if as_json:
        sys.stdout.write(json.dumps(result) + "\n")


@app.command()
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
    from vflsec.client.federation import compose_ports, write_federation

    embedding = opt.embedding_steps(embedding_release)
    if embedding and not allow_plain:  # the defense acts in active-top sessions, which run on the plain backend
        _fail("--embedding-release acts in split-NN active-top sessions only, which run on the plain backend: "
              "add --allow-plain")  # fmt: skip
    # The passive parties' TOMLs get the chain, checked as the split-NN active-top sessions it acts in will use it.
    active_top = {"model": "splitnn", "topology": "active-top", "backend": "plain"} if embedding else {}
    spec = _spec(
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
    with _refused():
        layout = write_federation(spec, out)
    if allow_plain:
        typer.echo("note: the coordinator allows the plain backend ([policy] allowed_backends = ckks, plain)")
    for party, config in layout.configs.items():
        typer.echo(f"{party}: {config}")


@app.command()
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

    from vflsec.client.demo import evaluate, operator_labels
    from vflsec.client.federation import wait_for
    from vflsec.services.transport.server import peer_channel
    from vflsec.services.transport.tls import TlsFiles

    # The federation was dealt elsewhere: the spec carries the operator's session, named by its labels file.
    spec = _spec(
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
    with peer_channel(active, "active", files, 256 * 1024 * 1024) as channel, _refused():
        wait_for(channel, "active", wait)
        result = evaluate(channel, operator_labels(labels), spec, compare_plain=compare_plain)
    _report(result, as_json, Console(stderr=as_json))


@app.command()
def health(
    address: Annotated[str | None, typer.Option(help="host:port of the service.")] = None,
    party: Annotated[str | None, typer.Option(help="The service's party id (its certificate must say so).")] = None,
    tls_dir: opt.TlsDir = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="A party's own TOML config instead of the three options above: checks that party on localhost at "
            "its listen port with its own certificate (the Kubernetes probe).",
        ),
    ] = None,
    timeout: Annotated[float, typer.Option()] = 3.0,
) -> None:
    """gRPC health check over mutual TLS; exit 0 when SERVING (used by compose health checks and k8s probes)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from vflsec.services.config import ConfigError, load_config
    from vflsec.services.transport.server import peer_channel, tls_files
    from vflsec.services.transport.tls import TlsFiles

    if config is not None:
        if (address, party, tls_dir) != (None, None, None):
            _fail("--config replaces --address, --party and --tls-dir: give either it or all three")
        try:
            cfg = load_config(config)
        except ConfigError as exc:
            _fail(str(exc))
        address, party, files = "localhost:" + cfg.listen.rsplit(":", 1)[1], cfg.party_id, tls_files(cfg.tls)
    elif address is None or party is None or tls_dir is None:
        _fail("give --address, --party and --tls-dir (or a party's --config)")
    else:
        files = TlsFiles.from_dir(tls_dir)
    try:
        channel = peer_channel(address, party, files, 4 * 1024 * 1024)
    except OSError as exc:  # a TLS file missing or unreadable (a Secret not created or not mounted)
        _fail(f"cannot read the TLS files: {exc}")
    with channel:
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
    ctx: typer.Context,
    dataset: opt.Dataset = "digits",
    label: opt.Label = None,
    passive: opt.Passive = 1,
    passive_features: opt.PassiveFeatures = None,
    attacks: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated attack names (`vflsec attacks list`); a leading + adds them to the defaults "
            "(e.g. +rcc1). Default: every attack of the model family but the slow opt-in ones the report names "
            "(for LR the defense-aware ones for the release chains included)."
        ),
    ] = None,
    attack_option: Annotated[
        list[str] | None,
        typer.Option(
            "--attack-option",
            metavar="ATTACK.KEY=VALUE",
            help="A parameter of one attack (e.g. ram.n_refine=50); repeatable.",
        ),
    ] = None,
    predictions: Annotated[int, typer.Option(min=1, help="Samples the active party queries after training.")] = 1000,
    encoding: opt.Encoding = "onehot",
    backend: opt.Backend = "ckks",
    model: opt.Model = "lr",
    topology: opt.Topology = "coordinator-top",
    embedding: opt.Embedding = 16,
    hidden: opt.Hidden = "32",
    max_depth: opt.MaxDepth = 0,
    trees: opt.Trees = 0,
    epochs: opt.AutoEpochs = 0,
    batch_size: opt.BatchSize = 0,
    learning_rate: opt.LearningRate = 0.1,
    optimizer: opt.Optimizer = "adam",
    l2: opt.L2 = 1e-4,
    train_rows: opt.TrainRows = None,
    early_stopping_patience: opt.EarlyStoppingPatience = 0,
    validation_fraction: opt.ValidationFraction = 0.2,
    mse_scope: Annotated[
        str,
        typer.Option(
            "--mse-scope",
            metavar="queried|all",
            help="MSE over the queried rows, or all: the training rows too (varasteh; they are then queried as "
            "well, and AM/RAM fit them in-sample).",
        ),
    ] = "queried",
    seed: opt.Seed = 0,
    withhold_model: Annotated[bool, typer.Option(help="Do not fetch the model (black-box setting).")] = False,
    windows: Annotated[int, typer.Option(min=1, help="Average over this many cyclic windows of passive columns.")] = 1,
    release: opt.Release = None,
    param_release: opt.ParamRelease = None,
    embedding_release: opt.EmbeddingRelease = None,
    gradient_defense: opt.GradientDefense = None,
    markdown: Annotated[Path | None, typer.Option(help="Also write the table as markdown here.")] = None,
    attacker: Annotated[
        str,
        typer.Option(
            "--attacker",
            metavar="active|passive-N",
            help="The curious party: the active party (feature attacks on what it receives), or a passive party "
            "(label attacks on what it receives in training: split-NN gradients, its own LR gradients and block, the "
            "tree partitions; and model completion with k labelled rows).",
        ),
    ] = "active",
    as_json: opt.Json = False,
) -> None:
    """Train through the real services with the curious plugin on the active party, attack its recordings,
    and compare the reconstructions with the passive parties' true features (MSE vs blind baselines). Trees keep
    the passive thresholds with their owners by default: luo's PRA / GRN-RF setting is one explicit option away,
    `--model tree --attacks pra --param-release thresholds`. With `--attacker passive-1` the curious party is a
    passive one: it infers the labels from what it receives in training, in every family (AUC vs 0.5 and the majority
    rate; accuracy for more classes)."""
    from rich.console import Console
    from rich.table import Table

    from vflsec.client.harness import (
        LABEL_ATTACKS,
        MSE_SCOPES,
        OPT_IN_ATTACKS,
        SPLITNN_OPT_IN,
        YE_COLUMN,
        AttackScenario,
        check_attack_options,
        default_attacks,
        headline,
        label_markdown,
        labelled_line,
        markdown_table,
        run_attack_scenario,
        ye_accuracy_cell,
    )
    from vflsec.services.attacks import ATTACKS

    attackers = ["active", *(f"passive-{i}" for i in range(1, passive + 1))]
    if attacker not in attackers:
        _fail(f"--attacker must be one of {', '.join(attackers)}, got {attacker!r}")
    if attacker != "active" and windows > 1:
        _fail(f"--windows averages feature MSEs over passive columns: not with --attacker {attacker}")
    extra = attacks is not None and attacks.strip().startswith("+")  # +NAME,...: the defaults and these
    names = None if attacks is None else [a.strip() for a in attacks.strip().lstrip("+").split(",") if a.strip()]
    unknown = sorted(set(names or ()) - set(ATTACKS))
    if unknown:
        _fail(f"unknown attack(s) {unknown}; known: {', '.join(sorted(ATTACKS))}")
    console = Console(stderr=as_json, soft_wrap=True)  # a line stays whole when piped
    backend = _backend_for(ctx, backend, model, topology, console)
    spec = _spec(
        dataset,
        release,
        param_release,
        label=label,
        n_passive=passive,
        passive_features=passive_features,
        encoding=encoding,
        backend=backend,
        model=model,
        topology=topology,
        embedding=embedding,
        hidden=opt.widths(hidden),
        max_depth=max_depth,
        trees=trees,
        epochs=_epochs_for(ctx, epochs, model, console),
        batch_size=batch_size,
        learning_rate=learning_rate,
        optimizer=optimizer,
        l2=l2,
        train_rows=train_rows,
        early_stopping_patience=early_stopping_patience,
        validation_fraction=validation_fraction,
        seed=seed,
        embedding_release=opt.embedding_steps(embedding_release),
        gradient_defense=gradient_defense or (),
    )
    _data_notes(spec, console)
    if mse_scope not in MSE_SCOPES:
        _fail(f"--mse-scope must be one of {', '.join(MSE_SCOPES)}, got {mse_scope!r}")
    for name in names or ():  # before any party starts: an attack that cannot read this family's model
        try:
            ATTACKS.check_family(name, spec.model)
        except ValueError as exc:
            _fail(f"{exc}; the attacks of --model {spec.model}: {', '.join(ATTACKS.names(spec.model))}")
    extra_names, names = (names or [], None) if extra else ([], names)
    defaults = (
        list(LABEL_ATTACKS.get(spec.model, ()))
        if attacker != "active"
        else default_attacks(spec.score_release, spec.param_release, spec.model, spec.embedding_release)
    )
    try:
        requested = opt.attack_options(attack_option)
        if names is None:  # an option of an opt-in attack (e.g. labelled_rows.k=2000) asks for that attack
            extra_names += [n for n in requested if n in {**OPT_IN_ATTACKS, **SPLITNN_OPT_IN} and n not in extra_names]
        chosen = names if names is not None else [*defaults, *extra_names]
        attack_options = check_attack_options(requested, chosen, spec.model)
    except ValueError as exc:
        _fail(str(exc))
    scenario = AttackScenario(
        spec,
        attacks=names,
        extra_attacks=extra_names,
        compare_undefended=True,  # "what does my defense cost": the same model and rows without the chains
        attack_options=attack_options,
        predictions=predictions,
        release_model=not withhold_model,
        windows=windows,
        mse_scope=mse_scope,
        attacker=attacker,
    )
    with _refused(), _progress(console, as_json) as (bar, log, phases):
        training: list[int] = []  # the training bar's task, made at the first step (its total is known then)

        def on_step(epoch: int, epochs: int, batch: int, n_batches: int) -> None:
            if not training:
                training.append(bar.add_task("training", total=epochs * n_batches))
            bar.update(training[0], completed=(epoch - 1) * n_batches + batch)

        report = run_attack_scenario(scenario, log, phases, on_step)
    if attacker != "active":
        _print_label_report(report, console)
        if markdown is not None:
            markdown.write_text(label_markdown(report))
        if as_json:
            sys.stdout.write(json.dumps(report) + "\n")
        return
    table = Table(
        title=f"feature inference on {report['dataset']} (d_passive = {report['d_passive']}, "
        f"n = {report['n_samples']}, accuracy = {report['accuracy']:.4f}, "
        f"majority class {report['majority_rate']:.4f})"
    )
    ye = any("ye_accuracy" in r for r in report["attacks"].values())  # ye's binary-feature measure, when it ran
    for column in ("attack", "MSE (clipped)", "raw MSE", "seconds", *([YE_COLUMN] if ye else [])):
        table.add_column(column)
    for name, mse in report["baselines"].items():
        table.add_row(f"{name} (baseline)", f"{mse:.6g}", "", "", *([""] if ye else []))
    for name, r in report["attacks"].items():
        label = f"{name} (aware)" if r.get("aware") else name
        if "labelled_rows" in r:  # auxiliary knowledge, scored on the other rows (its line below the table)
            label = f"{name} ({r['labelled_rows']} labelled rows given)"
        if "not_applicable" in r:
            table.add_row(label, f"n/a: {r['not_applicable']}", "", "", *([""] if ye else []))
        else:
            cells = (f"{r['mse_clipped']:.6g}", f"{r['mse']:.6g}", f"{r['seconds']:.3f}")
            table.add_row(label, *cells, *([ye_accuracy_cell(r)] if ye else []))
    console.print(table)
    if "strongest" in report:
        console.print(headline(report))
    if "undefended" in report:  # the same model and query rows without the chains: what the defense costs
        u = report["undefended"]
        before = "none ran" if u["strongest"] is None else f"{u['strongest']['attack']} {u['mse']:.6g}"
        console.print(f"undefended (same model, same rows): accuracy {u['accuracy']:.4f}, strongest {before}",
                      markup=False)  # fmt: skip
        console.print(f"verdict: {report['verdict']}", markup=False)
        console.print(report["scaling_note"], markup=False)
    for name, r in report["attacks"].items():
        if "labelled_rows" in r:
            console.print(labelled_line(name, r), markup=False)
    if report.get("left_out"):
        names_out = ", ".join(f"{n} ({why})" for n, why in report["left_out"].items())
        console.print(f"left out of the defaults: {names_out}; add with --attacks +{','.join(report['left_out'])}",
                      markup=False)
    console.print(f"queries: {report['queries_note']}; {report['n_train']} rows trained the model, "
                  f"{report['query_rows_in_training']} of them queried", markup=False)
    console.print(f"batch size {report['batch_size']}: {report['batch_size_note']}")
    if report.get("embedding_release"):  # the width follows the defense when the session leaves it free
        steps = ", ".join(f"{n}:" + ",".join(f"{k}={v}" for k, v in p.items()) for n, p in report["embedding_release"])
        width = report["embedding_width"]
        console.print(f"passive embedding defense {steps}: z_p {width} wide, as the party announced")
    console.print(f"epochs {report['epochs']}: {report['epochs_note']}")
    scope = "the queried rows" if report["mse_scope"] == "queried" else "the training and the queried rows"
    console.print(f"MSE scope {report['mse_scope']}: over {scope} ({report['n_samples']} samples)")
    _print_early_stopping(report, console)
    if report.get("accuracy_warning"):
        console.print(f"warning: {report['accuracy_warning']}")
    if markdown is not None:
        markdown.write_text(markdown_table(report))
    if as_json:
        sys.stdout.write(json.dumps(report) + "\n")


def _print_label_report(report: dict[str, Any], console: Any) -> None:
    """A passive attacker's report: each label attack's AUC (accuracy for more classes) beside the blind baselines."""
    from rich.table import Table

    from vflsec.client.harness import label_line

    binary = report["n_classes"] == 2
    rates = ", ".join(f"{r:.3f}" for r in report["class_rates"])
    seen = f"{report['steps']} steps" if report["steps"] else f"{report['nodes']} nodes"
    table = Table(
        title=f"label inference by {report['attacker']} on {report['dataset']} ({report['model']}, "
        f"{report['n_samples']} training rows, {seen}; class rates {rates}; accuracy = {report['accuracy']:.4f})"
    )
    columns = ("AUC", "AUC per step (mean)") if binary else ("accuracy", "recall per class")
    for column in ("attack", *columns, "seconds"):
        table.add_column(column)
    if binary:
        table.add_row("blind (baseline)", "0.5", "0.5", "")
    else:
        table.add_row("majority (baseline)", f"{report['baselines']['majority_rate']:.4f}", "", "")
    for name, r in report["attacks"].items():
        if "not_applicable" in r:
            table.add_row(name, f"n/a: {r['not_applicable']}", "", "")
            continue
        label = f"{name} ({r['labelled_rows']} labelled rows given)" if "labelled_rows" in r else name
        if binary:
            step = "n/a" if r.get("auc_per_step") is None else f"{r['auc_per_step']:.4f}"
            table.add_row(label, f"{r['auc']:.4f}", step, f"{r['seconds']:.3f}")
        else:
            recall = ", ".join("n/a" if v is None else f"{v:.2f}" for v in r["recall_per_class"])
            table.add_row(label, f"{r['accuracy']:.4f}", recall, f"{r['seconds']:.3f}")
    console.print(table)
    console.print(f"majority rate of the scored rows: {report['baselines']['majority_rate']:.4f}", markup=False)
    for name, r in report["attacks"].items():
        if "own_features" in r:  # the same learner on the same labelled rows, on the party's raw features alone
            console.print(f"{name}: {label_line(r)}; on its own features alone {label_line(r['own_features'])}; "
                          f"majority rate of those rows {r['majority_rate']:.4f}", markup=False)  # fmt: skip
    if report.get("strongest"):
        figure = "auc" if binary else "accuracy"
        best = report["strongest"]
        console.print(f"strongest: {best['attack']} ({figure} {best[figure]:.4f})", markup=False)
    console.print(report["label_note"], markup=False)
    console.print(f"batch size {report['batch_size']}: {report['batch_size_note']}", markup=False)
    console.print(f"epochs {report['epochs']}: {report['epochs_note']}", markup=False)
    if report.get("accuracy_warning"):
        console.print(f"warning: {report['accuracy_warning']}", markup=False)
    if "undefended" in report:  # trained again without the gradient defense: what it costs and what it stops
        u = report["undefended"]
        best = u["strongest_either_way"]
        before = "none ran" if best is None else f"{best['attack']} AUC {best['auc']:.4f}"
        console.print(f"undefended (same federation, trained without the defense): accuracy {u['accuracy']:.4f}, "
                      f"strongest {before}", markup=False)  # fmt: skip
        for name, guarantee in report["gradient_accounting"].items():
            console.print(f"{name}: ε = {guarantee['epsilon']:.4g}, δ = {guarantee['delta']:.3g} "
                          f"({guarantee['guarantee']})", markup=False)  # fmt: skip
        console.print(f"verdict: {report['verdict']}", markup=False)
        console.print(report["remaining"], markup=False)


@bench_app.command("he")
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
    from vflsec.client.bench_he import run

    result = run(
        rows=rows, epochs=epochs, log=lambda line: typer.echo(line, err=as_json), processes=processes, profile=profile
    )
    if as_json:
        typer.echo(json.dumps(result))


@bench_app.command("release")
def bench_release(
    batch: Annotated[int, typer.Option(min=1)] = 1000,
    ks: Annotated[str, typer.Option(help="Comma-separated class counts.")] = "10,100,1000,10000",
    repeats: Annotated[int, typer.Option(min=1)] = 5,
    as_json: opt.Json = False,
) -> None:
    """Latency of every score-release defense per batch and per vector, next to a per-row PRIVEE reference."""
    from vflsec.client import bench_release as bench

    result = bench.run(batch, tuple(int(k) for k in ks.split(",")), repeats)
    typer.echo(bench.table(result), err=as_json)
    if as_json:
        typer.echo(json.dumps(result))


@bench_app.command("attacks")
def bench_attacks(as_json: opt.Json = False) -> None:
    """Attack run times on synthetic tasks (RCC2, RCC1 on 1,000 samples; GRN on 10,000 predictions; ye Algorithm 2
    on 41,188 embeddings)."""
    from vflsec.client import bench_attacks as bench

    result = bench.run()
    for label, seconds in result["seconds"].items():
        typer.echo(f"{label:<22} {seconds:8.3f} s   MSE {result['mse'][label]:.5f}", err=as_json)
    for label, case in result["binary"].items():  # ye's binary attacks: accuracy, not MSE
        typer.echo(f"{label:<22} {case['seconds']:8.3f} s   accuracy {case['accuracy']:.4f}", err=as_json)
    if as_json:
        typer.echo(json.dumps(result))


@bench_app.command("embedding")
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
    from vflsec.client.bench_embedding import run

    result = run(rows=sample, epochs=epochs, runs=runs, log=lambda line: typer.echo(line, err=as_json))
    if as_json:
        typer.echo(json.dumps(result))


@bench_app.command("cli")
def bench_cli(
    backends: Annotated[str, typer.Option("--backends", help="Comma-separated: plain, ckks.")] = "plain,ckks",
    as_json: opt.Json = False,
) -> None:
    """Issue 16's `vflsec attack` on Bank with the former defaults (--epochs 30) and today's, one after the other
    per backend: wall and CPU seconds (the whole process tree), phases, accuracy, ratios."""
    from vflsec.client import bench_cli as bench

    result = bench.run([b.strip() for b in backends.split(",") if b.strip()], log=lambda s: typer.echo(s, err=True))
    typer.echo(bench.table(result), err=as_json)
    if as_json:
        typer.echo(json.dumps(result))


@bench_app.command("plugin")
def bench_plugin(
    rows: opt.Rows = 30000,
    backend: opt.Backend = "ckks",
    as_json: opt.Json = False,
) -> None:
    """Inference throughput with and without the curious plugin recording (through the real services)."""
    from vflsec.client.bench_plugin import run

    result = run(rows=rows, backend=backend, log=lambda line: typer.echo(line, err=as_json))
    if as_json:
        typer.echo(json.dumps(result))


@bench_app.command("align")
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
    as_json: opt.Json = False,
) -> None:
    """PSI alignment seconds against the floor (curve operations x per-op cost / workers) and each party's peak
    memory; --rows ids per party (90 % common), one process per party ($VFLSEC_PSI_WORKERS sets the workers)."""
    from vflsec.client.bench_align import TRANSPORTS, run

    if rows < 10:
        _fail(f"--rows must be at least 10, got {rows}")
    if transport not in TRANSPORTS:
        _fail(f"--transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
    if parties is not None and passive not in (1, parties):
        _fail(f"--parties is the old name of --passive: give one of them, not --passive {passive} --parties {parties}")
    result = run(rows, parties or passive, log=lambda line: typer.echo(line, err=as_json), transport=transport)
    if not result["correct"]:
        _fail("the alignment did not return exactly the known common ids")
    if as_json:
        typer.echo(json.dumps(result))


@bench_app.command("load")
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
    from vflsec.client.bench_load import run

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


@bench_app.command("scale")
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
    from vflsec.client.bench_scale import markdown_table, run

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


@app.command()
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

    from vflsec.client.federation import check_release_chains
    from vflsec.client.operator import forecast_risk
    from vflsec.services.transport.tls import TlsFiles

    with _refused():
        check_release_chains(param_release=param_release or (), family="lr")  # disclosure is of LR's W_p
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
    from vflsec.client.harness import AttackScenario, privacy_curve
    from vflsec.client.param_curve import write_curve

    # The plain backend is exact: the same seed trains the same model at every ε (harness.privacy_curve).
    spec = _spec(dataset, passive_features=passive_features, backend="plain", epochs=epochs)
    base = AttackScenario(spec, predictions=10**9)
    with _refused():
        rows = privacy_curve(base, [float(e) for e in epsilons.split(",")])
    png, table = write_curve(rows, out, f"varasteh PPS on {dataset} (through the services)")
    typer.echo(table.read_text(), err=as_json)
    typer.echo(f"wrote {png} and {table}", err=as_json)
    if as_json:
        typer.echo(json.dumps({"dataset": dataset, "rows": rows}))


@app.command()
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

    from vflsec.client import experiment as exp

    try:
        scenario = exp.load_scenario(scenario_file)
    except (exp.ScenarioError, OSError) as exc:
        _fail(str(exc))
    cells = exp.expand(scenario)
    console = Console(stderr=as_json)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, TextColumn("ETA"), TimeRemainingColumn(), console=console) as bar, _refused():
        task = bar.add_task(f"{scenario.name}: cells", total=len(cells))

        def on_cell(cell: exp.Cell, result: dict | None) -> None:
            bar.advance(task)
            if result is None:
                bar.console.print(f"already finished: {cell.label}")
            else:
                bar.console.print(f"finished: {cell.label} (accuracy {result['report']['accuracy']:.4f})")

        summary = exp.run_experiment(scenario, out, workers=workers, ray_address=ray, on_cell=on_cell)
    from vflsec.client.label_experiment import label_table

    if summary["rows"]:
        console.print(exp.summary_table(summary))
    if summary.get("label_rows"):  # a passive attacker's label attacks
        console.print(label_table(summary))
    console.print(f"verdict: {summary['verdict']}", markup=False, soft_wrap=True)
    formula = summary["dcs_formula"] if summary["rows"] else summary["label_dcs_formula"]
    console.print(f"{formula}; every attack per row: {out / 'results.md'}", markup=False)
    console.print(f"wrote {out / 'results.json'}, {out / 'results.md'} and {', '.join(summary['plots'])}")
    if as_json:
        sys.stdout.write(json.dumps({k: v for k, v in summary.items() if k != "cells"}) + "\n")


class _ClaimsHelp(typer.core.TyperCommand):
    """reproduce --help lists the registered claim names (the registry is imported for the help only)."""

    def format_epilog(self, ctx, formatter) -> None:  # type: ignore[no-untyped-def]
        from vflsec.client.reproduce import CLAIMS

        formatter.write_paragraph()
        formatter.write_text("Claims: " + ", ".join(CLAIMS))
        super().format_epilog(ctx, formatter)


@app.command(cls=_ClaimsHelp)
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
    from vflsec.client import reproduce as rep

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
        _fail(str(exc))

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


attacks_app = typer.Typer(help="The attack suite's registered attacks.", no_args_is_help=True)
app.add_typer(attacks_app, name="attacks")
defenses_app = typer.Typer(help="The registered defense steps (score, parameter and embedding release).",
                           no_args_is_help=True)  # fmt: skip
app.add_typer(defenses_app, name="defenses")


def _plugins_list(kind: str, as_json: bool) -> None:
    from vflsec.client.catalog import plugin_line, plugins

    rows = plugins(kind)
    for row in rows:
        typer.echo(plugin_line(row), err=as_json)
    if as_json:
        typer.echo(json.dumps(rows))


@attacks_app.command("list")
def attacks_list(as_json: opt.Json = False) -> None:
    """Every attack: name (for --attacks), model families, parameters (--attack-option) with defaults, one line."""
    _plugins_list("attacks", as_json)


@defenses_app.command("list")
def defenses_list(as_json: opt.Json = False) -> None:
    """Every defense step: name, where it goes (--release, --param-release, --embedding-release, --gradient-defense),
    families, parameters (STEP:key=value) with defaults, one line."""
    _plugins_list("defenses", as_json)


datasets_app = typer.Typer(help="The datasets a command accepts, and how one would be dealt.", no_args_is_help=True)
app.add_typer(datasets_app, name="datasets")


@datasets_app.command("list")
def datasets_list(as_json: opt.Json = False) -> None:
    """Built-in names (the UCI ones when their files are in the datasets folder, $VFLSEC_DATASETS)."""
    from vflsec.client.catalog import catalog
    from vflsec.services.data.datasets import shared_datasets_dir

    found = catalog()
    for name, description in found.items():
        typer.echo(f"{name:<14} {description}", err=as_json)
    typer.echo(f"datasets folder: {shared_datasets_dir() or 'not found (set VFLSEC_DATASETS)'}", err=as_json)
    if as_json:
        typer.echo(json.dumps(found))


@datasets_app.command("show")
def datasets_show(
    name: Annotated[str, typer.Argument(help="A name from `vflsec datasets list`, or a CSV path.")],
    label: opt.Label = None,
    encoding: opt.Encoding = "onehot",
    passive: opt.Passive = 1,
    passive_features: opt.PassiveFeatures = None,
    seed: opt.Seed = 0,
    as_json: opt.Json = False,
) -> None:
    """Rows, classes, columns before and after encoding, and which would be passive for a selection."""
    from rich.console import Console

    from vflsec.client.catalog import describe, lines

    spec = _spec(name, label=label, encoding=encoding, n_passive=passive, passive_features=passive_features, seed=seed)
    _data_notes(spec, Console(stderr=True))
    with _refused():
        info = describe(spec)
    for line in lines(info):
        typer.echo(line, err=as_json)
    if as_json:
        typer.echo(json.dumps(info))


def main() -> None:
    from vflsec.client.federation import Stopped, stop_on_signals

    try:
        with stop_on_signals():
            app()
    except Stopped as stop:  # the parties are stopped and the temporary folders gone by now: say so, exit 128 + n
        done = "; ".join(stop.cleaned) or "nothing was running"
        sys.stderr.write(f"stopped by {signal_name(stop.signum)}: {done}\n")
        raise SystemExit(128 + stop.signum) from None


def signal_name(signum: int) -> str:
    import signal

    return signal.Signals(signum).name


if __name__ == "__main__":
    main()
