"""``vflsec certs``: the federation's CA and each party's key, CSR and certificate."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vflsec.client.commands.common import fail

app = typer.Typer(
    help="Mutual-TLS identities. Per host: `init-ca` once at the CA, `request` on each party's host (its key never "
    "leaves it), `sign` each CSR at the CA. Without a sub-command: everything on one machine (demo, tests).",
)


def _names(value: str) -> list[str]:
    return [name.strip() for name in value.split(",") if name.strip()]


@app.callback(invoke_without_command=True)
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
        fail("--out is required (or use a sub-command: init-ca, request, sign)")
    from vflsec.services.transport.tls import make_pki

    names = _names(parties)
    try:
        pki = make_pki(out, names, hosts=_names(hosts))
    except (ValueError, OSError) as exc:  # a bad id or host, a CSR the CA refuses, an unreadable CA
        fail(str(exc))
    for party in [*names, "operator"]:
        typer.echo(f"{party}: {pki.files(party).cert}")


@app.command("init-ca")
def certs_init_ca(
    out: Annotated[Path, typer.Option("--out", help="The CA's folder: ca.pem (public) and ca.key (created 0600).")],
    days: Annotated[int, typer.Option(min=3650, help="Validity of the CA certificate in days.")] = 3650,
) -> None:
    """Create the federation's CA (refuses to replace one). ca.key never leaves this folder."""
    from vflsec.services.transport.tls import CertificateAuthority

    try:
        CertificateAuthority.create(out, days)
    except FileExistsError as exc:
        fail(str(exc))
    typer.echo(f"CA: {out / 'ca.pem'} (give it to every party); keep {out / 'ca.key'} here")


@app.command("request")
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
        fail(str(exc))
    path = out / f"{party}.csr"
    path.write_bytes(csr.public_bytes(serialization.Encoding.PEM))
    typer.echo(f"key: {key} ({'reused' if existed else 'new'}; it never leaves this host)")
    typer.echo(f"csr: {path} (send it to the CA; install the certificate it returns as {out / 'cert.pem'})")
    typer.echo(f"key fingerprint: {key_fingerprint(csr.public_key())} (tell the CA's operator out of band)")


@app.command("sign")
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
        fail(f"{csr}: {exc}")
    out.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    typer.echo(f"issued {party} (role {role_of(party)}) until {cert.not_valid_after_utc:%Y-%m-%d}: {out}")
    typer.echo(f"names: {', '.join(str(name.value) for name in names)}")
    if fingerprint is None:
        typer.echo(f"key fingerprint: {key_fingerprint(cert.public_key())} (not checked: pass --fingerprint)")

