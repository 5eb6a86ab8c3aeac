"""Mutual-TLS PKI and role-based authorization for every vflsec gRPC channel.

A party's identity is its certificate: Subject CN is the party id, OU its role. The role is a pure function
of the party id (:func:`role_of`), so a certificate cannot claim a role its id does not imply. Servers require
and verify client certificates against the session CA; :class:`RoleInterceptor` then checks each call's
role against an explicit per-method policy (fail closed) and exposes the verified :class:`Caller` to the
servicer through :func:`current_caller`.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import functools
import ipaddress
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

COORDINATOR = "coordinator"
ACTIVE = "active"
PASSIVE = "passive"
OPERATOR = "operator"
ROLES: frozenset[str] = frozenset({COORDINATOR, ACTIVE, PASSIVE, OPERATOR})

DEFAULT_OPEN_PREFIXES: tuple[str, ...] = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)

# Party ids double as docker-compose host names and file names, so they must be valid DNS labels.
_PARTY_ID = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
_CA_CERT = "ca.pem"
_CA_KEY = "ca.key"
# A CA outlives the leaves it signs; leaves issued later are clamped to the CA's own expiry.
_MIN_CA_DAYS = 3650
# Tolerate small clock differences between the issuing host and the parties.
_CLOCK_SKEW = dt.timedelta(minutes=5)


def role_of(party_id: str) -> str:
    """The role implied by a party id: ``coordinator``, ``active[-*]``, ``passive-*``, ``operator[-*]``."""
    if not _PARTY_ID.fullmatch(party_id):
        raise ValueError(f"invalid party id {party_id!r}: must be a DNS label (letters, digits, '-')")
    if party_id == COORDINATOR:
        return COORDINATOR
    for role, bare_allowed in ((ACTIVE, True), (OPERATOR, True), (PASSIVE, False)):
        if (bare_allowed and party_id == role) or party_id.startswith(role + "-"):
            return role
    raise ValueError(
        f"party id {party_id!r} implies no role; expected 'coordinator', 'active[-*]', 'passive-*' or 'operator[-*]'"
    )


# --------------------------------------------------------------------------------------------------- PKI


@dataclass(frozen=True)
class TlsFiles:
    """PEM files one party needs: the CA to verify peers, and its own certificate and private key."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def from_dir(cls, folder: Path) -> TlsFiles:
        """A party folder's ``tls/`` layout: ``ca.pem``, ``cert.pem``, ``key.pem``."""
        return cls(ca=folder / "ca.pem", cert=folder / "cert.pem", key=folder / "key.pem")


@dataclass(frozen=True)
class Pki:
    """A directory holding ``ca.pem`` and ``<party>.pem`` / ``<party>.key`` for each issued party."""

    root: Path

    @property
    def ca_cert(self) -> Path:
        return self.root / _CA_CERT

    def files(self, party: str) -> TlsFiles:
        role_of(party)  # rejects ids that could escape the directory
        files = TlsFiles(ca=self.ca_cert, cert=self.root / f"{party}.pem", key=self.root / f"{party}.key")
        missing = [str(p) for p in (files.ca, files.cert, files.key) if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"no TLS material for party {party!r}: missing {', '.join(missing)}")
        return files


def make_pki(out_dir: Path, parties: Sequence[str], *, hosts: Sequence[str] = (), days: int = 365) -> Pki:
    """Issue a certificate and key for each party (and ``operator``), creating the CA unless it exists.

    ``hosts`` are extra names/IP addresses under which the parties are reachable; every leaf carries them
    (as well as ``localhost``, its own id, 127.0.0.1 and ::1) as SubjectAlternativeNames.
    """
    if days <= 0:
        raise ValueError(f"days must be positive, got {days}")
    issued = list(dict.fromkeys([*parties, OPERATOR]))
    roles = {party: role_of(party) for party in issued}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _load_or_create_ca(out_dir, days)
    extra_sans = [_san(host) for host in hosts]
    for party, role in roles.items():
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _issue_leaf(ca_key, ca_cert, key, party, role, extra_sans, days)
        _write_key(out_dir / f"{party}.key", key)
        (out_dir / f"{party}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Pki(out_dir)


def _load_or_create_ca(out_dir: Path, days: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    cert_path, key_path = out_dir / _CA_CERT, out_dir / _CA_KEY
    if cert_path.exists() or key_path.exists():
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
            raise ValueError(f"{key_path} does not hold the EC private key of {cert_path}")
        return key, cert
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, "vflsec session CA"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "vflsec"),
        ]
    )
    now = dt.datetime.now(dt.UTC)
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + dt.timedelta(days=max(days, _MIN_CA_DAYS)))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_key(key_path, key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert


def _issue_leaf(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    key: ec.EllipticCurvePrivateKey,
    party: str,
    role: str,
    extra_sans: Iterable[x509.GeneralName],
    days: int,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    sans: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.DNSName(party),
        *extra_sans,
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, party),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "vflsec"),
        ]
    )
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName(list(dict.fromkeys(sans))), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    # Create with 0600 from the start (no window with a umask-derived mode), and fix a pre-existing file.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(pem)


# ----------------------------------------------------------------------------------------- credentials


def server_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """Server side of mutual TLS: present our certificate, require a client certificate from our CA."""
    return grpc.ssl_server_credentials(
        [(files.key.read_bytes(), files.cert.read_bytes())],
        root_certificates=files.ca.read_bytes(),
        require_client_auth=True,
    )


def channel_credentials(files: TlsFiles) -> grpc.ChannelCredentials:
    """Client side of mutual TLS: verify the server against our CA and present our certificate."""
    return grpc.ssl_channel_credentials(
        root_certificates=files.ca.read_bytes(),
        private_key=files.key.read_bytes(),
        certificate_chain=files.cert.read_bytes(),
    )


# -------------------------------------------------------------------------------------- authorization


@dataclass(frozen=True)
class Caller:
    """The verified peer of an RPC."""

    party_id: str
    role: str


_current_caller: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("vflsec_current_caller", default=None)


def current_caller() -> Caller:
    """The caller of the RPC being served; only valid inside a handler behind :class:`RoleInterceptor`."""
    caller = _current_caller.get()
    if caller is None:
        raise RuntimeError("no authorized caller: not inside an RPC served behind RoleInterceptor")
    return caller


def caller_from_context(context: grpc.ServicerContext) -> Caller | None:
    """The peer's identity from its verified client certificate, or None without a valid one."""
    pems = context.auth_context().get("x509_pem_cert")
    return _caller_from_pem(pems[0]) if pems else None


@functools.lru_cache(maxsize=512)
def _caller_from_pem(pem: bytes) -> Caller | None:
    try:
        subject = x509.load_pem_x509_certificate(pem).subject
        (cn,) = subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        (ou,) = subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
        party_id, role = str(cn.value), str(ou.value)
        # The role is implied by the id; a certificate claiming anything else is not one we issued.
        if role_of(party_id) != role:
            return None
    except ValueError:
        return None
    return Caller(party_id=party_id, role=role)


_HANDLER_KINDS: tuple[tuple[str, Callable[..., grpc.RpcMethodHandler]], ...] = (
    ("unary_unary", grpc.unary_unary_rpc_method_handler),
    ("unary_stream", grpc.unary_stream_rpc_method_handler),
    ("stream_unary", grpc.stream_unary_rpc_method_handler),
    ("stream_stream", grpc.stream_stream_rpc_method_handler),
)


class RoleInterceptor(grpc.ServerInterceptor):
    """Authorizes every call by the caller certificate's role; methods absent from the policy are denied.

    ``policy`` maps full method names (``"/vflsec.v1.Coordinator/OpenSession"``) to the roles allowed to
    call them; methods under ``open_prefixes`` are open to any authenticated caller. The servicer reads
    the verified caller with :func:`current_caller`.
    """

    def __init__(
        self,
        policy: Mapping[str, frozenset[str]],
        open_prefixes: Sequence[str] = DEFAULT_OPEN_PREFIXES,
    ) -> None:
        unknown = {role for roles in policy.values() for role in roles} - ROLES
        if unknown:
            raise ValueError(f"policy names unknown roles {sorted(unknown)}; known: {sorted(ROLES)}")
        self._policy = {method: frozenset(roles) for method, roles in policy.items()}
        self._open_prefixes = tuple(open_prefixes)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method: str = handler_call_details.method
        # The call details carry no auth context, so the check runs inside the wrapped behaviour.
        for kind, rebuild in _HANDLER_KINDS:
            behavior = getattr(handler, kind)
            if behavior is not None:
                streaming_response = kind.endswith("_stream")
                return rebuild(
                    self._guard(behavior, method, streaming_response),
                    request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer,
                )
        raise TypeError(f"RPC method handler for {method} has no behaviour")

    def _allowed_roles(self, method: str) -> frozenset[str]:
        if method.startswith(self._open_prefixes):
            return ROLES
        return self._policy.get(method, frozenset())

    def _authorize(self, method: str, context: grpc.ServicerContext) -> Caller:
        caller = caller_from_context(context)
        if caller is None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{method} requires a verified client certificate")
        allowed = self._allowed_roles(method)
        if caller.role not in allowed:
            allowed_text = ", ".join(sorted(allowed)) or "none (method not in policy)"
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"role {caller.role!r} ({caller.party_id}) may not call {method}; allowed: {allowed_text}",
            )
        return caller

    def _guard(self, behavior: Callable[..., Any], method: str, streaming_response: bool) -> Callable[..., Any]:
        # Response streams run lazily as grpc iterates them, so the caller must be set inside the generator.
        if streaming_response:

            def guarded_stream(request: Any, context: grpc.ServicerContext) -> Iterable[Any]:
                token = _current_caller.set(self._authorize(method, context))
                try:
                    yield from behavior(request, context)
                finally:
                    _current_caller.reset(token)

            return guarded_stream

        def guarded(request: Any, context: grpc.ServicerContext) -> Any:
            token = _current_caller.set(self._authorize(method, context))
            try:
                return behavior(request, context)
            finally:
                _current_caller.reset(token)

        return guarded
