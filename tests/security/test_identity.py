"""Finding 6 (one machine made every private key) and finding 8's key files: each party makes its own key,
only CSRs and certificates travel, and the CA signs nothing its operator did not approve.

The federation here is re-keyed through the CLI exactly as docs/deploy.md deploys it: ``certs init-ca`` on
the CA's machine, ``certs request`` in each party's own folder ("its host"), the CSR copied to the CA,
``certs sign`` there, the certificate copied back. It then has to train under CKKS over real mTLS.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import stat
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from typer.testing import CliRunner

from tests.security.conftest import Federation
from vflsec.client.cli import app
from vflsec.client.federation.launcher import FederationSpec, run_in_process, write_federation
from vflsec.client.federation.operator import Operator
from vflsec.services.data import datasets
from vflsec.services.transport import tls
from vflsec.services.transport.server import peer_channel

PARTIES = ("coordinator", "active", "passive-1", "operator")


def _cli(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def ca_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CA's machine."""
    folder = tmp_path_factory.mktemp("ca")
    _cli("certs", "init-ca", "--out", str(folder))
    return folder


@pytest.fixture(scope="module")
def csr_federation(ca_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    workdir = tmp_path_factory.mktemp("hosts")
    layout = write_federation(FederationSpec(datasets.load_dataset("breast_cancer"), n_passive=1), workdir)
    # Throw away every identity the dealer made: nothing below is made on one machine for another.
    shutil.rmtree(workdir / "certs")
    inbox = tmp_path_factory.mktemp("ca-inbox")
    for party in PARTIES:
        tls_dir = workdir / party / "tls"
        shutil.rmtree(tls_dir)
        said = _cli("certs", "request", "--party", party, "--hosts", "127.0.0.1", "--out", str(tls_dir))
        fingerprint = said.split("key fingerprint: ")[1].split()[0]  # read out to the CA's operator
        shutil.copyfile(tls_dir / f"{party}.csr", inbox / f"{party}.csr")  # host -> CA: the CSR only
        cert = inbox / f"{party}.pem"
        _cli("certs", "sign", "--ca", str(ca_dir), "--csr", str(inbox / f"{party}.csr"), "--party", party,
             "--hosts", "127.0.0.1", "--fingerprint", fingerprint, "--out", str(cert))  # fmt: skip
        shutil.copyfile(cert, tls_dir / "cert.pem")  # CA -> host: the certificate and the CA's certificate
        shutil.copyfile(ca_dir / "ca.pem", tls_dir / "ca.pem")
    with run_in_process(layout) as parties, layout.operator_channel() as channel:
        yield Federation(layout, parties, Operator(channel))


# ------------------------------------------------------------------------------------------ the CSR flow


def test_federation_of_csr_made_identities_trains(csr_federation: Federation) -> None:
    fed = csr_federation
    ca = x509.load_pem_x509_certificate(fed.layout.tls("coordinator").ca.read_bytes())
    for party in PARTIES:
        files = fed.layout.tls(party)
        cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
        cert.verify_directly_issued_by(ca)
        key = serialization.load_pem_private_key(files.key.read_bytes(), password=None)
        assert key.public_key() == cert.public_key()  # signed the key made in the party's own folder
        assert stat.S_IMODE(files.key.stat().st_mode) == 0o600
        assert sorted(p.name for p in files.key.parent.iterdir()) == sorted(
            ["ca.pem", "cert.pem", "key.pem", f"{party}.csr"]
        )  # no CA key and no other party's key on any "host"

    session = fed.operator.create_session("ckks", seed=3).session_id
    common = fed.operator.align(session)
    progress = list(fed.operator.train(session, common[:256], 1))
    assert progress and progress[-1].done and progress[-1].step >= 1


def test_cli_refuses_a_csr_for_an_identity_the_operator_did_not_approve(ca_dir: Path, tmp_path: Path) -> None:
    """A second active identity (the session-hijack probe of finding 4 needed one) is not issued on request."""
    _cli("certs", "request", "--party", "active-2", "--out", str(tmp_path))
    result = CliRunner().invoke(
        app, ["certs", "sign", "--ca", str(ca_dir), "--csr", str(tmp_path / "active-2.csr"), "--party", "active",
              "--out", str(tmp_path / "cert.pem")],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "asks for party 'active-2' but the CA operator approved 'active'" in result.output
    assert not (tmp_path / "cert.pem").exists()


def test_request_reuses_the_key_and_never_rewrites_it(tmp_path: Path) -> None:
    key = tmp_path / "key.pem"
    first = tls.request_certificate("passive-1", key)
    pem = key.read_bytes()
    second = tls.request_certificate("passive-1", key, hosts=["10.0.0.13"])  # renewal with a new address
    assert key.read_bytes() == pem and first.public_key() == second.public_key()
    key.chmod(0o640)
    with pytest.raises(PermissionError, match="readable by others"):
        tls.request_certificate("passive-1", key)


# ------------------------------------------------------------------------------- what the CA refuses


def _csr(
    cn: str = "passive-1",
    ou: str | None = "passive",
    *,
    sans: list[x509.GeneralName] | None = None,
    extensions: list[x509.ExtensionType] = (),  # type: ignore[assignment]
    key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | None = None,
    extra_subject: list[x509.NameAttribute] = (),  # type: ignore[assignment]
) -> x509.CertificateSigningRequest:
    names = [x509.NameAttribute(NameOID.COMMON_NAME, cn), *extra_subject]
    if ou is not None:
        names.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ou))
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name(names))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    for extension in extensions:
        builder = builder.add_extension(extension, critical=True)
    return builder.sign(key or ec.generate_private_key(ec.SECP256R1()), hashes.SHA256())


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> tls.CertificateAuthority:
    return tls.CertificateAuthority.create(tmp_path_factory.mktemp("refusing-ca"))


def _tampered() -> x509.CertificateSigningRequest:
    """passive-1's CSR with its subject rewritten to coordinator: the signature no longer covers it."""
    der = _csr().public_bytes(serialization.Encoding.DER)
    assert der.count(b"passive-1") == 1
    return x509.load_der_x509_csr(der.replace(b"passive-1", b"coordinat"))


KEY_CERT_SIGN = x509.KeyUsage(False, False, False, False, False, True, True, False, False)
REFUSED = {
    "CA:TRUE": (lambda: _csr(extensions=[x509.BasicConstraints(ca=True, path_length=None)]), {}, "be a CA"),
    "keyCertSign": (lambda: _csr(extensions=[KEY_CERT_SIGN]), {}, "may only carry SubjectAlternativeName"),
    "role not implied": (lambda: _csr(ou="coordinator"), {}, "whose id implies role 'passive'"),
    "no role": (lambda: _csr(ou=None), {}, "is not CN=<party>, OU=<role>"),
    "extra subject": (
        lambda: _csr(extra_subject=[x509.NameAttribute(NameOID.COUNTRY_NAME, "FR")]),
        {},
        "is not CN=<party>, OU=<role>",
    ),
    "unapproved party": (lambda: _csr("coordinator", "coordinator"), {}, "approved 'passive-1'"),
    "unapproved role": (lambda: _csr(), {"role": "active"}, "approved role 'active'"),
    "another party's id as SAN": (lambda: _csr(sans=[x509.DNSName("coordinator")]), {}, "another party's id"),
    "case/dot variant": (lambda: _csr(sans=[x509.DNSName("Coordinator.")]), {}, "another party's id"),
    "wildcard": (lambda: _csr(sans=[x509.DNSName("*.example.org")]), {}, "wildcard"),
    "URI SAN": (
        lambda: _csr(sans=[x509.UniformResourceIdentifier("spiffe://x/coordinator")]),
        {},
        "DNS names and IP addresses only",
    ),
    "host not allowed": (lambda: _csr(sans=[x509.DNSName("evil.example.org")]), {"hosts": ["10.0.0.13"]}, "--hosts"),
    "RSA key": (lambda: _csr(key=rsa.generate_private_key(65537, 2048)), {}, "EC P-256 keys only"),
    "P-384 key": (lambda: _csr(key=ec.generate_private_key(ec.SECP384R1())), {}, "EC P-256 keys only"),
    "bad signature": (_tampered, {}, "signature does not verify"),
    "another key": (lambda: _csr(), {"fingerprint": tls.key_fingerprint(_csr().public_key())}, "not the approved"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_ca_refuses(ca: tls.CertificateAuthority, case: str) -> None:
    make, approve, message = REFUSED[case]
    with pytest.raises(tls.CsrRefused, match=message):
        tls.sign_request(ca, make(), party="passive-1", **approve)


def test_ca_issues_exactly_what_it_checked(ca: tls.CertificateAuthority) -> None:
    """An acceptable CSR: the CA sets the extensions itself and keeps only the checked names."""
    csr = _csr(sans=[x509.DNSName("p1.example.org"), x509.DNSName("passive-1")])
    cert = tls.sign_request(ca, csr, party="passive-1", role="passive", hosts=["p1.example.org"], days=30)
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)[0].value == "passive"
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.DNSName)) == {"localhost", "passive-1", "p1.example.org"}
    assert cert.not_valid_after_utc - dt.datetime.now(dt.UTC) < dt.timedelta(days=31)
    cert.verify_directly_issued_by(ca.cert)


def _health_server(files: tls.TlsFiles) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_secure_port("127.0.0.1:0", tls.server_credentials(files))
    server.start()
    return server, f"127.0.0.1:{port}"


def _check(address: str, pinned: str, files: tls.TlsFiles) -> None:
    with peer_channel(address, pinned, files, 1 << 20) as channel:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)


def test_why_another_partys_id_is_refused_as_a_san(csr_federation: Federation, ca_dir: Path, tmp_path: Path) -> None:
    """Not hypothetical: a passive-1 certificate carrying the SAN ``coordinator`` passes the active party's
    pinning of the coordinator, so it could answer as the coordinator. Such a CSR is refused; only by going
    around the check (signing the leaf directly) can the certificate be made."""
    fed, ca = csr_federation, tls.CertificateAuthority.load(ca_dir)
    key_path = tmp_path / "key.pem"
    csr = tls.request_certificate("passive-1", key_path, hosts=["coordinator"])
    with pytest.raises(tls.CsrRefused, match="another party's id"):
        tls.sign_request(ca, csr, party="passive-1")
    sans = list(csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    leaf = tls._issue_leaf(ca, csr.public_key(), "passive-1", "passive", sans, days=1)
    (tmp_path / "cert.pem").write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    rogue = tls.TlsFiles(ca=ca_dir / "ca.pem", cert=tmp_path / "cert.pem", key=key_path)
    server, address = _health_server(rogue)
    try:
        _check(address, "coordinator", fed.layout.tls("active"))  # accepted as "coordinator"
    finally:
        server.stop(grace=None)


# ------------------------------------------------------------------------------------------ foreign CAs


def test_identities_from_a_foreign_ca_are_refused(csr_federation: Federation, tmp_path: Path) -> None:
    fed = csr_federation
    foreign = tls.CertificateAuthority.create(tmp_path / "foreign-ca")
    impostors = {}
    for party in ("operator", "passive-1"):
        files = tls.issue_into(foreign, party, tmp_path / party)
        impostors[party] = tls.TlsFiles(ca=fed.layout.tls(party).ca, cert=files.cert, key=files.key)

    # A client whose certificate a foreign CA signed (same party id, same flow) fails the handshake.
    with pytest.raises(grpc.RpcError) as err:
        _check(fed.layout.addresses["active"], "active", impostors["operator"])
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    _check(fed.layout.addresses["active"], "active", fed.layout.tls("operator"))  # the real one gets through

    # A server presenting a foreign-signed passive-1 certificate is refused by the coordinator's client side.
    server, address = _health_server(impostors["passive-1"])
    try:
        with pytest.raises(grpc.RpcError) as err:
            _check(address, "passive-1", fed.layout.tls("coordinator"))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(grace=None)


# --------------------------------------------------------------------------------- key files are 0600


class _OpenTrace:
    """Records how key files are opened and any later chmod of them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.opens: dict[str, tuple[int, int]] = {}
        self.chmods: list[str] = []
        real_open, real_chmod, real_fchmod = os.open, os.chmod, os.fchmod

        def traced_open(path, flags, mode=0o777, *args, **kwargs):  # type: ignore[no-untyped-def]
            if str(path).endswith((".key", "key.pem")):
                self.opens[str(path)] = (flags, mode)
            return real_open(path, flags, mode, *args, **kwargs)

        def traced_chmod(path, *args, **kwargs):  # type: ignore[no-untyped-def]
            self.chmods.append(str(path))
            return real_chmod(path, *args, **kwargs)

        def traced_fchmod(fd, *args, **kwargs):  # type: ignore[no-untyped-def]
            self.chmods.append(f"fd {fd}")
            return real_fchmod(fd, *args, **kwargs)

        monkeypatch.setattr(os, "open", traced_open)
        monkeypatch.setattr(os, "chmod", traced_chmod)
        monkeypatch.setattr(os, "fchmod", traced_fchmod)

    def assert_private(self, keys: list[Path]) -> None:
        for key in keys:
            flags, mode = self.opens[str(key)]
            assert flags & os.O_CREAT and flags & os.O_EXCL, f"{key} not created exclusively"
            assert mode == 0o600, f"{key} created with mode {mode:o}"
            assert stat.S_IMODE(key.stat().st_mode) == 0o600
        assert not self.chmods, f"key files chmod-ed after creation: {self.chmods}"


@pytest.fixture
def umask_zero() -> Iterator[None]:
    previous = os.umask(0)  # the worst case: a mode left to the umask would be world-readable
    try:
        yield
    finally:
        os.umask(previous)


def test_every_key_is_created_0600_never_chmod_ed(
    umask_zero: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    trace = _OpenTrace(monkeypatch)
    # The dealer's all-in-one (prepare, demo, compose, integration tests): keys made in each party's folder.
    layout = write_federation(FederationSpec(datasets.load_dataset("breast_cancer"), n_passive=2), tmp_path / "fed")
    operators = ["operator", *(f"operator-{p}" for p in layout.passive_parties)]  # each passive party's own too
    keys = [layout.tls(party).key for party in [*layout.configs, *operators]]
    # `vflsec certs` all-in-one, `certs init-ca` and `certs request`.
    pki = tls.make_pki(tmp_path / "pki", ["coordinator", "active"])
    keys += [pki.files(party).key for party in ("coordinator", "active", "operator")]
    keys += [tmp_path / "fed" / "certs" / "ca.key", tmp_path / "pki" / "ca.key"]
    _cli("certs", "init-ca", "--out", str(tmp_path / "ca"))
    _cli("certs", "request", "--party", "passive-3", "--out", str(tmp_path / "host"))
    keys += [tmp_path / "ca" / "ca.key", tmp_path / "host" / "key.pem"]
    trace.assert_private(keys)
    for path in (tmp_path / "fed").rglob("*"):
        if path.is_file() and path.name in ("key.pem", "ca.key"):
            assert path in keys


def test_a_planted_key_link_is_never_written_through(tmp_path: Path) -> None:
    """O_EXCL: a key is never written through a link someone planted where it goes (even a dangling one)."""
    target = tmp_path / "attacker-readable"
    (tmp_path / "host").mkdir()
    (tmp_path / "host" / "key.pem").symlink_to(target)
    (tmp_path / "ca").mkdir()
    (tmp_path / "ca" / "ca.key").symlink_to(target)
    with pytest.raises(FileExistsError):
        tls.request_certificate("passive-1", tmp_path / "host" / "key.pem")
    with pytest.raises(FileExistsError):
        tls.CertificateAuthority.create(tmp_path / "ca")
    assert not target.exists()
