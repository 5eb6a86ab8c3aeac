"""Benchmark of the attack suite on synthetic LR tasks (prints JSON as the last line).

Goals on 2 cores: RCC2 on 1,000 samples ≤ 2 s, RCC1 on 1,000 samples ≤ 30 s, GRN on 10,000 predictions ≤ 60 s.
Run: ``python -m vflsec.client.bench_attacks``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from vflsec.services.attacks import make_attack, mse, run_attack
from vflsec.services.attacks.synthetic import lr_task

# (label, attack, options, number of predictions)
CASES: tuple[tuple[str, str, dict[str, Any], int], ...] = (
    ("half_star_1000", "half_star", {}, 1000),
    ("cls_1000", "cls", {}, 1000),
    ("rcc2_1000", "rcc2", {}, 1000),
    ("rcc1_1000", "rcc1", {}, 1000),
    ("gia_1000", "gia", {}, 1000),
    ("am_1000", "am", {}, 1000),
    ("ram_1000", "ram", {"n_refine": 100}, 1000),
    ("grn_10000", "grn", {}, 10_000),
    ("grn_10000_2threads", "grn", {"threads": 2}, 10_000),
)


def run() -> dict[str, dict[str, float]]:
    """Time every case on one task family (10 active, 9 passive features, 3 classes, ρ = 0.5)."""
    seconds: dict[str, float] = {}
    errors: dict[str, float] = {}
    tasks = {n: lr_task(n, 10, 9, 3, rho=0.5, n_train=5000, seed=0) for n in {case[3] for case in CASES}}
    for label, name, options, n in CASES:
        task = tasks[n]
        attack = make_attack(name, **options)
        start = time.perf_counter()
        result = run_attack(attack, task.obs)
        seconds[label] = round(time.perf_counter() - start, 3)
        errors[label] = round(mse(task.x_passive, result.x_passive), 5)
    for name in ("half", "rg"):
        errors[f"{name}_1000"] = round(
            mse(tasks[1000].x_passive, run_attack(make_attack(name), tasks[1000].obs).x_passive), 5
        )
    return {"seconds": seconds, "mse": errors}


if __name__ == "__main__":
    print(json.dumps(run()))
