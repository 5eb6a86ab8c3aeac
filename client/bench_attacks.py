"""Benchmark of the attack suite on synthetic LR tasks (prints JSON as the last line).

Goals on 2 cores: RCC2 on 1,000 samples ≤ 2 s, RCC1 on 1,000 samples ≤ 30 s, GRN on 10,000 predictions ≤ 60 s.
Run: ``python -m vflsec.client.bench_attacks``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from vflsec.services.attacks import make_attack, mse, run_attack
from vflsec.services.attacks.synthetic import SyntheticTask, lr_task

# name -> (n predictions, d_active, d_passive, classes, rho): "base" is Bank-sized; "wide" has a 13-dim null
# space, so Half* often leaves the cube and every RCC1 SDP is larger.
TASKS: dict[str, tuple[int, int, int, int, float]] = {
    "base": (1000, 10, 9, 3, 0.5),
    "base_10000": (10_000, 10, 9, 3, 0.5),
    "wide": (1000, 6, 20, 8, 0.3),
}
# (label, attack, options, task)
CASES: tuple[tuple[str, str, dict[str, Any], str], ...] = (
    ("half_star_1000", "half_star", {}, "base"),
    ("cls_1000", "cls", {}, "base"),
    ("rcc2_1000", "rcc2", {}, "base"),
    ("rcc1_1000", "rcc1", {}, "base"),
    ("rcc2_1000_wide", "rcc2", {}, "wide"),
    ("rcc1_1000_wide", "rcc1", {}, "wide"),
    ("gia_1000", "gia", {}, "base"),
    ("am_1000", "am", {}, "base"),
    ("ram_1000", "ram", {"n_refine": 100}, "base"),
    ("grn_10000", "grn", {}, "base_10000"),
    ("grn_10000_2threads", "grn", {"threads": 2}, "base_10000"),
    ("zero_1000", "zero", {}, "base"),
    ("half_1000", "half", {}, "base"),
    ("rg_1000", "rg", {}, "base"),
)


def _task(name: str) -> SyntheticTask:
    n, d_active, d_passive, n_classes, rho = TASKS[name]
    return lr_task(n, d_active, d_passive, n_classes, rho=rho, n_train=5000, seed=0)


def run() -> dict[str, dict[str, float]]:
    """Time every case and report the MSE it reached (the harness view: ground truth is used only here)."""
    tasks = {name: _task(name) for name in TASKS}
    seconds: dict[str, float] = {}
    errors: dict[str, float] = {}
    for label, name, options, task_name in CASES:
        task = tasks[task_name]
        attack = make_attack(name, **options)
        start = time.perf_counter()
        result = run_attack(attack, task.obs)
        seconds[label] = round(time.perf_counter() - start, 3)
        errors[label] = round(mse(task.x_passive, result.x_passive), 5)
    return {"seconds": seconds, "mse": errors}


if __name__ == "__main__":
    print(json.dumps(run()))
