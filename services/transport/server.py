"""Serving: error mapping for servicers, the gRPC server (mTLS, role checks, health, reflection),
and authenticated channels to peers."""

from __future__ import annotations

import functools
import inspect
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from vflsec.services import common
from vflsec.services.config import ServiceConfig, TlsConfig
from vflsec.services.errors import InvalidArgument, PeerFailed, ServiceError
from vflsec.services.transport import tls

log = logging.getLogger("vflsec")


def peer_failed(peer: str, error: grpc.RpcError) -> PeerFailed:
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNAVAILABLE
    details = error.details() if hasattr(error, "details") else str(error)
    return PeerFailed(peer, code.name, details)


def _status_of(exc: Exception) -> tuple[grpc.StatusCode, str]:
    if isinstance(exc, ServiceError):
        return grpc.StatusCode[exc.code], str(exc)
    if isinstance(exc, grpc.RpcError):  # a peer call that nobody wrapped: keep its status
        failed = peer_failed("peer", exc)
        return grpc.StatusCode[failed.code], str(failed)
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
        with common.collect_after_reply() as ahead:
            try:
                return method(self, request, context)
            except Exception as exc:
                context.abort(*_status_of(exc))
            finally:
                if ahead:  # common.after_reply: started once the reply (or the status) has gone
                    work = list(ahead)
                    if not context.add_callback(lambda: common.run_idle(work)):
                        common.run_idle(work)  # the call had ended already

    return unary


def channel_options(max_message_bytes: int) -> list[tuple[str, Any]]:
    # Ciphertexts are ~300 KB each and a batch carries many: limits are raised deliberately, not removed.
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


def tls_files(config: TlsConfig) -> tls.TlsFiles:
    return tls.TlsFiles(ca=config.ca, cert=config.cert, key=config.key)


def peer_channel(
    address: str, peer_id: str, files: tls.TlsFiles, max_message_bytes: int, *, aio: bool = False
) -> grpc.Channel | grpc.aio.Channel:
    """A mutual-TLS channel that only accepts a server certificate issued to ``peer_id`` (identity pinning); with
    ``aio``, a grpc.aio channel (made inside the event loop that uses it)."""
    options = [*channel_options(max_message_bytes), ("grpc.ssl_target_name_override", peer_id)]
    secure_channel = grpc.aio.secure_channel if aio else grpc.secure_channel
    return secure_channel(address, tls.channel_credentials(files), options=options)


@dataclass(frozen=True)
class CallPolicy:
    """Deadline of one attempt, and how long to keep retrying a peer that is UNAVAILABLE (restarting)."""

    timeout: float = 600.0
    retry_seconds: float = 60.0
    first_backoff: float = 0.1
    max_backoff: float = 2.0


DEFAULT_CALL_POLICY = CallPolicy()


def call(peer: str, fn: Callable[..., Any], request: Any, policy: CallPolicy = DEFAULT_CALL_POLICY) -> Any:
    """Call a peer RPC with a deadline; retry with exponential backoff while the peer is UNAVAILABLE (every
    party RPC is safe to repeat: steps are idempotent, see docs/protocol.md; only the PSI exchange is answered
    once per session, so its retry after a peer crash is FAILED_PRECONDITION). A failure becomes PeerFailed
    carrying the peer's status."""
    give_up = time.monotonic() + policy.retry_seconds
    backoff = policy.first_backoff
    while True:
        try:
            return fn(request, timeout=policy.timeout)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() + backoff > give_up:
                raise peer_failed(peer, exc) from exc
            log.warning("%s unavailable (%s); retrying in %.1f s", peer, exc.details(), backoff)
            time.sleep(backoff)
            backoff = min(2 * backoff, policy.max_backoff)


def decoding_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """``handler`` rebuilt so that undecodable request bytes become INVALID_ARGUMENT.

    grpc reports a request its deserializer rejects (garbage, truncated protobuf, invalid UTF-8 in a string
    field) as INTERNAL, which would blame the server for the caller's bytes. The handler is rebuilt to receive
    raw bytes and decode them itself; in a request stream (PsiExchangeStream) each message is decoded as the
    servicer reads it, and a bad one is InvalidArgument raised there (the servicer's ``rpc`` wrapper reports it).
    It holds no call's state: :class:`tls.RoleInterceptor` makes it once per method, inside its role check.
    """
    decode = handler.request_deserializer
    if decode is None:
        return handler
    if handler.request_streaming:
        if handler.stream_stream is None:
            return handler
        stream_behavior = handler.stream_stream

        def decoded_stream(raws: Iterator[bytes], context: grpc.ServicerContext) -> Any:
            return stream_behavior((_decode_or_refuse(decode, raw) for raw in raws), context)

        return grpc.stream_stream_rpc_method_handler(
            decoded_stream, request_deserializer=None, response_serializer=handler.response_serializer
        )
    if handler.unary_unary is not None:
        behavior, rebuild = handler.unary_unary, grpc.unary_unary_rpc_method_handler
    else:
        behavior, rebuild = handler.unary_stream, grpc.unary_stream_rpc_method_handler

    def decoded(raw: bytes, context: grpc.ServicerContext) -> Any:
        try:
            request = decode(raw)
        except Exception as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {type(exc).__name__}: {exc}")
        return behavior(request, context)

    return rebuild(decoded, request_deserializer=None, response_serializer=handler.response_serializer)


def _decode_or_refuse(decode: Callable[[bytes], Any], raw: bytes) -> Any:
    try:
        return decode(raw)
    except Exception as exc:
        raise InvalidArgument(f"malformed request: {type(exc).__name__}: {exc}") from None


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
    add_servicers: Callable[[grpc.Server], None],
    policies: Mapping[str, Mapping[str, frozenset[str]]],
) -> RunningServer:
    """Start a server on ``config.listen`` (port 0 picks a free port) with mTLS and role checks.

    ``policies`` maps each full service name ``add_servicers`` registers (the party's generic service first, then
    its model families' services) to that service's method names and the roles allowed to call them.
    """
    full_policy = {
        f"/{service}/{method}": roles for service, policy in policies.items() for method, roles in policy.items()
    }
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix=config.party_id),
        # One interceptor (each is a pass per call): the role check runs first, so an unauthorized caller learns
        # nothing about how its bytes parse; then the request is decoded.
        interceptors=[tls.RoleInterceptor(full_policy, inner=decoding_handler)],
        # gRPC sets SO_REUSEPORT by default: a second server on a taken port would bind beside the first and split
        # its callers between them. Off, the bind fails and the party says so.
        options=[*channel_options(config.max_message_bytes), ("grpc.so_reuseport", 0)],
    )
    add_servicers(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((*policies, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    try:
        port = server.add_secure_port(config.listen, tls.server_credentials(tls_files(config.tls)))
    except RuntimeError as exc:  # grpcio's "Failed to bind" (older ones returned 0): e.g. the port is taken
        raise OSError(f"cannot listen on {config.listen}: {exc}") from None
    if port == 0:
        raise OSError(f"cannot listen on {config.listen}")
    server.start()
    for name in ("", *policies):
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
