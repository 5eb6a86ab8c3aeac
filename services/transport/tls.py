"""Mutual-TLS PKI and role-based authorization for every vflsec gRPC channel.

A party's identity is its certificate: Subject CN is the party id, OU its role. The role is a pure function
of the party id (:func:`role_of`), so a certificate cannot claim a role its id does not imply. Servers require
and verify client certificates against the session CA; :class:`RoleInterceptor` then checks each call's
role against an explicit per-method policy (fail closed) and exposes the verified :class:`Caller` to the
servicer through :func:`current_caller`. Each party makes its own key and CSR; the CA signs only what its
operator approved (:func:`request_certificate`, :func:`sign_request`). Every channel is TLS 1.3 only, pinned
where grpc is first loaded (``vflsec/__init__.py``).
"""

from __future__ import annotations

import contextvars
import datetime as dt
import functools
import ipaddress
import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The roles are plain values (services/common.py), so the engines name them without importing gRPC.
from vflsec.services.common import ACTIVE as ACTIVE
from vflsec.services.common import COORDINATOR as COORDINATOR
from vflsec.services.common import OPERATOR as OPERATOR
from vflsec.services.common import PASSIVE as PASSIVE
from vflsec.services.common import ROLES as ROLES

DEFAULT_OPEN_PREFIXES: tuple[str, ...] = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)

# Party ids double as docker-compose host names and file names, so they must be valid DNS labels, and lower-case: DNS
# does not tell "passive-A" from "passive-a", nor does a case-insensitive volume, where two owners' ledger files would
# be one and their query budgets mixed (review 19, L5).
_PARTY_ID = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_CA_CERT = "ca.pem"
_CA_KEY = "ca.key"
_ORGANIZATION = "vflsec"
# A CA outlives the leaves it signs; leaves issued later are clamped to the CA's own expiry.
_MIN_CA_DAYS = 3650
# Tolerate small clock differences between the issuing host and the parties.
_CLOCK_SKEW = dt.timedelta(minutes=5)


def role_of(party_id: str) -> str:
    """The role implied by a party id: ``coordinator``, ``active[-*]``, ``passive-*``, ``operator[-*]``."""
    if not _PARTY_ID.fullmatch(party_id):
        raise ValueError(f"invalid party id {party_id!r}: must be a lower-case DNS label (a-z, 0-9, '-')")
    if party_id == COORDINATOR:
        return COORDINATOR
    for role, bare_allowed in ((ACTIVE, True), (OPERATOR, True), (PASSIVE, False)):
        if (bare_allowed and party_id == role) or party_id.startswith(role + "-"):
            return role
    raise ValueError(
        f"party id {party_id!r} implies no role; expected 'coordinator', 'active[-*]', 'passive-*' or 'operator[-*]'"
    )


# --------------------------------------------------------------------------------------------------- PKI
#
# Every identity goes through one path: the party makes its key where it will live (request_certificate)
# and only its CSR travels; the CA checks the CSR against what its operator approved (sign_request). The
# all-in-one helpers (make_pki, issue_into) run both steps on one machine for the demo and tests.


class CsrRefused(ValueError):
    """The CA will not sign a certificate signing request; the message says what it asked for and why not."""


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


@dataclass(frozen=True)
class CertificateAuthority:
    """The session CA: its key signs every party certificate. ``ca.key`` never leaves the CA's folder."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @classmethod
    def create(cls, folder: Path, days: int = _MIN_CA_DAYS) -> CertificateAuthority:
        """A new CA in ``folder`` (``ca.pem``, ``ca.key`` created 0600); refuses to replace an existing one."""
        folder = Path(folder)
        cert_path, key_path = folder / _CA_CERT, folder / _CA_KEY
        existing = [str(p) for p in (cert_path, key_path) if p.exists()]
        if existing:
            raise FileExistsError(f"a CA already exists here ({', '.join(existing)}); it is never replaced")
        folder.mkdir(parents=True, exist_ok=True)
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
        _create_private_file(key_path, _key_pem(key))
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return cls(key, cert)

    @classmethod
    def load(cls, folder: Path) -> CertificateAuthority:
        cert_path, key_path = Path(folder) / _CA_CERT, Path(folder) / _CA_KEY
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
            raise ValueError(f"{key_path} does not hold the EC private key of {cert_path}")
        return cls(key, cert)

    @classmethod
    def load_or_create(cls, folder: Path, days: int = _MIN_CA_DAYS) -> CertificateAuthority:
        folder = Path(folder)
        if (folder / _CA_CERT).exists() or (folder / _CA_KEY).exists():
            return cls.load(folder)
        return cls.create(folder, days)


def request_certificate(party: str, key_path: Path, hosts: Sequence[str] = ()) -> x509.CertificateSigningRequest:
    """The party's side: a CSR for ``party`` (its role implied by the id), signed with the key at ``key_path``.

    The key is made there if absent (EC P-256, file created 0600 exclusively) and otherwise reused, e.g. to
    renew a certificate or add host names; it never has to leave the party's host. ``hosts`` are the extra
    names/IP addresses the party is reached under; the CSR also asks for ``localhost``, the party id,
    127.0.0.1 and ::1.
    """
    role = role_of(party)
    key_path = Path(key_path)
    if key_path.exists():
        key = _load_party_key(key_path)
    else:
        key = ec.generate_private_key(ec.SECP256R1())
        _create_private_file(key_path, _key_pem(key))
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, party),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, _ORGANIZATION),
        ]
    )
    sans = _default_sans(party) + [_san(host) for host in hosts]
    return (
        x509.CertificateSigningRequestBuilder()
        .subject_name(subject)
        .add_extension(x509.SubjectAlternativeName(list(dict.fromkeys(sans))), critical=False)
        .sign(key, hashes.SHA256())
    )


def sign_request(
    ca: CertificateAuthority,
    csr: x509.CertificateSigningRequest,
    *,
    party: str,
    role: str | None = None,
    hosts: Sequence[str] | None = None,
    fingerprint: str | None = None,
    days: int = 365,
) -> x509.Certificate:
    """The CA's side: a leaf certificate for ``csr`` once it asks for nothing its operator did not approve.

    ``party`` (and, if given, ``role``) is the identity the operator approves; ``hosts``, if given, the only
    extra names the certificate may carry; ``fingerprint``, if given, the :func:`key_fingerprint` the party's
    host reported for its key. The CA takes the subject, the role and the SANs from the CSR only
    after checking them, and sets every other extension itself. Raises :class:`CsrRefused` when the CSR's
    signature is invalid (the requester does not hold the key), its key is not EC P-256, its subject is not
    ``CN=<party>, OU=<role>[, O=vflsec]`` with the role its id implies, it names another identity than the
    approved one, it asks for an extension other than SubjectAlternativeName (a CA, BasicConstraints
    CA:TRUE, above all), or for a SAN that is not a plain DNS name or IP address, a wildcard, another party's
    id (a client pins a server by its id as a SAN, so that SAN would let one party answer as another), or a
    name outside ``hosts``.
    """
    if days <= 0:
        raise ValueError(f"days must be positive, got {days}")
    if not csr.is_signature_valid:
        raise CsrRefused("the CSR's signature does not verify: the requester has not proved it holds the key")
    key = csr.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise CsrRefused(f"the CSR's key is {type(key).__name__}; the CA signs EC P-256 keys only")
    if fingerprint is not None and key_fingerprint(key) != fingerprint.strip().lower():
        raise CsrRefused(f"the CSR's key has fingerprint {key_fingerprint(key)}, not the approved {fingerprint}")
    asked = _requested_identity(csr)
    if asked != party:
        raise CsrRefused(f"the CSR asks for party {asked!r} but the CA operator approved {party!r}")
    implied = role_of(party)
    if role is not None and role != implied:
        raise CsrRefused(f"party {party!r} has role {implied!r}; the CA operator approved role {role!r}")
    sans = _requested_sans(csr, party, hosts)
    return _issue_leaf(ca, key, party, implied, sans, days)


def issue_into(
    ca: CertificateAuthority, party: str, folder: Path, *, hosts: Sequence[str] = (), days: int = 365
) -> TlsFiles:
    """All-in-one for one party: its key made in its own ``tls/`` folder, its CSR signed by ``ca`` at once."""
    files = TlsFiles.from_dir(Path(folder))
    files.key.parent.mkdir(parents=True, exist_ok=True)
    cert = sign_request(ca, request_certificate(party, files.key, hosts), party=party, days=days)
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.ca.write_bytes(ca.cert_pem)
    return files


def make_pki(out_dir: Path, parties: Sequence[str], *, hosts: Sequence[str] = (), days: int = 365) -> Pki:
    """Issue a certificate and key for each party (and ``operator``) in one folder, creating the CA unless it
    exists (the dealer's all-in-one; a party's existing key is reused).

    ``hosts`` are extra names/IP addresses under which the parties are reachable; every leaf carries them
    (as well as ``localhost``, its own id, 127.0.0.1 and ::1) as SubjectAlternativeNames.
    """
    if days <= 0:
        raise ValueError(f"days must be positive, got {days}")
    issued = list(dict.fromkeys([*parties, OPERATOR]))
    for party in issued:
        role_of(party)
    out_dir = Path(out_dir)
    ca = CertificateAuthority.load_or_create(out_dir, days)
    for party in issued:
        cert = sign_request(ca, request_certificate(party, out_dir / f"{party}.key", hosts), party=party, days=days)
        (out_dir / f"{party}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Pki(out_dir)


def key_fingerprint(key: ec.EllipticCurvePublicKey) -> str:
    """SHA-256 of the public key (SubjectPublicKeyInfo): read out by the party, compared by the CA's operator
    before signing, it ties a CSR that travelled by mail or scp to the host that made it."""
    spki = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    digest = hashes.Hash(hashes.SHA256())
    digest.update(spki)
    return digest.finalize().hex(":", 2)


def _requested_identity(csr: x509.CertificateSigningRequest) -> str:
    """The CSR's party id, once its subject is exactly CN=<id>, OU=<role its id implies>[, O=vflsec]."""
    attributes = list(csr.subject)
    cns = csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    ous = csr.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    orgs = csr.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    if len(cns) != 1 or len(ous) != 1 or len(orgs) > 1 or len(attributes) != 2 + len(orgs):
        raise CsrRefused(f"the CSR's subject {csr.subject.rfc4514_string()!r} is not CN=<party>, OU=<role>[, O=vflsec]")
    if orgs and orgs[0].value != _ORGANIZATION:
        raise CsrRefused(f"the CSR asks for organization {orgs[0].value!r}; the CA issues {_ORGANIZATION!r} only")
    party, role = str(cns[0].value), str(ous[0].value)
    try:
        implied = role_of(party)
    except ValueError as exc:
        raise CsrRefused(str(exc)) from None
    if role != implied:
        raise CsrRefused(f"the CSR asks for role {role!r} for party {party!r}, whose id implies role {implied!r}")
    return party


def _requested_sans(
    csr: x509.CertificateSigningRequest, party: str, hosts: Sequence[str] | None
) -> list[x509.GeneralName]:
    """The CSR's SANs, checked: plain DNS names / IPs, no other party's id, within ``hosts`` when given."""
    sans: list[x509.GeneralName] = []
    for extension in csr.extensions:
        value = extension.value
        if isinstance(value, x509.SubjectAlternativeName):
            sans.extend(value)
        elif isinstance(value, x509.BasicConstraints) and value.ca:
            raise CsrRefused(
                "the CSR asks to be a CA (BasicConstraints CA:TRUE); the CA issues party certificates only"
            )
        elif not isinstance(value, x509.BasicConstraints):
            raise CsrRefused(
                f"the CSR asks for extension {extension.oid.dotted_string} ({type(value).__name__}); a request may "
                "only carry SubjectAlternativeName (the CA sets key usage and basic constraints itself)"
            )
    defaults = _default_sans(party)
    allowed = None if hosts is None else {*defaults, *(_san(host) for host in hosts)}
    for san in sans:
        if isinstance(san, x509.DNSName):
            name = san.value.lower().rstrip(".")
            if "*" in name:
                raise CsrRefused(f"the CSR asks for wildcard name {san.value!r}; the CA issues exact names only")
            if name != party.lower() and _is_party_id(name):
                raise CsrRefused(
                    f"the CSR for {party!r} asks for name {san.value!r}, another party's id: clients pin a server "
                    "by its id, so it would let this party answer as that one"
                )
        elif not isinstance(san, x509.IPAddress):
            raise CsrRefused(f"the CSR asks for {san!r}; the CA issues DNS names and IP addresses only")
        if allowed is not None and san not in allowed:
            raise CsrRefused(f"the CSR asks for {san.value!r}, which the CA operator did not allow (--hosts)")
    return list(dict.fromkeys([*defaults, *sans]))


def _is_party_id(name: str) -> bool:
    try:
        role_of(name)
    except ValueError:
        return False
    return True


def _default_sans(party: str) -> list[x509.GeneralName]:
    return [
        x509.DNSName("localhost"),
        x509.DNSName(party),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]


def _issue_leaf(
    ca: CertificateAuthority,
    key: ec.EllipticCurvePublicKey,
    party: str,
    role: str,
    sans: Sequence[x509.GeneralName],
    days: int,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, party),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, _ORGANIZATION),
        ]
    )
    ca_ski = ca.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.cert.subject)
        .public_key(key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(min(now + dt.timedelta(days=days), ca.cert.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca.key, hashes.SHA256())
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


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _create_private_file(path: Path, data: bytes) -> None:
    """Create ``path`` with mode 0600 from the start: O_EXCL never reuses (or follows) an existing file, and
    the umask can only narrow 0600, so the key is never readable by anyone else, not even for a moment."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def _load_party_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """An existing party key, reused only if it is EC P-256 and no one but its owner can read it."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise PermissionError(f"{path} is readable by others (mode {mode:04o}); remove it or `chmod 600` it first")
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise ValueError(f"{path} does not hold an EC P-256 private key")
    return key


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
    the verified caller with :func:`current_caller`. ``inner`` rebuilds each handler before it is guarded (it runs
    only for authorized callers); the guarded handler is made once per method, the caller is authorized on every call.
    """

    def __init__(
        self,
        policy: Mapping[str, frozenset[str]],
        open_prefixes: Sequence[str] = DEFAULT_OPEN_PREFIXES,
        inner: Callable[[grpc.RpcMethodHandler], grpc.RpcMethodHandler] = lambda handler: handler,
    ) -> None:
        unknown = {role for roles in policy.values() for role in roles} - ROLES
        if unknown:
            raise ValueError(f"policy names unknown roles {sorted(unknown)}; known: {sorted(ROLES)}")
        self._policy = {method: frozenset(roles) for method, roles in policy.items()}
        self._open_prefixes = tuple(open_prefixes)
        self._inner = inner
        self._guarded: dict[tuple[str, grpc.RpcMethodHandler], grpc.RpcMethodHandler] = {}

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        # Made once per method and handler, not per call (rebuilding was a few percent of a party's Python under
        # load); the caller is still authorized on every call, from that call's own certificate.
        key = (handler_call_details.method, handler)
        guarded = self._guarded.get(key)
        if guarded is None:
            guarded = self._guarded[key] = self._guarded_handler(self._inner(handler), handler_call_details.method)
        return guarded

    def _guarded_handler(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
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

    def _authorize(self, method: str, allowed: frozenset[str], context: grpc.ServicerContext) -> Caller:
        caller = caller_from_context(context)
        if caller is None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{method} requires a verified client certificate")
        if caller.role not in allowed:
            allowed_text = ", ".join(sorted(allowed)) or "none (method not in policy)"
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"role {caller.role!r} ({caller.party_id}) may not call {method}; allowed: {allowed_text}",
            )
        return caller

    def _guard(self, behavior: Callable[..., Any], method: str, streaming_response: bool) -> Callable[..., Any]:
        allowed = self._allowed_roles(method)  # the policy is fixed at construction
        # Response streams run lazily as grpc iterates them, so the caller must be set inside the generator.
        if streaming_response:

            def guarded_stream(request: Any, context: grpc.ServicerContext) -> Iterable[Any]:
                token = _current_caller.set(self._authorize(method, allowed, context))
                try:
                    yield from behavior(request, context)
                finally:
                    _current_caller.reset(token)

            return guarded_stream

        def guarded(request: Any, context: grpc.ServicerContext) -> Any:
            token = _current_caller.set(self._authorize(method, allowed, context))
            try:
                return behavior(request, context)
            finally:
                _current_caller.reset(token)

        return guarded
