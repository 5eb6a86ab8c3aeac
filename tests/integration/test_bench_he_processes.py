"""`bench he --processes`: each party its own `vflsec serve` process, ckks beside plain, with the median training step
and the CPU each party process spent per epoch (read from /proc: the parties' own, not the operator's)."""

from __future__ import annotations

import os

import numpy as np

from vflsec.client.bench import he as bench_he


def test_party_processes_report_steps_and_their_cpu(tmp_path) -> None:
    lines: list[str] = []
    out = bench_he._processes(bench_he.bench_dataset(1200), tmp_path, 1, 128, lines.append)
    for key in ("train_epoch_seconds", "median_step_ms", "accuracy"):
        assert set(out[key]) == {"plain", "ckks"} and all(np.isfinite(v) and v > 0 for v in out[key].values())
    cpu = out["party_cpu_seconds_per_epoch"]
    assert set(cpu["ckks"]) == set(cpu["plain"]) == {"active", "passive-1", "coordinator"}
    # Under CKKS every party encrypts, multiplies or decrypts at each step: more CPU than plain's, at each party.
    assert all(cpu["ckks"][party] > cpu["plain"][party] >= 0 for party in cpu["ckks"])
    cores = len(os.sched_getaffinity(0))
    for backend in ("plain", "ckks"):
        assert np.isclose(out["cpu_bound_epoch_seconds"][backend], sum(cpu[backend].values()) / cores)
        # A step is part of an epoch: its median cannot exceed the epoch.
        assert out["median_step_ms"][backend] <= 1000 * out["train_epoch_seconds"][backend]
    assert out["ratios"]["median_step_ckks_over_plain"] > 0 and any("median step" in line for line in lines)
