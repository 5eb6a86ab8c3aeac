"""Tree / forest training in process: federated ckks vs plain (time, messages), and accuracy vs scikit-learn.

    .venv/bin/python benchmarks/bench_tree.py [--dataset digits] [--dataset credit] [--model tree] [--model forest]
        [--trees 100] [--backend plain] [--backend ckks] [--parity-seeds 0]

One process plays every party (services/models/tree/simulate.py): ciphertexts are serialised and parsed at each
hop, the key holder alone decrypts, masks come from OS entropy, but nothing crosses a socket. ``tree`` is CART of
depth 5, ``forest`` ``--trees`` trees of depth 3 (luo's RF setting). ``--parity-seeds N`` adds, per dataset and
model, the plain federation's and scikit-learn's accuracy over model seeds 0..N-1 (mean, std, min, max): a forest's
accuracy moves by a few points with its seed, so parity is a statement about the mean. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from vflsec.services.models import tree as tm


def _config(model: str, trees: int, seed: int = 0) -> tm.TreeConfig:
    return tm.TreeConfig(seed=seed) if model == "tree" else tm.TreeConfig.forest(n_trees=trees, seed=seed)


def _stats(values: list[float]) -> dict[str, float]:
    return {k: round(float(f(values)), 4) for k, f in (("mean", np.mean), ("std", np.std), ("min", min), ("max", max))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", action="append")
    parser.add_argument("--model", action="append", choices=tm.KINDS)
    parser.add_argument("--trees", type=int, default=100)
    parser.add_argument("--backend", action="append", choices=["plain", "ckks"])
    parser.add_argument("--passive", type=int, default=1)
    parser.add_argument("--parity-seeds", type=int, default=0)
    args = parser.parse_args()

    report: list[dict[str, object]] = []
    for name in args.dataset or ["digits"]:
        data = tm.TreeData.load(name, n_passive=args.passive)
        for model in args.model or ["tree"]:
            config = _config(model, args.trees)
            entry: dict[str, object] = {
                "dataset": name, "model": model, "config": config.to_dict(), "features": data.features,
                "train": len(data.y_train), "test": len(data.y_test),
                "sklearn_accuracy": round(tm.accuracy(tm.central_votes(config, data), data.y_test), 4),
            }
            votes = {}
            for backend in args.backend or ["plain", "ckks"]:
                run = tm.simulate(config, data, backend)
                votes[backend] = run.votes
                entry[backend] = {"train_seconds": round(run.seconds, 2), "accuracy": round(run.accuracy, 4),
                                  "messages": run.federation.messages}
                print(json.dumps({"progress": [name, model, backend, round(run.seconds, 2)]}), flush=True)
            if {"plain", "ckks"} <= votes.keys():
                entry["ckks_over_plain"] = round(entry["ckks"]["train_seconds"] / entry["plain"]["train_seconds"], 1)  # type: ignore[index]
                entry["ckks_equals_plain"] = bool(np.array_equal(votes["plain"], votes["ckks"]))
            if args.parity_seeds:
                ours, theirs = [], []
                for seed in range(args.parity_seeds):
                    seeded = _config(model, args.trees, seed)
                    ours.append(tm.simulate(seeded, data, "plain").accuracy)
                    theirs.append(tm.accuracy(tm.central_votes(seeded, data), data.y_test))
                entry["parity"] = {"seeds": args.parity_seeds, "federated": _stats(ours), "sklearn": _stats(theirs),
                                   "mean_gap_pp": round(100 * (np.mean(ours) - np.mean(theirs)), 2)}
            report.append(entry)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
