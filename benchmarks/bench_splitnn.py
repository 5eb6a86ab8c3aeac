"""Split-NN in-process epoch: federated (ckks / plain) vs the central torch model, accuracy and time per epoch.

    .venv/bin/python benchmarks/bench_splitnn.py [--dataset bank] [--epochs 3] [--batch 256] [--passive 1]
        [--topology coordinator-top] [--topology active-top]

One process plays every party (see services/models/splitnn/simulate.py): ciphertexts are serialised and parsed
at each hop, the key holder alone decrypts, but nothing crosses a socket. Prints one JSON object; per run the
mean and the best epoch (the least disturbed by other load), and ``ckks_over_plain`` for both.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from vflsec.services.data.datasets import load_dataset
from vflsec.services.models import splitnn as sn


def _summary(result: sn.RunResult, central: sn.RunResult | None = None) -> dict[str, float]:
    out = {
        "accuracy": round(result.accuracy, 4),
        "epoch_seconds_mean": round(float(np.mean(result.epoch_seconds)), 4),
        "epoch_seconds_best": round(min(result.epoch_seconds), 4),
    }
    if central is not None:
        out["max_score_diff_vs_central"] = float(np.abs(result.test_scores - central.test_scores).max())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="breast_cancer")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--passive", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--topology", action="append", choices=sn.TOPOLOGIES)
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny networks: intra-op threads only contend

    dataset = load_dataset(args.dataset)
    data = sn.SplitData.from_dataset(dataset, n_passive=args.passive, seed=0)
    optim = sn.OptimizerConfig("adam", learning_rate=0.01, weight_decay=1e-4)
    report: dict[str, object] = {"dataset": args.dataset, "features": data.features, "train": len(data.y_train),
                                 "test": len(data.y_test), "epochs": args.epochs, "batch": args.batch}
    for topology in args.topology or ["coordinator-top"]:
        config = sn.SplitNNConfig(topology, data.features, dataset.n_classes)
        run = {"epochs": args.epochs, "batch_size": args.batch, "seed": args.seed}
        central, _ = sn.central_run(config, optim, data, **run)
        runs: dict[str, object] = {"central": _summary(central)}
        for backend in ("plain", "ckks") if topology == "coordinator-top" else ("plain",):
            federated, _ = sn.simulate(config, optim, data, backend=backend, **run)
            runs[backend] = _summary(federated, central)
        if "ckks" in runs:
            runs["ckks_over_plain"] = {
                key: round(runs["ckks"][key] / runs["plain"][key], 2)  # type: ignore[index]
                for key in ("epoch_seconds_mean", "epoch_seconds_best")
            }
        report[topology] = runs
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
