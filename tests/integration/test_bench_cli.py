"""`vflsec bench cli` (issue 16): the command with the former defaults and today's side by side, on a small
table so CI stays fast; each run is the real CLI with every party its own process. The bench runs in its own
process, since it makes itself the subreaper of what it starts."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import json
from vflsec.client.bench import cli as bench_cli
command = ("attack", "--dataset", "breast_cancer", "--predictions", "60", "--attacks", "esa")
result = bench_cli.run(("plain",), command=command, timeout=600)
print(bench_cli.table(result))
print(json.dumps(result))
"""


def test_bench_cli_times_the_former_and_todays_defaults() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    *table, last = done.stdout.strip().splitlines()
    result = json.loads(last)
    assert result["cpu_counted_tree"] is True and result["former_defaults"] == "--epochs 30"
    plain = result["backends"]["plain"]
    for name in ("former", "today"):
        run = plain[name]
        assert run["wall_seconds"] > 0 and run["cpu_seconds"] > 0 and run["epochs"] == 30  # 454 rows: 30 either way
        assert set(run["phase_seconds"]) == {"load", "deal", "align", "train", "predict", "attack"}
        assert all(seconds > 0 for seconds in run["phase_seconds"].values()) and "esa" in run["mse_clipped"]
    assert plain["wall_ratio"] == plain["former"]["wall_seconds"] / plain["today"]["wall_seconds"]
    assert plain["accuracy_change_pp"] == 100 * (plain["today"]["accuracy"] - plain["former"]["accuracy"])
    assert any(line.startswith("plain   ratio") for line in table), table
