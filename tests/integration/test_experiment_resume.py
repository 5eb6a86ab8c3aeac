"""Killing `vflsec experiment` mid-way and starting it again runs only the cells that were not finished."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from vflsec.client.experiments import runner as exp_runner
from vflsec.client.experiments import scenario as exp_scenario

SCENARIO = """
name: killed
dataset: breast_cancer
backend: plain
passive_fraction: 0.3
training: {epochs: 2}
predictions: 100
attacks: [esa, ls_clamped]
sweep:
  rounding.decimals: [1, 2, 3, 4, 5, 6, 7]
"""


def test_a_killed_run_resumes_with_the_missing_cells_only(tmp_path: Path) -> None:
    path, out = tmp_path / "killed.yaml", tmp_path / "out"
    path.write_text(SCENARIO)
    scenario = exp_scenario.load_scenario(path)
    cells = exp_scenario.expand(scenario)
    assert len(cells) == 8  # one training, 8 cells: a run killed at its first cell cannot have finished them all
    command = [sys.executable, "-m", "vflsec.client.cli", "experiment", str(path), "--out", str(out), "--workers", "1"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not list((out / "cells").glob("*.json")):
            assert proc.poll() is None, "the run ended before its first cell was written"
            assert time.monotonic() < deadline, "no cell finished in 300 s"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # no clean shutdown: exactly an interruption
        proc.wait()
    finished = {p.name: p.read_bytes() for p in (out / "cells").glob("*.json")}
    assert 1 <= len(finished) < len(cells)
    assert not (out / "results.json").exists()

    ran: list[str] = []
    summary = exp_runner.run_experiment(
        scenario, out, workers=1, on_cell=lambda cell, result: ran.append("run" if result else "kept")
    )
    assert ran.count("kept") == len(finished) and ran.count("run") == len(cells) - len(finished)
    for name, content in finished.items():  # the finished cells were read back, not rewritten
        assert (out / "cells" / name).read_bytes() == content
    assert len(summary["rows"]) == 8 and len(json.loads((out / "results.json").read_text())["cells"]) == 8
