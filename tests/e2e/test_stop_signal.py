"""A stopped run leaves nothing behind (issue 31, item 11): `vflsec demo` sent SIGTERM (`vflsec attack` SIGINT)
during training stops its `vflsec serve` processes, removes its temporary federation folder (keys and all) and says
so in one line. The phase lines print when piped (issue 31, item 4): the test waits for training's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


def _serving(marker: str) -> list[int]:
    """The pids of processes whose command line mentions ``marker`` (the party processes' config paths do)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmdline and " serve " in cmdline:
                pids.append(int(proc.name))
    return pids


@pytest.mark.parametrize(
    ("command", "signum"), [("demo", signal.SIGTERM), ("attack", signal.SIGINT)], ids=["demo-SIGTERM", "attack-SIGINT"]
)
def test_a_stopped_run_stops_its_parties_and_removes_its_folder(tmp_path, command: str, signum: int) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}  # the run's temporary federation folder lands here
    args = [command, "--dataset", "breast_cancer", "--backend", "plain", "--epochs", "3000"]
    demo = subprocess.Popen(
        [sys.executable, "-m", "vflsec.client.cli", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    assert demo.stdout is not None
    for line in demo.stdout:  # the phase lines print when piped too
        lines.append(line)
        if line.startswith("train:"):
            break
    else:
        pytest.fail("".join(lines))
    time.sleep(1.0)  # inside training's first epochs
    assert _serving(str(tmp)), "the parties were not serving during training"
    demo.send_signal(signum)
    rest, _ = demo.communicate(timeout=60)
    assert demo.returncode == 128 + signum, "".join(lines) + rest
    (said,) = [line for line in rest.splitlines() if line.startswith("stopped by")]
    assert said.startswith(f"stopped by {signal.Signals(signum).name}: stopped 3 party processes; removed ")
    assert "(keys first)" in said
    assert not _serving(str(tmp)) and list(tmp.iterdir()) == []
