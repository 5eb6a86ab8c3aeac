"""Work made ahead in a party's idle time, over real gRPC on loopback: common.after_reply, which the servicers'
``rpc`` wrapper starts once the reply has gone."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from vflsec.services import common
from vflsec.services.errors import InvalidArgument
from vflsec.services.transport.server import rpc

WORK_SECONDS = 0.6


class _Servicer:
    def __init__(self) -> None:
        self.ran: list[str] = []
        self.done = threading.Event()

    def _work(self, name: str) -> None:
        time.sleep(WORK_SECONDS)  # would hold the reply back if it ran before it
        self.ran.append(name)
        self.done.set()

    @rpc
    def Ahead(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        common.after_reply(lambda: self._work(request.decode()))
        if request == b"refuse":
            raise InvalidArgument("request: refused")
        return b"ok"


@pytest.fixture()
def served() -> Iterator[tuple[_Servicer, Any]]:
    servicer = _Servicer()
    handler = grpc.method_handlers_generic_handler(
        "t.T", {"Ahead": grpc.unary_unary_rpc_method_handler(lambda req, ctx: servicer.Ahead(req, ctx))}
    )
    server = grpc.server(futures.ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield servicer, channel.unary_unary("/t.T/Ahead")
    finally:
        channel.close()
        server.stop(None)


@pytest.mark.parametrize("request_bytes", [b"answer", b"refuse"])
def test_work_asked_for_after_reply_runs_once_the_reply_or_refusal_has_gone(
    served: tuple[_Servicer, Any], request_bytes: bytes
) -> None:
    servicer, method = served
    began = time.monotonic()
    if request_bytes == b"refuse":
        with pytest.raises(grpc.RpcError) as refused:
            method(request_bytes, timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    else:
        assert method(request_bytes, timeout=10) == b"ok"
    answered = time.monotonic() - began
    assert answered < WORK_SECONDS / 2 and servicer.ran == []  # the work did not hold the answer back
    assert servicer.done.wait(10) and servicer.ran == [request_bytes.decode()]


def test_after_reply_outside_an_rpc_runs_on_the_idle_thread_at_once() -> None:
    ran = threading.Event()
    names: list[str] = []
    common.after_reply(lambda: (names.append(threading.current_thread().name), ran.set()))
    assert ran.wait(10) and names[0].startswith("ahead")
