"""Finding 8: TLS 1.3 only, on every party's port and on every vflsec client.

gRPC Python (grpcio 1.85) has no TLS-version option; vflsec pins gRPC's TLS 1.2 cipher list
(GRPC_SSL_CIPHER_SUITES, proto/vflsec/__init__.py) to a pre-shared-key suite gRPC can never negotiate, so no
TLS 1.2 handshake completes while TLS 1.3 (whose suites BoringSSL fixes to AEADs) is unaffected. The probes
use Python's own ``ssl`` (OpenSSL) as the foreign peer, with a valid federation certificate, so the only
thing that can refuse them is the protocol version.
"""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.security.conftest import Federation, federation
from vflsec.services.transport import tls
from vflsec.services.transport.server import peer_channel

TLS13_SUITES = {"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"}


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    with federation(tmp_path_factory.mktemp("tls13"), n_passive=1) as running:
        yield running


def _client_context(files: tls.TlsFiles, version: ssl.TLSVersion) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(files.ca)
    context.load_cert_chain(files.cert, files.key)
    context.minimum_version = context.maximum_version = version
    context.set_alpn_protocols(["h2"])
    return context


def _handshake(address: str, server_name: str, context: ssl.SSLContext) -> tuple[str, str]:
    """(version, cipher) of a completed handshake; raises ssl.SSLError / OSError if the peer refuses it."""
    host, port = address.rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=server_name) as tls_socket,
    ):
        return str(tls_socket.version()), tls_socket.cipher()[0]


@pytest.mark.parametrize("party", ["coordinator", "active", "passive-1"])
def test_every_party_refuses_tls12_and_speaks_tls13(fed: Federation, party: str) -> None:
    address, operator = fed.layout.addresses[party], fed.layout.tls("operator")
    # Before the pin, gRPC accepted this very client at TLS 1.2 (ECDHE-ECDSA-AES256-GCM-SHA384).
    with pytest.raises((ssl.SSLError, OSError)):
        _handshake(address, party, _client_context(operator, ssl.TLSVersion.TLSv1_2))
    version, cipher = _handshake(address, party, _client_context(operator, ssl.TLSVersion.TLSv1_3))
    assert version == "TLSv1.3" and cipher in TLS13_SUITES


class _OneShotServer:
    """A TLS server (Python ssl) that accepts one connection and records how its handshake ended."""

    def __init__(self, files: tls.TlsFiles, version: ssl.TLSVersion) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(files.cert, files.key)
        self.context.load_verify_locations(files.ca)
        self.context.verify_mode = ssl.CERT_REQUIRED
        self.context.minimum_version = self.context.maximum_version = version
        self.context.set_alpn_protocols(["h2"])
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.outcome = ""
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        try:
            with self.context.wrap_socket(conn, server_side=True) as tls_socket:
                self.outcome = str(tls_socket.version())
        except (ssl.SSLError, OSError) as exc:
            self.outcome = f"refused: {exc}"
        finally:
            self.listener.close()


@pytest.mark.parametrize(
    ("version", "completes"),
    [(ssl.TLSVersion.TLSv1_2, False), (ssl.TLSVersion.TLSv1_3, True)],
    ids=["tls1.2", "tls1.3"],
)
def test_vflsec_clients_do_not_speak_tls12(fed: Federation, version: ssl.TLSVersion, completes: bool) -> None:
    """The active party's channel to "the coordinator" completes a TLS 1.3 handshake only."""
    server = _OneShotServer(fed.layout.tls("coordinator"), version)
    with peer_channel(server.address, "coordinator", fed.layout.tls("active"), 1 << 20) as channel:
        with pytest.raises(grpc.RpcError):  # the stand-in speaks no HTTP/2 either way
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        server.thread.join(10)
    assert (server.outcome == "TLSv1.3") is completes, server.outcome
    if not completes:
        assert "NO_SHARED_CIPHER" in server.outcome


# A fresh process serving with vflsec's credentials, as `vflsec serve` does; IMPORTS decides what loads first.
_SERVE = """
import sys
{imports}
from concurrent import futures
from pathlib import Path
server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
port = server.add_secure_port("127.0.0.1:0", tls.server_credentials(tls.Pki(Path(sys.argv[1])).files("coordinator")))
server.start()
print(port, flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize(
    ("imports", "tls12_refused"),
    [
        ("from vflsec.services.transport import tls\nimport grpc", True),  # vflsec entry points import vflsec first
        ("import grpc\nfrom vflsec.services.transport import tls", False),  # grpc loaded unpinned: TLS 1.2 stays on
    ],
    ids=["vflsec-first", "grpc-first"],
)
def test_the_pin_takes_effect_only_before_grpc_loads(tmp_path: Path, imports: str, tls12_refused: bool) -> None:
    pki = tls.make_pki(tmp_path, ["coordinator"])
    env = {k: v for k, v in os.environ.items() if k != "GRPC_SSL_CIPHER_SUITES"}
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVE.format(imports=imports), str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        address = f"127.0.0.1:{int(proc.stdout.readline())}"
        client = _client_context(pki.files("operator"), ssl.TLSVersion.TLSv1_2)
        if tls12_refused:
            with pytest.raises((ssl.SSLError, OSError)):
                _handshake(address, "coordinator", client)
        else:
            assert _handshake(address, "coordinator", client)[0] == "TLSv1.2"
    finally:
        _, stderr = proc.communicate("", timeout=30)
    assert ("TLS 1.2 stays enabled" in stderr) is not tls12_refused
