"""``vflsec bench embedding``: what a passive party's embedding defense costs, side by side in one run.

Split-NN active-top through the real services (every party a gRPC server on loopback with mTLS, in this
process) on Bank marketing with ye's split, the passive party holding the binary ``contact`` among 8 columns,
or, when ../shared/datasets is absent, a synthetic set of the same shape. One federation per passive defense —
none, ``masquerade:m=1``, ``masquerade`` at its default m = ⌈log₂ n⌉ (both at the default drop=binary: the party
widens z_B to d_B − k + m, k its binary columns, and announces it), ``embedding_noise`` — all started once; the
same split, seed and training in each; the runs interleaved (one session per defense in turn) so that load drifts
on the shared machine hit every defense alike. Each run is a new session, so new masquerade and noise PRF keys
(OS entropy): the accuracy is reported as mean and spread over the runs, beside the majority-class rate of the
held-out rows (what a model that learned nothing scores). Times: wall and CPU seconds per epoch (CPU of this
whole process, every party included), medians over the runs, and their ratio to none; an untimed warm-up session
first.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from vflsec.client.federation.catalog import BANK_PASSIVE
from vflsec.client.federation.launcher import FederationSpec, run_in_process, write_federation
from vflsec.client.federation.operator import Operator
from vflsec.services.data import datasets

SIGMA = 0.1  # embedding noise of the comparison (z_B entries are O(1) on min-max scaled inputs)
SETTINGS = {"family": "splitnn", "settings": {"topology": "active-top", "embedding": 16, "top_hidden": [32]}}
LEARNING_RATE, BATCH = 0.01, 256  # ye §7's training (Adam)


def bench_dataset(rows: int | None, seed: int = 0) -> tuple[datasets.Dataset, list[str]]:
    """Bank (a seeded sample of ``rows`` of its rows: the file is in date order) and ye's passive columns, or a
    synthetic set of Bank's shape."""
    try:
        ds = datasets.load_dataset("bank")
        if rows is not None and rows < ds.n_samples:
            ds = ds.subset(np.sort(np.random.default_rng(seed).choice(ds.n_samples, rows, replace=False)))
        return ds, list(BANK_PASSIVE)
    except FileNotFoundError:
        n = rows or 41_188
        rng = np.random.default_rng(seed)
        active, passive = rng.normal(size=(n, 8)), rng.normal(size=(n, 8))
        passive[:, 0] = rng.integers(0, 2, size=n)
        y = (active[:, 0] + 2 * passive[:, 0] + passive[:, 1] + rng.logistic(size=n) > 1.5).astype(np.int64)
        names = [f"a{j}" for j in range(8)] + [f"b{j}" for j in range(8)]
        ids = np.array([f"s{i:06d}" for i in range(n)])
        X = np.hstack([active, passive])
        return datasets.Dataset("synthetic-bank-shape", ids, X, y, names, ["0", "1"]), names[8:]


def defenses(n_rows: int) -> dict[str, list[str]]:
    m = math.ceil(math.log2(n_rows))
    return {
        "none": [],
        "masquerade m=1": ["masquerade:m=1"],
        f"masquerade m={m} (default)": ["masquerade"],
        f"embedding_noise sigma={SIGMA}": [f"embedding_noise:sigma={SIGMA}"],
    }


def _session(
    layout: Any, ds: datasets.Dataset, epochs: int, seed: int, test_fraction: float = 0.2
) -> dict[str, float]:
    """One active-top session: train on 80 % of the aligned rows, score the rest at the active party."""
    with layout.operator_channel() as channel:
        operator = Operator(channel)
        info = operator.create_session(
            "plain", learning_rate=LEARNING_RATE, batch_size=BATCH, seed=seed, **SETTINGS  # type: ignore[arg-type]
        )
        common = sorted(operator.align(info.session_id))
        labels = ds.y[datasets.select_ids(ds.ids, common)]
        train_ids, test_ids = datasets.train_test_split_ids(np.array(common), labels, test_fraction, seed)
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in operator.train(info.session_id, [str(i) for i in train_ids], epochs):
            pass
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        released = operator.predict(info.session_id, [str(i) for i in test_ids])
        operator.close(info.session_id)
    truth = ds.y[datasets.select_ids(ds.ids, released.sample_ids)]
    accuracy = float(np.mean(released.scores.argmax(axis=1) == truth))
    majority = float(np.bincount(truth).max() / len(truth))  # what always answering the majority class scores
    return {"epoch_seconds": wall / epochs, "epoch_cpu_seconds": cpu / epochs, "accuracy": accuracy,
            "majority_rate": majority}  # fmt: skip


def run(
    rows: int | None = None, epochs: int = 10, runs: int = 3, seed: int = 0, log: Callable[[str], None] = print
) -> dict[str, Any]:
    ds, passive = bench_dataset(rows, seed)
    chains = defenses(ds.n_samples)
    out: dict[str, Any] = {
        "dataset": ds.name, "n_rows": ds.n_samples, "passive_features": passive, "epochs": epochs, "runs": runs,
        "learning_rate": LEARNING_RATE, "batch_size": BATCH, "defenses": {name: list(c) for name, c in chains.items()},
        "per_run": {name: [] for name in chains},
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="vflsec-bench-embedding-") as tmp, contextlib.ExitStack() as stack:
        layouts = {}
        for i, (name, chain) in enumerate(chains.items()):
            spec = FederationSpec(
                ds, n_passive=1, passive_features=passive, backend="plain", model="splitnn", topology="active-top",
                embedding_release=chain, drop_fraction=0.0, checkpoints=False, seed=seed,
            )  # fmt: skip
            layouts[name] = write_federation(spec, Path(tmp) / f"fed{i}")
            stack.enter_context(run_in_process(layouts[name]))
        _session(layouts["none"], ds, 1, seed)  # warm-up, untimed: the process's first session pays one-off setup
        for r in range(runs):
            for name in chains:
                result = _session(layouts[name], ds, epochs, seed)
                out["per_run"][name].append(result)
                log(
                    f"run {r + 1}/{runs} {name:<28} epoch {result['epoch_seconds']:6.2f} s wall "
                    f"{result['epoch_cpu_seconds']:6.2f} s CPU   accuracy {result['accuracy']:.4f} "
                    f"(majority class {result['majority_rate']:.4f})"
                )
    out["summary"] = summary(out["per_run"])
    for line in table(out["summary"]):
        log(line)
    return out


def summary(per_run: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Median epoch times and their ratio to none; accuracy mean, spread, and its change from none in pp."""
    base = per_run["none"]
    median = lambda rows, key: float(np.median([r[key] for r in rows]))  # noqa: E731
    out: dict[str, dict[str, float]] = {}
    for name, rows in per_run.items():
        acc = [r["accuracy"] for r in rows]
        out[name] = {
            "epoch_seconds": median(rows, "epoch_seconds"),
            "epoch_cpu_seconds": median(rows, "epoch_cpu_seconds"),
            "wall_ratio": median(rows, "epoch_seconds") / median(base, "epoch_seconds"),
            "cpu_ratio": median(rows, "epoch_cpu_seconds") / median(base, "epoch_cpu_seconds"),
            "accuracy_mean": float(np.mean(acc)),
            "accuracy_min": float(np.min(acc)),
            "accuracy_max": float(np.max(acc)),
            "accuracy_change_pp": 100 * (float(np.mean(acc)) - float(np.mean([r["accuracy"] for r in base]))),
        }
        if all("majority_rate" in r for r in rows):  # the same held-out rows every run
            out[name]["majority_rate"] = float(np.mean([r["majority_rate"] for r in rows]))
    return out


def table(summary: dict[str, dict[str, float]]) -> list[str]:
    lines = [
        f"{'defense':<28} {'epoch s':>8} {'ratio':>6} {'CPU s':>8} {'ratio':>6}   accuracy mean [min, max]   Δ pp"
        "   majority class"
    ]
    for name, s in summary.items():
        majority = f"   {s['majority_rate']:.4f}" if "majority_rate" in s else ""
        lines.append(
            f"{name:<28} {s['epoch_seconds']:8.2f} {s['wall_ratio']:6.2f} {s['epoch_cpu_seconds']:8.2f} "
            f"{s['cpu_ratio']:6.2f}   {s['accuracy_mean']:.4f} [{s['accuracy_min']:.4f}, {s['accuracy_max']:.4f}]"
            f"   {s['accuracy_change_pp']:+.2f}{majority}"
        )
    return lines
