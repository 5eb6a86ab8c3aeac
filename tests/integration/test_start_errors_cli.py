"""Start-up errors reach the operator as the CLI's clean failure (review 8b L1): a party that refuses its shard at
start (masquerade drop=binary on an all-binary block) stops `vflsec serve` with one error line, `vflsec demo` and
`vflsec attack` (party processes) with the end of its log and no path to a log folder already deleted, and an
unknown --passive-features column names the known ones; exit 2 and no traceback everywhere."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from vflsec.client.cli import app
from vflsec.services.config import load_config
from vflsec.services.engines import checkpoint

ALL_BINARY = (
    "no direction of this party's 2 columns leaves out its binary columns (b1, b2) and is uncorrelated with them; use "
    "masquerade:drop=random"
)


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> str:
    """Two continuous columns for the active party, two binary ones for the passive party."""
    rng = np.random.default_rng(0)
    x, bits = rng.normal(size=(200, 2)), (rng.random((200, 2)) < 0.4).astype(int)
    y = (x[:, 0] + bits[:, 0] > 0.5).astype(int)
    path = tmp_path_factory.mktemp("data") / "binary.csv"
    rows = [f"{a:.4f},{b:.4f},{c},{d},{label}" for (a, b), (c, d), label in zip(x, bits, y, strict=True)]
    path.write_text("\n".join(["x1,x2,b1,b2,label", *rows]) + "\n")
    return str(path)


def _all_binary_passive(command: str, table: str) -> list[str]:
    return [
        command, "--dataset", table, "--model", "splitnn", "--topology", "active-top", "--embedding-release",
        "masquerade", "--passive-features", "b1,b2", "--epochs", "1",
    ]  # fmt: skip


def _serve(role: str, config: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vflsec.client.cli", "serve", role, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,  # a party that serves after all would block: the test then fails, it does not hang
    )


def test_a_party_refusing_its_shard_fails_demo_and_serve_cleanly(table: str, tmp_path: Path) -> None:
    workdir = tmp_path / "federation"
    result = CliRunner().invoke(app, [*_all_binary_passive("demo", table), "--workdir", str(workdir)])
    log = workdir / "logs" / "passive-1.log"
    assert result.exit_code == 2, result.output
    assert f"error: passive-1 exited during start-up; the end of {log}:\n" in result.output  # kept: named
    assert f"error: passive passive-1 cannot start: masquerade drop=binary: {ALL_BINARY}" in result.output
    assert "Traceback" not in result.output and "Traceback" not in log.read_text()

    served = _serve("passive", workdir / "passive-1" / "config.toml")  # the same config, by its operator
    assert served.returncode == 2, served.stderr
    assert f"error: passive passive-1 cannot start: masquerade drop=binary: {ALL_BINARY}" in served.stderr
    assert "Traceback" not in served.stderr

    with socket.socket() as taken:  # the coordinator's port is held by another process
        config = workdir / "coordinator" / "config.toml"
        listen = re.search(r'^listen = "(.*):(\d+)"$', config.read_text(), re.MULTILINE)
        assert listen is not None
        taken.bind((listen[1], int(listen[2])))
        taken.listen()
        served = _serve("coordinator", config)
    assert served.returncode == 2, served.stderr
    assert f"error: coordinator coordinator cannot start: cannot listen on {listen[1]}:{listen[2]}" in served.stderr
    assert "Traceback" not in served.stderr

    # Its state folder is held by a running party (review 19 L4): refused before anything there is read or swept.
    state = load_config(config).state_dir
    assert state is not None
    holder = checkpoint.StateDir(state, exclusive=True)
    in_flight = state / ".owners.abc123.tmp"  # the holder's write between mkstemp and rename
    in_flight.write_bytes(b"x")
    try:
        served = _serve("coordinator", config)
    finally:
        holder.release()
    assert served.returncode == 2, served.stderr
    assert f"error: coordinator coordinator cannot start: state folder {state} is held by another running" in (
        served.stderr
    )
    assert "Traceback" not in served.stderr and in_flight.exists()
    checkpoint.StateDir(state, exclusive=True).release()  # released: the next party takes it (and sweeps)
    assert not in_flight.exists()


def test_a_party_refusing_its_shard_fails_attack_without_naming_a_deleted_log(table: str) -> None:
    result = CliRunner().invoke(app, _all_binary_passive("attack", table))
    assert result.exit_code == 2, result.output
    assert "error: passive-1 exited during start-up; the end of its log:\n" in result.output
    assert f"error: passive passive-1 cannot start: masquerade drop=binary: {ALL_BINARY}" in result.output
    assert "Traceback" not in result.output and "vflsec-attack-" not in result.output  # the temporary folder is gone


def test_an_unknown_passive_column_is_named_with_the_known_ones(table: str) -> None:
    result = CliRunner().invoke(app, ["attack", "--dataset", table, "--passive-features", "b1,b3"])
    assert result.exit_code == 2, result.output
    assert (
        f"error: passive features ('b1', 'b3') on {table}: unknown passive column(s) ['b3']; available: "
        "['x1', 'x2', 'b1', 'b2']" in result.output
    )
    assert "Traceback" not in result.output
