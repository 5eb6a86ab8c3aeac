"""Per-host deployment: coordinator, active and passive-1 each in its own Linux network namespace.

A private hub namespace holds a bridge; every party namespace (and the operator's) gets one veth pair whose
far end sits on that bridge, and an address in 10.231.7.0/24. Nothing is added to the root namespace, so all
traffic stays between namespaces this test creates. Each party runs as ``ip netns exec NS vflsec serve`` with
the config ``write_federation`` wrote, its addresses rewritten to the namespace IPs and a new identity made
by the CSR flow of docs/deploy.md (key made in its own namespace, CSR signed at a separate CA, its IP as a
SAN); the operator then runs ``vflsec health`` and ``vflsec run`` (align, train, predict) from its own
namespace. Needs root and iproute2; skips with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from vflsec.client.federation.launcher import FederationLayout, FederationSpec, write_federation
from vflsec.services.config import dump_toml
from vflsec.services.data import datasets
from vflsec.services.transport import tls

SUBNET = "10.231.7"
# Host part of each party's address; the operator also gets a namespace of its own.
HOSTS = {"coordinator": 11, "active": 12, "passive-1": 13, "operator": 14}
START_ORDER = ("passive-1", "coordinator", "active")
CLI = [sys.executable, "-m", "vflsec.client.cli"]


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


def _must(*args: str) -> None:
    done = _ip(*args)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


class Namespaces:
    """The namespaces and links of one test run; :meth:`remove` deletes all of them (and with them the veths)."""

    def __init__(self, prefix: str) -> None:
        self.hub = f"{prefix}-hub"
        self.of = {party: f"{prefix}-{party}" for party in HOSTS}
        self.created: list[str] = []

    def add(self, name: str) -> None:
        _must("netns", "add", name)
        self.created.append(name)
        _must("-n", name, "link", "set", "lo", "up")

    def build(self) -> None:
        self.add(self.hub)
        _must("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _must("-n", self.hub, "link", "set", "br0", "up")
        for i, (party, ns) in enumerate(self.of.items()):
            self.add(ns)
            port = f"p{i}"  # the veth's end on the bridge, inside the hub namespace
            _must("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", self.hub)
            _must("-n", self.hub, "link", "set", port, "master", "br0")
            _must("-n", self.hub, "link", "set", port, "up")
            _must("-n", ns, "addr", "add", f"{SUBNET}.{HOSTS[party]}/24", "dev", "eth0")
            _must("-n", ns, "link", "set", "eth0", "up")

    def remove(self) -> list[str]:
        """Delete every namespace created; returns the ones that could not be deleted."""
        return [ns for ns in reversed(self.created) if _ip("netns", "del", ns).returncode != 0]


def _skip_reason() -> str | None:
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (run as root to test per-host deployment)"
    if shutil.which("ip") is None:
        return "iproute2 ('ip') is not installed"
    return None


@pytest.fixture
def namespaces() -> Iterator[Namespaces]:
    reason = _skip_reason()
    if reason:
        print(f"SKIP test_netns: {reason}")
        pytest.skip(reason)
    probe = f"vflsec-probe-{os.getpid()}"
    added = _ip("netns", "add", probe)
    if added.returncode != 0:
        reason = f"'ip netns add' fails here: {added.stderr.strip()}"
        print(f"SKIP test_netns: {reason}")
        pytest.skip(reason)
    _ip("netns", "del", probe)
    spaces = Namespaces(f"vflsec-{os.getpid()}")
    try:
        spaces.build()
        yield spaces
    finally:
        left = spaces.remove()
        assert not left, f"namespaces left behind: {left}"


def _address(party: str, port: int) -> str:
    return f"{SUBNET}.{HOSTS[party]}:{port}"


def _deploy_per_host(spaces: Namespaces, layout: FederationLayout) -> dict[str, str]:
    """Rewrite listen/peer addresses to the namespace IPs and give every party a new identity by the CSR flow
    of docs/deploy.md: each makes its key in its own namespace, only CSRs and certificates cross to the CA."""
    parties = list(layout.configs)
    ports = {party: int(address.rsplit(":", 1)[1]) for party, address in layout.addresses.items()}
    addresses = {party: _address(party, ports[party]) for party in parties}
    ca, inbox = layout.workdir / "ca", layout.workdir / "ca-inbox"
    _cli("certs", "init-ca", "--out", str(ca))
    inbox.mkdir()
    for party in [*parties, "operator"]:
        files = layout.tls(party)
        files.key.unlink()  # the dealer made this one: replace it by a key made on the party's own host
        said = _cli(
            "certs", "request", "--party", party, "--hosts", f"{SUBNET}.{HOSTS[party]}",
            "--out", str(files.key.parent), ns=spaces.of[party],
        )  # fmt: skip
        fingerprint = said.split("key fingerprint: ")[1].split()[0]
        shutil.copyfile(files.key.parent / f"{party}.csr", inbox / f"{party}.csr")
        _cli(
            "certs", "sign", "--ca", str(ca), "--csr", str(inbox / f"{party}.csr"), "--party", party,
            "--hosts", f"{SUBNET}.{HOSTS[party]}", "--fingerprint", fingerprint, "--out", str(inbox / f"{party}.pem"),
        )  # fmt: skip
        shutil.copyfile(inbox / f"{party}.pem", files.cert)
        shutil.copyfile(ca / "ca.pem", files.ca)
    for party, path in layout.configs.items():
        raw = tomllib.loads(path.read_text())
        raw["listen"] = addresses[party]
        raw["peers"] = {peer: addresses[peer] for peer in raw.get("peers", {})}
        path.write_text(dump_toml(raw))
    return addresses


def _cli(*args: str, ns: str | None = None) -> str:
    command = [*CLI, *args] if ns is None else _in_ns(ns, *CLI, *args)
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _in_ns(ns: str, *command: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *command]


def _wait_healthy(spaces: Namespaces, layout: FederationLayout, party: str, address: str, proc) -> None:
    command = _in_ns(
        spaces.of["operator"], *CLI, "health", "--address", address, "--party", party,
        "--tls-dir", str(layout.tls("operator").ca.parent),
    )  # fmt: skip
    deadline = time.monotonic() + 90
    while True:
        assert proc.poll() is None, f"{party} exited with {proc.returncode}"
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode == 0:
            assert "SERVING" in done.stdout
            return
        assert time.monotonic() < deadline, f"{party} not healthy: {done.stdout}{done.stderr}"
        time.sleep(0.5)


def test_three_hosts_in_network_namespaces(namespaces: Namespaces, tmp_path: Path) -> None:
    layout = write_federation(FederationSpec(datasets.load_dataset("breast_cancer"), n_passive=1), tmp_path)
    addresses = _deploy_per_host(namespaces, layout)
    procs: dict[str, subprocess.Popen] = {}
    try:
        for party in START_ORDER:
            log = (tmp_path / f"{party}.log").open("w")
            role = tls.role_of(party)
            procs[party] = subprocess.Popen(
                _in_ns(namespaces.of[party], *CLI, "serve", role, "--config", str(layout.configs[party])),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        for party in START_ORDER:
            _wait_healthy(namespaces, layout, party, addresses[party], procs[party])
        # The parties are unreachable from the root namespace: their traffic never leaves the namespaces.
        host, port = addresses["active"].rsplit(":", 1)
        with pytest.raises(OSError):
            socket.create_connection((host, int(port)), timeout=2).close()
        run = _in_ns(
            namespaces.of["operator"], *CLI, "run", "--active", addresses["active"],
            "--tls-dir", str(layout.tls("operator").ca.parent), "--labels", str(layout.workdir / "active" / "data.csv"),
            "--backend", "ckks", "--epochs", "3", "--json",
        )  # fmt: skip
        done = subprocess.run(run, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["backend"] == "ckks" and result["n_passive"] == 1
        assert 0 < result["n_common"] < result["n_active_rows"]  # PSI ran: each party misses some IDs
        assert result["accuracy"] >= 0.85
    finally:
        for proc in procs.values():
            proc.terminate()
        for party, proc in procs.items():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log = tmp_path / f"{party}.log"
            if log.exists():
                print(f"--- {party} log (tail) ---\n{log.read_text()[-1500:]}")
