"""docker-compose.yml cannot run here (no Docker engine): parse it, check it agrees with the configs that its
`prepare` command writes, then run its exact commands as local processes (a compose-equivalent launcher)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from vflsec.services.config import dump_toml, load_config

ROOT = Path(__file__).resolve().parents[2]
PARTIES = ("coordinator", "passive-1", "passive-2", "active")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def prepared(compose, tmp_path_factory) -> Path:
    """Run the `prepare` service's command with its volume mapped to a temporary folder."""
    out = tmp_path_factory.mktemp("federation")
    command = [arg.replace("/federation", str(out)) for arg in compose["services"]["prepare"]["command"]]
    done = subprocess.run([sys.executable, "-m", "vflsec.client.cli", *command], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return out


def _mounts(service: dict) -> dict[str, str]:
    """target -> volume subpath, for every read-only subpath mount of the federation volume."""
    mounts = {}
    for v in service["volumes"]:
        if isinstance(v, str):
            continue  # a writable named volume ("<party>-state:/state")
        assert v["source"] == "federation" and v["read_only"] is True
        mounts[v["target"]] = v["volume"]["subpath"]
    return mounts


def test_every_party_mounts_only_its_own_folder(compose, prepared) -> None:
    services = compose["services"]
    assert set(services) == {"prepare", "runner", *PARTIES}
    for party in PARTIES:
        service = services[party]
        assert _mounts(service) == {"/party": party}
        role = "passive" if party.startswith("passive") else party
        assert service["command"] == ["serve", role, "--config", "/party/config.toml"]
        config = load_config(prepared / party / "config.toml", role)
        assert config.party_id == party
        # Checkpoints go to the party's own writable volume, not into the read-only party folder.
        assert f"{party}-state:/state" in service["volumes"] and f"{party}-state" in compose["volumes"]
        assert config.state_dir == Path("/state")
        # Config paths are relative to the party folder, which is mounted at /party.
        for path in (config.tls.ca, config.tls.cert, config.tls.key, *([config.data.path] if config.data else [])):
            assert path.is_relative_to(prepared / party) and path.exists()
        assert not (prepared / party / "tls" / "ca.key").exists()  # the CA key never reaches a party


def test_ports_hostnames_and_health_checks_agree_with_configs(compose, prepared) -> None:
    services = compose["services"]
    configs = {party: load_config(prepared / party / "config.toml") for party in PARTIES}
    ports = {party: int(c.listen.rsplit(":", 1)[1]) for party, c in configs.items()}
    for party, config in configs.items():
        assert config.listen.startswith("0.0.0.0:")
        assert services[party]["expose"] == [str(ports[party])]
        test = services[party]["healthcheck"]["test"]
        assert test[test.index("--address") + 1] == f"localhost:{ports[party]}"
        assert test[test.index("--party") + 1] == party
        # Peers are reached by compose service name at the port that service listens on.
        for peer, address in config.peers.items():
            assert address == f"{peer}:{ports[peer]}" and peer in services
    runner = services["runner"]
    assert runner["command"][runner["command"].index("--active") + 1] == f"active:{ports['active']}"
    assert _mounts(runner) == {"/operator": "operator", "/labels": "active"}
    assert set(services["active"]["depends_on"]) == {"coordinator", "passive-1", "passive-2"}


def _local(address: str) -> str:
    return "127.0.0.1:" + address.rsplit(":", 1)[1]


@pytest.mark.slow
def test_compose_commands_run_as_local_processes(compose, prepared, tmp_path) -> None:
    """The same commands, configs and files; only the compose network's host names become loopback."""
    services = compose["services"]
    procs: list[subprocess.Popen] = []
    try:
        for party in PARTIES:
            folder = tmp_path / party
            shutil.copytree(prepared / party, folder)
            raw = tomllib.loads((folder / "config.toml").read_text())
            raw["listen"] = _local(raw["listen"])
            raw["peers"] = {peer: _local(a) for peer, a in raw.get("peers", {}).items()}
            raw["state"]["dir"] = str(tmp_path / f"{party}-state")  # the named volume
            (folder / "config.toml").write_text(dump_toml(raw))
            command = [a.replace("/party", str(folder)) for a in services[party]["command"]]
            procs.append(subprocess.Popen([sys.executable, "-m", "vflsec.client.cli", *command]))
        mounts = {"/operator": prepared / "operator", "/labels": prepared / "active"}
        command = []
        for arg in services["runner"]["command"]:
            for target, source in mounts.items():
                arg = arg.replace(target, str(source))
            command.append(_local(arg) if arg.startswith("active:") else arg)
        done = subprocess.run(
            [sys.executable, "-m", "vflsec.client.cli", *command], capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["n_passive"] == 2 and result["backend"] == "ckks"
        assert result["accuracy"] >= 0.9  # ckks vs plain: fresh block-sum flooding can tip a borderline row
        assert abs(result["accuracy"] - result["plain_accuracy"]) <= 2 / result["n_test"] + 1e-12  # as test_demo
        for party in PARTIES:  # the compose health checks, run as compose would
            cmd, program, *args = services[party]["healthcheck"]["test"]
            assert (cmd, program) == ("CMD", "vflsec")
            args = [a.replace("/party", str(tmp_path / party)) for a in args]
            health = subprocess.run([sys.executable, "-m", "vflsec.client.cli", *args], capture_output=True)
            assert health.returncode == 0, health.stderr
    finally:
        hung = stop(procs)
    assert not hung, f"still running {STOP_SECONDS} s after SIGTERM: {hung}"


STOP_SECONDS = 60  # drain (2 s grace) and checkpoint; 10 s timed out once on a loaded 2-core machine


def stop(procs: list[subprocess.Popen]) -> list[str]:
    """SIGTERM every party and wait; kill any that has not stopped (it would keep its fixed port for the next
    test) and name it."""
    for proc in procs:
        proc.terminate()
    hung = []
    for proc in procs:
        try:
            proc.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            hung.append(" ".join(map(str, proc.args[-3:])))
    return hung


def test_plain_is_allowed_only_because_the_runner_compares_against_it(compose, prepared) -> None:
    services = compose["services"]
    assert "--compare-plain" in services["runner"]["command"] and "--allow-plain" in services["prepare"]["command"]
    assert load_config(prepared / "coordinator" / "config.toml").allowed_backends == ("ckks", "plain")
