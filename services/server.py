"""Serving: error mapping for servicers, the gRPC server (mTLS, role checks, health, reflection),
and authenticated channels to peers."""

from __future__ import annotations

import functools
import inspect
import logging
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from vflsec.services import tls
from vflsec.services.config import ServiceConfig, TlsConfig
from vflsec.services.errors import PeerFailed, ServiceError

log = logging.getLogger("vflsec")


def _status_of(exc: Exception) -> tuple[grpc.StatusCode, str]:
    if isinstance(exc, ServiceError):
        return exc.code, str(exc)
    if isinstance(exc, grpc.RpcError):  # a peer call that nobody wrapped: keep its status
        return PeerFailed("peer", exc).code, str(PeerFailed("peer", exc))
    log.exception("internal error")
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


def rpc(method: Callable[..., Any]) -> Callable[..., Any]:
    """Turn engine exceptions into precise gRPC statuses; the service keeps serving."""
    if inspect.isgeneratorfunction(method):

        @functools.wraps(method)
        def stream(self: Any, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            try:
                yield from method(self, request, context)
            except Exception as exc:
                context.abort(*_status_of(exc))

        return stream

    @functools.wraps(method)
    def unary(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except Exception as exc:
            context.abort(*_status_of(exc))

    return unary


def channel_options(max_message_bytes: int) -> list[tuple[str, Any]]:
    # Ciphertexts are ~300 KB each and a batch carries many: limits are raised deliberately, not removed.
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


def tls_files(config: TlsConfig) -> tls.TlsFiles:
    return tls.TlsFiles(ca=config.ca, cert=config.cert, key=config.key)


def peer_channel(address: str, peer_id: str, files: tls.TlsFiles, max_message_bytes: int) -> grpc.Channel:
    """A mutual-TLS channel that only accepts a server certificate issued to ``peer_id`` (identity pinning)."""
    options = [*channel_options(max_message_bytes), ("grpc.ssl_target_name_override", peer_id)]
    return grpc.secure_channel(address, tls.channel_credentials(files), options=options)


def call(peer: str, fn: Callable[..., Any], request: Any, timeout: float = 600.0) -> Any:
    """Call a peer RPC; a failure becomes PeerFailed carrying the peer's status."""
    try:
        return fn(request, timeout=timeout)
    except grpc.RpcError as exc:
        raise PeerFailed(peer, exc) from exc


@dataclass
class RunningServer:
    server: grpc.Server
    port: int
    health: health.HealthServicer

    def stop(self, grace: float = 2.0) -> None:
        self.health.enter_graceful_shutdown()
        self.server.stop(grace).wait()


def start_server(
    config: ServiceConfig,
    add_servicer: Callable[[grpc.Server], None],
    service_name: str,
    policy: Mapping[str, frozenset[str]],
) -> RunningServer:
    """Start a server on ``config.listen`` (port 0 picks a free port) with mTLS and role checks.

    ``policy`` maps method names of ``service_name`` to the roles allowed to call them.
    """
    full_policy = {f"/{service_name}/{method}": roles for method, roles in policy.items()}
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix=config.party_id),
        interceptors=[tls.RoleInterceptor(full_policy)],
        options=channel_options(config.max_message_bytes),
    )
    add_servicer(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((service_name, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    port = server.add_secure_port(config.listen, tls.server_credentials(tls_files(config.tls)))
    if port == 0:
        raise OSError(f"cannot listen on {config.listen}")
    server.start()
    for name in ("", service_name):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return RunningServer(server=server, port=port, health=health_servicer)


def serve_forever(running: RunningServer, on_stop: Callable[[], None] | None = None) -> None:
    """Block until SIGTERM/SIGINT, then drain and stop."""
    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    stopped.wait()
    running.stop()
    if on_stop is not None:
        on_stop()
