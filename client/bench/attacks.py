"""Benchmark of the attack suite on synthetic LR tasks (prints JSON as the last line).

Goals on 2 cores: RCC2 on 1,000 samples ≤ 2 s, RCC1 on 1,000 samples ≤ 30 s, GRN on 10,000 predictions ≤ 60 s,
ye's Algorithm 2 on 41,188 split-NN embeddings of d_B = 10 passive features (one binary), 20 restarts ≤ 10 s.
Run: ``python -m vflsec.client.bench.attacks``.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np

from vflsec.services.attacks import Observations, make_attack, mse, run_attack
from vflsec.services.attacks.binary import attack_accuracy
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


def run() -> dict[str, Any]:
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
    ye_seconds, ye_accuracy = _ye_alg2()
    binary = {"ye_alg2_41188": {"seconds": ye_seconds, "accuracy": ye_accuracy}}
    return {"seconds": seconds, "mse": errors, "binary": binary}


def _ye_alg2(n: int = 41_188, d_passive: int = 10, sigma: float = 0.1) -> tuple[float, float]:
    """Algorithm 2 (20 restarts) on z_B = W x_B + noise, x_B one standardised binary and 9 Gaussian columns."""
    rng = np.random.default_rng(0)
    bits = (rng.random(n) < 0.3).astype(float)
    x = np.column_stack([(bits - bits.mean()) / bits.std(), rng.normal(size=(n, d_passive - 1))])
    z = x @ rng.normal(size=(d_passive, d_passive)).T + rng.normal(scale=sigma, size=(n, d_passive))
    obs = Observations(np.zeros((n, 1)), None, 2, d_passive, embeddings=z)
    start = time.perf_counter()
    found = run_attack(make_attack("ye_alg2", restarts=20, seed=0), obs).meta["binary_features"]
    seconds = round(time.perf_counter() - start, 3)
    return seconds, round(attack_accuracy(bits[:, None], found[:, :1], complements=True), 4)


if __name__ == "__main__":
    print(json.dumps(run()))
