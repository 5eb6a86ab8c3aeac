"""ye et al. on real trained active-top split-NNs, in process (prints one JSON object per experiment): the
masquerade and embedding-noise figures of docs/defenses.md.

    .venv/bin/python benchmarks/measure_ye.py [EXPERIMENT ...] [--epochs 5] [--seeds 3]

Default: all of ``EXPERIMENTS``; datasets from ``../shared/datasets``. The measurements are the package's
(vflsec.client.experiments.reproduce.ye_measure, which `vflsec reproduce` runs for ye's claims); ``small`` is this
script's own: the live masquerade test's synthetic set, over ``--seeds`` training seeds (see :func:`small_drop`).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from vflsec.client.experiments.reproduce.ye_measure import bank, covid, credit
from vflsec.services.data import datasets
from vflsec.services.defenses.embeddings import Masquerade, default_fabricated
from vflsec.services.models import splitnn as sn
from vflsec.services.models.splitnn.reference import accuracy, run_epochs

EXPERIMENTS = (
    "covid", "bank", "masquerade", "noise", "secretflow", "overhead", "small", "stack", "drop", "credit", "draws",
)  # fmt: skip

def small_drop(seeds: int, epochs: int = 30) -> dict[str, object]:
    """Masquerade's accuracy cost on the live test's synthetic set (tests/integration/test_splitnn_masquerade.py:
    2,000 rows, 3 active and 5 passive columns, one binary; min-max scaled, 1,400 training rows, Adam 0.05, batch
    128), in process: per training seed the undefended model and masquerade m = 1 and m = ⌈log₂ n⌉ (a fresh key),
    test and training accuracy, and the paired change in pp."""
    n, train_rows = 2000, 1400
    rng = np.random.default_rng(0)
    x_active = rng.normal(size=(n, 3))
    x_passive = np.hstack([rng.integers(0, 2, size=(n, 1)), rng.normal(size=(n, 4))])
    y = (x_active[:, 0] + 2 * x_passive[:, 0] + x_passive[:, 1] + rng.normal(0, 0.5, n) > 1.0).astype(np.int64)
    xa, xp = (datasets.Scaler.fit(x, "minmax").transform(x) for x in (x_active, x_passive))
    order = np.random.default_rng(1).permutation(n)
    tr, te = order[:train_rows], order[train_rows:]
    data = sn.SplitData((xa[tr], xp[tr]), y[tr], (xa[te], xp[te]), y[te])
    runs: dict[str, list[dict[str, float]]] = {"none": [], "m1": [], f"m{default_fabricated(n)}": []}
    for seed in range(seeds):
        for label in runs:
            m = None if label == "none" else int(label[1:])
            width = max(4 + (m or 0), 8)  # as the live party widens z_B: rank d_B − 1 plus m bits
            config = sn.SplitNNConfig("active-top", data.features, 2, passive_width=width)
            optim = sn.OptimizerConfig("adam", learning_rate=0.05)
            federation = sn.LocalFederation.create(config, optim, seed=seed)
            if m is not None:  # a fresh OS-entropy PRF key per run
                # ye's random drop: the documented cost; drop=binary hides the binary column the label needs
                layer = Masquerade(m, drop="random").build(5, width, bias=False)  # initial weights: OS entropy
                federation.bottoms[1] = sn.Bottom(layer, optim, 5, width)

            def step(rows: np.ndarray, fed: sn.LocalFederation = federation) -> float:
                return fed.train_step(tuple(b[rows] for b in data.train), data.y_train[rows])

            run_epochs(step, federation.end_epoch, train_rows, epochs, 128, seed)
            runs[label].append({"test": accuracy(federation.scores(data.test), data.y_test),
                                "train": accuracy(federation.scores(data.train), data.y_train)})  # fmt: skip
    out: dict[str, object] = {"experiment": "small_masquerade_accuracy", "seeds": seeds, "epochs": epochs}
    for label, rows in runs.items():
        change = [100 * (r["test"] - b["test"]) for r, b in zip(rows, runs["none"], strict=True)]
        out[label] = {
            "test": [round(r["test"], 4) for r in rows], "train": [round(r["train"], 4) for r in rows],
            "change_pp_mean": round(float(np.mean(change)), 2), "change_pp_sd": round(float(np.std(change)), 2),
            "change_pp_range": [round(min(change), 2), round(max(change), 2)],
        }  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("experiments", nargs="*", default=list(EXPERIMENTS), help=", ".join(EXPERIMENTS))
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seeds", type=int, default=3, help="training seeds of the masquerade runs")
    args = parser.parse_args()
    torch.set_num_threads(1)
    chosen = set(args.experiments)
    if "covid" in chosen:
        print(json.dumps(covid(args.epochs)), flush=True)
    if "small" in chosen:
        print(json.dumps(small_drop(args.seeds)), flush=True)
    if "credit" in chosen:
        for row in credit(args.epochs, args.seeds):
            print(json.dumps(row), flush=True)
    if "draws" in chosen and "credit" in chosen:
        for row in credit(args.epochs, args.seeds, draws=10):
            print(json.dumps(row), flush=True)
    if chosen - {"covid", "small", "credit"}:
        for row in bank(args.epochs, chosen, args.seeds):
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
