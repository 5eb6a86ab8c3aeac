"""The tree-attack figures of docs/attacks.md ("Trees"; `embedding_ls` in "Split neural networks").

    .venv/bin/python benchmarks/measure_tree_attacks.py pra
    .venv/bin/python benchmarks/measure_tree_attacks.py rf FRACTION DATASET[,DATASET...] SEEDS
    .venv/bin/python benchmarks/measure_tree_attacks.py els
    .venv/bin/python benchmarks/measure_tree_attacks.py services-rf [TRIALS]

Random draws (PRA's path choice, the baselines) come from fresh OS entropy; mean ± standard deviation are over
the splits (seed s: rows, columns and model), NaN-free splits only (a tree may test no passive feature).
"""

from __future__ import annotations

import sys

import numpy as np

from vflsec.services.attacks import make_attack, mse, run_attack
from vflsec.services.attacks.synthetic import SKLEARN_TASKS, TreeTask, trained_splitnn_task, trained_tree_task
from vflsec.services.attacks.trees import correct_branching_rate, random_path_cbr

RNG = np.random.default_rng()


def summary(values: dict[str, list[float]]) -> str:
    return ", ".join(
        f"{k} {np.nanmean(v):.4f} ± {np.nanstd(v):.4f}" + (f" ({np.isnan(v).sum()} NaN)" if np.isnan(v).any() else "")
        for k, v in values.items()
    )


def pra() -> None:
    for fraction in (0.4, 0.1):
        for dataset in SKLEARN_TASKS:
            keys = ("accuracy", "cbr_pra", "cbr_random_path", "mse_pra", "mse_half")
            r: dict[str, list[float]] = {k: [] for k in keys}
            for seed in range(10):  # 10 trials: a fresh split, tree and path draw each
                task = trained_tree_task(dataset, "tree", fraction, seed=seed)
                x_hat = run_attack(make_attack("pra"), task.observe()).x_passive
                r["accuracy"].append(task.accuracy)
                r["cbr_pra"].append(correct_branching_rate(task.trees, task.x_active, task.x_passive, x_hat))
                r["cbr_random_path"].append(random_path_cbr(task.trees[0], task.x_passive, RNG))
                r["mse_pra"].append(mse(task.x_passive, x_hat))
                r["mse_half"].append(mse(task.x_passive, np.full_like(x_hat, 0.5)))
            print(f"pra d_p/d={fraction} {dataset}: {summary(r)}", flush=True)


def rf(fraction: float, datasets: list[str], seeds: int) -> None:
    for dataset in datasets:
        r: dict[str, list[float]] = {}
        for seed in range(seeds):
            task = trained_tree_task(dataset, "forest", fraction, seed=seed)

            def cbr(x_hat: np.ndarray, task: TreeTask = task) -> float:
                return correct_branching_rate(task.trees, task.x_active, task.x_passive, x_hat)

            half = np.full_like(task.x_passive, 0.5)
            row = {
                "accuracy": task.accuracy,
                "cbr_uniform": float(np.mean([cbr(RNG.uniform(size=half.shape)) for _ in range(10)])),
                "cbr_half": cbr(half),
                "mse_half": mse(task.x_passive, half),
            }
            for name in ("grn_rf", "grn_rf_own"):
                result = run_attack(make_attack(name), task.observe())
                row |= {f"cbr_{name}": cbr(result.x_passive), f"mse_{name}": mse(task.x_passive, result.x_passive)}
                row[f"agreement_{name}"] = result.meta["surrogate_agreement"]
            for k, v in row.items():
                r.setdefault(k, []).append(v)
            print(f"  rf d_p/d={fraction} {dataset} split {seed}: " + ", ".join(f"{k} {v:.4f}" for k, v in row.items()))
        print(f"rf d_p/d={fraction} {dataset}: {summary(r)}", flush=True)


def els() -> None:
    for dataset in ("breast_cancer", "digits"):
        errors, halves = [], []
        for seed in range(4):
            task = trained_splitnn_task(dataset, "active-top", seed=seed)
            x_hat = run_attack(make_attack("embedding_ls"), task.observe()).x_passive
            errors.append(mse(task.x_passive, x_hat))
            halves.append(mse(task.x_passive, np.full_like(x_hat, 0.5)))
        per_split = [f"{e:.2g}" for e in errors]
        print(f"els {dataset}: mean {np.mean(errors):.3g} per split {per_split}, Half {np.mean(halves):.4f}")


def services_rf(trials: int) -> None:
    """GRN on RF through the services (docs/trees.md): RF 100 trees of depth 3, 10 % random passive columns."""
    import json

    from vflsec.client.experiments.reproduce.luo import _tree_trials
    from vflsec.services.data.datasets import RandomColumns

    for dataset in ("wine", "breast_cancer"):
        result = _tree_trials(
            dataset, "forest", ["grn_rf", "grn_rf_own"], trials, passive_features=RandomColumns(0.1),
            param_release=["thresholds"],  # luo's setting: a tree keeps them home unless asked
        )
        print(json.dumps({"dataset": dataset, **result}), flush=True)


if __name__ == "__main__":
    part = sys.argv[1]
    if part == "pra":
        pra()
    elif part == "rf":
        rf(float(sys.argv[2]), sys.argv[3].split(","), int(sys.argv[4]))
    elif part == "els":
        els()
    elif part == "services-rf":
        services_rf(int(sys.argv[2]) if len(sys.argv) > 2 else 10)
    else:
        raise SystemExit(f"unknown part {part!r}: pra, rf, els or services-rf")
