"""``vflsec bench he``: HE-LR through the real services, ckks vs plain, side by side in one run.

Two parties (active + one passive) on a 30,000 x 23 binary set: Credit default from ../shared/datasets when
present, else a synthetic set of the same shape. Every party is a real gRPC server on loopback with mTLS;
the figures include serialisation and transport, as a deployment would see them.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from vflsec.client.federation import FederationSpec, run_in_process, write_federation
from vflsec.client.operator import Operator
from vflsec.services.data import datasets


def bench_dataset(rows: int, seed: int = 0) -> datasets.Dataset:
    try:
        ds = datasets.load_dataset("credit")
        return ds if rows >= ds.n_samples else ds.subset(np.arange(rows))
    except FileNotFoundError:
        rng = np.random.default_rng(seed)
        X = rng.normal(size=(rows, 23))
        y = (X @ rng.normal(size=23) + rng.logistic(size=rows) > 0).astype(np.int64)
        return datasets.Dataset(
            "synthetic-credit-shape",
            np.array([f"s{i:06d}" for i in range(rows)]),
            X,
            y,
            [f"x{j}" for j in range(23)],
            ["0", "1"],
        )


def _measure(layout, backend: str, epochs: int, batch_size: int, ds: datasets.Dataset) -> tuple[float, float, float]:
    """Seconds per training epoch, inference samples per second and accuracy of one session."""
    with run_in_process(layout), layout.operator_channel() as channel:
        operator = Operator(channel)
        info = operator.create_session(backend, batch_size=batch_size, learning_rate=0.05, seed=0)
        ids = operator.align(info.session_id)
        start = time.perf_counter()
        for _ in operator.train(info.session_id, ids, epochs):
            pass
        epoch_seconds = (time.perf_counter() - start) / epochs
        start = time.perf_counter()
        released = operator.predict(info.session_id, ids)
        throughput = len(ids) / (time.perf_counter() - start)
    labels = ds.y[datasets.select_ids(ds.ids, ids)]
    return epoch_seconds, throughput, float(np.mean(released.scores.argmax(axis=1) == labels))


def run(
    rows: int = 30000, epochs: int = 1, batch_size: int = 1024, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """ckks vs plain on the same federation set-up. The headline figures run without session checkpoints
    (they measure the cryptography); the checkpointed ckks epoch is reported beside them."""
    ds = bench_dataset(rows)
    result: dict[str, Any] = {
        "dataset": ds.name,
        "rows": ds.n_samples,
        "features": ds.n_features,
        "parties": 2,
        "batch_size": batch_size,
        "epochs": epochs,
        "train_epoch_seconds": {},
        "inference_samples_per_second": {},
        "accuracy": {},
    }
    with tempfile.TemporaryDirectory(prefix="vflsec-bench-") as tmp:
        for label, backend, checkpoints in (
            ("plain", "plain", False),
            ("ckks", "ckks", False),
            ("ckks_checkpointed", "ckks", True),
        ):
            spec = FederationSpec(ds, n_passive=1, drop_fraction=0.0, checkpoints=checkpoints, backend=backend)
            layout = write_federation(spec, Path(tmp) / label)
            epoch, throughput, accuracy = _measure(layout, backend, epochs, batch_size, ds)
            result["train_epoch_seconds"][label] = epoch
            result["inference_samples_per_second"][label] = throughput
            result["accuracy"][label] = accuracy
            log(f"{label:>17}: epoch {epoch:7.2f} s   inference {throughput:10.0f} samples/s   accuracy {accuracy:.4f}")
    t, s = result["train_epoch_seconds"], result["inference_samples_per_second"]
    result["ratios"] = {
        "train_ckks_over_plain": t["ckks"] / t["plain"],
        "inference_plain_over_ckks": s["plain"] / s["ckks"],
        "checkpoint_cost_per_epoch_seconds": t["ckks_checkpointed"] - t["ckks"],
    }
    log(
        f"ratios: training ckks/plain {result['ratios']['train_ckks_over_plain']:.1f}x, "
        f"inference plain/ckks {result['ratios']['inference_plain_over_ckks']:.1f}x"
    )
    return result
