"""Mutual TLS and role authorization over real loopback gRPC servers."""

from __future__ import annotations

import ipaddress
import stat
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from vflsec.services.transport.tls import (
    Caller,
    Pki,
    RoleInterceptor,
    TlsFiles,
    _caller_from_pem,
    caller_from_context,
    channel_credentials,
    current_caller,
    make_pki,
    role_of,
    server_credentials,
)

SERVICE = "vflsec.test.Echo"
ECHO = f"/{SERVICE}/Echo"
STREAM = f"/{SERVICE}/Stream"
UNLISTED = f"/{SERVICE}/Unlisted"
HEALTH = "/grpc.health.v1.Health/Check"
POLICY = {ECHO: frozenset({"active", "coordinator"}), STREAM: frozenset({"passive"})}
PARTIES = ("coordinator", "active", "passive-1")
TIMEOUT = 10.0


def _identity(b: bytes) -> bytes:
    return b


def _describe_caller(request: bytes) -> bytes:
    caller = current_caller()
    return f"{caller.party_id}|{caller.role}|".encode() + request


def _echo(request: bytes, context: grpc.ServicerContext) -> bytes:
    # The contextvar and the certificate in the context must agree.
    assert caller_from_context(context) == current_caller()
    return _describe_caller(request)


def _stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
    for i in range(3):
        yield _describe_caller(request + str(i).encode())


def _handlers() -> grpc.GenericRpcHandler:
    methods = {
        name.rsplit("/", 1)[1]: grpc.unary_unary_rpc_method_handler(_echo, _identity, _identity)
        for name in (ECHO, UNLISTED)
    }
    methods["Stream"] = grpc.unary_stream_rpc_method_handler(_stream, _identity, _identity)
    return grpc.method_handlers_generic_handler(SERVICE, methods)


def _health_handler() -> grpc.GenericRpcHandler:
    check = grpc.unary_unary_rpc_method_handler(_echo, _identity, _identity)
    return grpc.method_handlers_generic_handler("grpc.health.v1.Health", {"Check": check})


def _start_server(credentials: grpc.ServerCredentials) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), interceptors=[RoleInterceptor(POLICY)])
    server.add_generic_rpc_handlers((_handlers(), _health_handler()))
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    return server, port


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), PARTIES, hosts=("vfl.example.org", "10.1.2.3"))


@pytest.fixture(scope="module")
def server_port(pki: Pki) -> Iterator[int]:
    server, port = _start_server(server_credentials(pki.files("coordinator")))
    yield port
    server.stop(grace=None)


def _channel(port: int, files: TlsFiles) -> grpc.Channel:
    # A private subchannel pool keeps channels with different client certificates fully separate.
    options = [("grpc.use_local_subchannel_pool", 1)]
    return grpc.secure_channel(f"127.0.0.1:{port}", channel_credentials(files), options=options)


def _call(port: int, files: TlsFiles, method: str = ECHO, payload: bytes = b"hi") -> bytes:
    with _channel(port, files) as channel:
        return channel.unary_unary(method, _identity, _identity)(payload, timeout=TIMEOUT)


def _rpc_error(call: object, *args: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(*args)  # type: ignore[operator]
    return info.value


# ------------------------------------------------------------------------------------------------ roles


@pytest.mark.parametrize(
    ("party", "role"),
    [
        ("coordinator", "coordinator"),
        ("active", "active"),
        ("active-bank", "active"),
        ("passive-1", "passive"),
        ("operator", "operator"),
        ("operator-alice", "operator"),
    ],
)
def test_role_of_maps_party_ids(party: str, role: str) -> None:
    assert role_of(party) == role


@pytest.mark.parametrize("party", ["passive", "coordinator-2", "observer", "activex", "", "../ca", "a_b"])
def test_role_of_rejects_unknown_or_malformed_ids(party: str) -> None:
    with pytest.raises(ValueError):
        role_of(party)


@pytest.mark.parametrize("party", ["active-X", "passive-A", "Operator-alice"])
def test_party_ids_are_lower_case(party: str) -> None:
    """Two ids that differ in case only name one host and, on a case-insensitive volume, one ledger file: refused."""
    with pytest.raises(ValueError, match="lower-case DNS label"):
        role_of(party)


# -------------------------------------------------------------------------------------------------- PKI


def test_leaf_certificate_fields(pki: Pki) -> None:
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    files = pki.files("passive-1")
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())

    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "passive-1"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)[0].value == "passive"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "passive-1", "vfl.example.org"}
    assert set(san.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address(a) for a in ("127.0.0.1", "::1", "10.1.2.3")
    }
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    cert.verify_directly_issued_by(ca)  # raises if not signed by the CA


def test_key_files_are_private_and_operator_is_always_issued(pki: Pki) -> None:
    for party in (*PARTIES, "operator"):
        assert stat.S_IMODE(pki.files(party).key.stat().st_mode) == 0o600
    assert stat.S_IMODE((pki.root / "ca.key").stat().st_mode) == 0o600


def test_files_of_unissued_party_raises(pki: Pki) -> None:
    with pytest.raises(FileNotFoundError, match="passive-9"):
        pki.files("passive-9")


def test_make_pki_reuses_existing_ca(tmp_path: Path) -> None:
    first = make_pki(tmp_path, ["coordinator"])
    ca_before = first.ca_cert.read_bytes()
    second = make_pki(tmp_path, ["passive-2"])

    assert second.ca_cert.read_bytes() == ca_before
    ca = x509.load_pem_x509_certificate(ca_before)
    for party in ("coordinator", "passive-2"):
        x509.load_pem_x509_certificate(second.files(party).cert.read_bytes()).verify_directly_issued_by(ca)

    # A party added later talks to a server issued earlier.
    server, port = _start_server(server_credentials(first.files("coordinator")))
    try:
        with pytest.raises(grpc.RpcError) as info:
            _call(port, second.files("passive-2"))
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED  # got through TLS, denied by role
        assert _call(port, second.files("passive-2"), HEALTH) == b"passive-2|passive|hi"
    finally:
        server.stop(grace=None)


def test_mismatched_ca_key_is_rejected(tmp_path: Path) -> None:
    make_pki(tmp_path / "a", ["active"])
    make_pki(tmp_path / "b", ["active"])
    (tmp_path / "a" / "ca.key").write_bytes((tmp_path / "b" / "ca.key").read_bytes())
    with pytest.raises(ValueError, match="does not hold"):
        make_pki(tmp_path / "a", ["passive-1"])


# ------------------------------------------------------------------------------------- authorization


def test_allowed_role_reaches_servicer_with_its_identity(pki: Pki, server_port: int) -> None:
    assert _call(server_port, pki.files("active")) == b"active|active|hi"
    assert _call(server_port, pki.files("coordinator")) == b"coordinator|coordinator|hi"


def test_streaming_response_sees_caller_while_streaming(pki: Pki, server_port: int) -> None:
    with _channel(server_port, pki.files("passive-1")) as channel:
        replies = list(channel.unary_stream(STREAM, _identity, _identity)(b"x", timeout=TIMEOUT))
    assert replies == [b"passive-1|passive|x0", b"passive-1|passive|x1", b"passive-1|passive|x2"]


def test_wrong_role_is_denied_with_precise_message(pki: Pki, server_port: int) -> None:
    error = _rpc_error(_call, server_port, pki.files("passive-1"))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert error.details() == f"role 'passive' (passive-1) may not call {ECHO}; allowed: active, coordinator"

    with _channel(server_port, pki.files("active")) as channel:
        stream = channel.unary_stream(STREAM, _identity, _identity)(b"x", timeout=TIMEOUT)
        stream_error = _rpc_error(list, stream)
    assert stream_error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert stream_error.details() == f"role 'active' (active) may not call {STREAM}; allowed: passive"


def test_method_missing_from_policy_is_denied(pki: Pki, server_port: int) -> None:
    error = _rpc_error(_call, server_port, pki.files("coordinator"), UNLISTED)
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "not in policy" in error.details()


def test_open_prefix_admits_any_authenticated_role(pki: Pki, server_port: int) -> None:
    assert _call(server_port, pki.files("operator"), HEALTH) == b"operator|operator|hi"
    assert _call(server_port, pki.files("passive-1"), HEALTH) == b"passive-1|passive|hi"


def test_client_cert_from_foreign_ca_fails_handshake(pki: Pki, server_port: int, tmp_path: Path) -> None:
    foreign = make_pki(tmp_path, ["active"]).files("active")
    # Trusts the right CA for the server, but presents a certificate the server cannot verify.
    impostor = TlsFiles(ca=pki.ca_cert, cert=foreign.cert, key=foreign.key)
    error = _rpc_error(_call, server_port, impostor)
    assert error.code() == grpc.StatusCode.UNAVAILABLE


def test_insecure_channel_fails(server_port: int) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server_port}") as channel:
        error = _rpc_error(channel.unary_unary(ECHO, _identity, _identity), b"hi", TIMEOUT)
    assert error.code() == grpc.StatusCode.UNAVAILABLE


def test_missing_client_certificate_is_unauthenticated(pki: Pki) -> None:
    # A server misconfigured to make client certificates optional still refuses anonymous callers.
    files = pki.files("coordinator")
    lax = grpc.ssl_server_credentials(
        [(files.key.read_bytes(), files.cert.read_bytes())], root_certificates=files.ca.read_bytes()
    )
    server, port = _start_server(lax)
    try:
        anonymous = grpc.ssl_channel_credentials(root_certificates=files.ca.read_bytes())
        with grpc.secure_channel(f"127.0.0.1:{port}", anonymous) as channel:
            error = _rpc_error(channel.unary_unary(ECHO, _identity, _identity), b"hi", TIMEOUT)
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "requires a verified client certificate" in error.details()
    finally:
        server.stop(grace=None)


def test_every_call_is_authorized_by_its_own_certificate(pki: Pki, server_port: int) -> None:
    """The guarded handler is made once per method, the caller checked on every call: calls of different parties
    interleaved on one method each see their own identity and role, and a denial between them changes nothing."""
    for party, allowed in [("active", True), ("passive-1", False), ("coordinator", True), ("active", True)] * 2:
        if allowed:
            assert _call(server_port, pki.files(party)) == f"{party}|{role_of(party)}|hi".encode()
        else:
            assert _rpc_error(_call, server_port, pki.files(party)).code() == grpc.StatusCode.PERMISSION_DENIED


def test_the_identity_is_cached_by_the_exact_certificate_bytes(pki: Pki) -> None:
    """A certificate's parsed identity is remembered under its exact PEM bytes: each certificate keeps its own, and
    bytes differing from a remembered certificate's in one character are parsed on their own (here: refused)."""
    pems = {party: pki.files(party).cert.read_bytes() for party in PARTIES}
    for _ in range(2):
        for party, pem in pems.items():
            assert _caller_from_pem(pem) == Caller(party_id=party, role=role_of(party))
    active = pems["active"]
    body = active.index(b"\n") + 10  # a character of the DER's base64, not the PEM header
    flipped = active[:body] + (b"A" if active[body : body + 1] != b"A" else b"B") + active[body + 1 :]
    assert _caller_from_pem(flipped) is None


def test_current_caller_outside_rpc_raises() -> None:
    with pytest.raises(RuntimeError):
        current_caller()


def test_policy_with_unknown_role_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown roles"):
        RoleInterceptor({ECHO: frozenset({"admin"})})
