"""``vflsec serve`` (one party's gRPC service) and ``vflsec health`` (its health check over mutual TLS)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from vflsec.client import options as opt
from vflsec.client.commands.common import fail


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
        fail(str(exc))
    from vflsec.client.profiling import maybe_profile

    with maybe_profile(cfg.party_id):  # VFLSEC_PROFILE_DIR set: where this party's time goes (bench he --profile)
        try:
            serve_party(cfg)
        except (ValueError, OSError) as exc:  # its data, a file it names or a defense refused at start: no traceback
            fail(f"{role} {cfg.party_id} cannot start: {exc}")




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
            fail("--config replaces --address, --party and --tls-dir: give either it or all three")
        try:
            cfg = load_config(config)
        except ConfigError as exc:
            fail(str(exc))
        address, party, files = "localhost:" + cfg.listen.rsplit(":", 1)[1], cfg.party_id, tls_files(cfg.tls)
    elif address is None or party is None or tls_dir is None:
        fail("give --address, --party and --tls-dir (or a party's --config)")
    else:
        files = TlsFiles.from_dir(tls_dir)
    try:
        channel = peer_channel(address, party, files, 4 * 1024 * 1024)
    except OSError as exc:  # a TLS file missing or unreadable (a Secret not created or not mounted)
        fail(f"cannot read the TLS files: {exc}")
    with channel:
        try:
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError as exc:
            fail(f"{party} at {address}: {exc.code().name}: {exc.details()}")
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(status.status)
    typer.echo(f"{party} at {address}: {name}")
    if status.status != health_pb2.HealthCheckResponse.SERVING:
        raise typer.Exit(1)

