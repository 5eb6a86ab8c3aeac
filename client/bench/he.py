"""``vflsec bench he``: HE-LR, a split-NN epoch and a tree through the real services, ckks vs plain, side by side.

Two parties (active + one passive) on a 30,000 x 23 binary set: Credit default from ../shared/datasets when
present, else a synthetic set of the same shape; the decision tree (under "tree") also on digits. Every party is a
real gRPC server on loopback with mTLS; the figures include serialisation and transport, as a deployment would see them.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from vflsec.client import profiling
from vflsec.client.federation.launcher import FederationSpec, run_in_process, run_processes, write_federation
from vflsec.client.federation.operator import Operator
from vflsec.services.data import datasets


def synthetic_dataset(
    rows: int, features: int = 23, seed: int = 0, name: str = "synthetic-credit-shape"
) -> datasets.Dataset:
    """Standard normal features and a binary label from a noisy linear rule over all of them (classes about even)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(rows, features))
    y = (X @ rng.normal(size=features) + rng.logistic(size=rows) > 0).astype(np.int64)
    width = max(6, len(str(rows - 1)))
    return datasets.Dataset(
        name, np.array([f"s{i:0{width}d}" for i in range(rows)]), X, y, [f"x{j}" for j in range(features)], ["0", "1"]
    )


def bench_dataset(rows: int, seed: int = 0) -> datasets.Dataset:
    try:
        ds = datasets.load_dataset("credit")
        return ds if rows >= ds.n_samples else ds.subset(np.arange(rows))
    except FileNotFoundError:
        return synthetic_dataset(rows, seed=seed)


def scaling_for(ds: datasets.Dataset) -> tuple[str, str]:
    """Standard scaling, as the demo trains LR, unless it would reach past the parties' feature bound (then min-max,
    as the CLI's default falls back); and why. Min-max columns ([0, 1], mean about 1/2) tie the bias to every weight:
    one epoch of Adam at 0.05 then stops anywhere in the bias's oscillation, and accuracies of identical runs on the
    synthetic set spread from 0.63 to 0.87 (docs/performance.md, "Why bench he's accuracies wandered")."""
    from vflsec.services.crypto import he

    peak = FederationSpec(ds, n_passive=1, drop_fraction=0.0, scaling="standard").scaled_peak()
    if peak <= he.FEATURE_BOUND:
        return "standard", f"standard (largest |x| {peak:.3g} <= the parties' bound {he.FEATURE_BOUND:g})"
    return "minmax", f"minmax: standard scaling would reach |x| = {peak:.4g} > {he.FEATURE_BOUND:g}, the parties' bound"


def _spec(ds: datasets.Dataset, backend: str = "ckks", checkpoints: bool = False) -> FederationSpec:
    """Active + one passive party, no ID dropped, the bench's scaling (:func:`scaling_for`)."""
    return FederationSpec(
        ds, n_passive=1, drop_fraction=0.0, checkpoints=checkpoints, backend=backend, scaling=scaling_for(ds)[0]
    )


def _measure(
    layout, backend: str, epochs: int, batch_size: int, ds: datasets.Dataset, start_parties: Callable = run_in_process,
    predict: bool = True, model: Mapping[str, Any] | None = None,
) -> tuple[float, float, float]:
    """Seconds per training epoch, inference samples per second and accuracy of one session (without
    ``predict``: the epoch only, the other two NaN); ``model``: the family and its settings (default LR)."""
    with start_parties(layout), layout.operator_channel() as channel:
        operator = Operator(channel)
        info = operator.create_session(backend, batch_size=batch_size, learning_rate=0.05, seed=0, **(model or {}))
        ids = operator.align(info.session_id)
        start = time.perf_counter()
        for _ in operator.train(info.session_id, ids, epochs):
            pass
        epoch_seconds = (time.perf_counter() - start) / epochs
        if not predict:
            return epoch_seconds, float("nan"), float("nan")
        start = time.perf_counter()
        released = operator.predict(info.session_id, ids)
        throughput = len(ids) / (time.perf_counter() - start)
    labels = ds.y[datasets.select_ids(ds.ids, ids)]
    return epoch_seconds, throughput, float(np.mean(released.scores.argmax(axis=1) == labels))


def _gaps(accuracy: dict[str, float]) -> dict[str, float]:
    """Each encrypted run's accuracy minus plain's, in percentage points."""
    return {label: 100 * (a - accuracy["plain"]) for label, a in accuracy.items() if label != "plain"}


def _ratios(t: dict[str, float], s: dict[str, float]) -> dict[str, float]:
    return {"train_ckks_over_plain": t["ckks"] / t["plain"], "inference_plain_over_ckks": s["plain"] / s["ckks"]}


def _processes(ds: datasets.Dataset, tmp: Path, epochs: int, batch_size: int, log: Callable[[str], None]) -> dict:
    """ckks vs plain with each party its own `vflsec serve` process (the deployment shape the goals count)."""
    out: dict[str, Any] = {"train_epoch_seconds": {}, "inference_samples_per_second": {}, "accuracy": {}}
    for backend in ("plain", "ckks"):
        spec = _spec(ds, backend)
        layout = write_federation(spec, tmp / f"processes-{backend}")
        epoch, throughput, accuracy = _measure(layout, backend, epochs, batch_size, ds, run_processes)
        out["train_epoch_seconds"][backend] = epoch
        out["inference_samples_per_second"][backend] = throughput
        out["accuracy"][backend] = accuracy
        log(f"processes {backend:>7}: epoch {epoch:7.2f} s   inference {throughput:10.0f} samples/s")
    out["ratios"] = _ratios(out["train_epoch_seconds"], out["inference_samples_per_second"])
    out["accuracy_gap_pp"] = _gaps(out["accuracy"])
    return out


SPLITNN = {"family": "splitnn", "settings": {"embedding": 16, "top_hidden": [32]}}
SPLITNN_BATCH = 256  # the reference run's (dd900f3); no key budget bounds it (training decrypts nothing)


def _splitnn(ds: datasets.Dataset, tmp: Path, epochs: int, log: Callable[[str], None]) -> dict[str, Any]:
    """A split-NN coordinator-top epoch, ckks vs plain, parties in this process: training sums every party's embedding
    under zero-sum masks under both backends (nothing to decrypt); inference shares go under CKKS or in the clear."""
    out: dict[str, Any] = {
        "topology": "coordinator-top",
        **SPLITNN["settings"],
        "batch_size": SPLITNN_BATCH,
        "train_epoch_seconds": {},
        "inference_samples_per_second": {},
        "accuracy": {},
    }
    for backend in ("plain", "ckks"):
        spec = _spec(ds, backend)
        layout = write_federation(spec, tmp / f"splitnn-{backend}")
        epoch, throughput, accuracy = _measure(layout, backend, epochs, SPLITNN_BATCH, ds, model=SPLITNN)
        out["train_epoch_seconds"][backend] = epoch
        out["inference_samples_per_second"][backend] = throughput
        out["accuracy"][backend] = accuracy
        log(f"split-NN {backend:>8}: epoch {epoch:7.2f} s   inference {throughput:10.0f} samples/s   "
            f"accuracy {accuracy:.4f}")
    out["ratios"] = _ratios(out["train_epoch_seconds"], out["inference_samples_per_second"])
    out["accuracy_gap_pp"] = _gaps(out["accuracy"])
    log(f"ratios (split-NN): training ckks/plain {out['ratios']['train_ckks_over_plain']:.1f}x")
    return out


TREE = {"family": "tree", "settings": {"max_depth": 5}}


def _tree(sets: list[datasets.Dataset], tmp: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """A depth-5 decision tree grown through the services, ckks vs plain, per dataset (parties in this process):
    [[class indicators]] x bin indicators at the passive party, the per-bin counts opened at the coordinator."""
    from vflsec.services.models.tree.trainers import ONE_STEP

    out: dict[str, Any] = {"model": "tree", **TREE["settings"], "datasets": {}}
    for ds in sets:
        entry: dict[str, Any] = {"rows": ds.n_samples, "features": ds.n_features, "train_seconds": {}, "accuracy": {}}
        for backend in ("plain", "ckks"):
            spec = _spec(ds, backend)
            layout = write_federation(spec, tmp / f"tree-{ds.name}-{backend}")
            seconds, _, accuracy = _measure(layout, backend, 1, ONE_STEP, ds, model=TREE)
            entry["train_seconds"][backend] = seconds
            entry["accuracy"][backend] = accuracy
            log(f"tree {ds.name:>12} {backend:>5}: training {seconds:7.2f} s   accuracy {accuracy:.4f}")
        entry["train_ckks_over_plain"] = entry["train_seconds"]["ckks"] / entry["train_seconds"]["plain"]
        out["datasets"][ds.name] = entry
    return out


NOT_WORK = ("idle", "psi", "grpc_wait", "lock_wait")  # waiting, and the alignment before the epochs


def _profile(ds: datasets.Dataset, tmp: Path, epochs: int, batch_size: int, log: Callable[[str], None]) -> dict:
    """The ckks epoch with each party its own process under cProfile (every thread), grouped into phases."""
    spec = _spec(ds)
    layout = write_federation(spec, tmp / "profile")
    folder = tmp / "pstats"
    os.environ[profiling.ENV] = str(folder)  # inherited by the party processes run_processes starts
    try:
        epoch, _, _ = _measure(layout, "ckks", epochs, batch_size, ds, run_processes, predict=False)
    finally:
        del os.environ[profiling.ENV]
    out: dict[str, Any] = {"epochs": epochs, "epoch_seconds_profiled": epoch, "parties": {}}
    for party in layout.configs:
        out["parties"][party] = profiling.phases(folder / f"{party}.pstats", top=12)
    # Per epoch, over all parties: the work (every phase but waiting), and the waiting on peers apart, since a
    # thread that waits for another party's answer overlaps that party's work.
    work: dict[str, float] = {}
    for party, p in out["parties"].items():
        for phase, t in p["seconds"].items():
            if phase not in NOT_WORK:
                work[phase] = work.get(phase, 0.0) + t / epochs
        waits = ", ".join(f"{ph} {p['seconds'].get(ph, 0.0) / epochs:.2f} s" for ph in ("grpc_wait", "lock_wait"))
        log(f"profile {party:>11}: {waits} per epoch")
    total = sum(work.values())
    out["work_seconds_per_epoch"] = dict(sorted(work.items(), key=lambda kv: -kv[1]))
    out["work_share"] = {phase: t / total for phase, t in out["work_seconds_per_epoch"].items()}
    log(f"profile: {epoch:.2f} s per profiled epoch; the parties' work {total:.2f} s: " + ", ".join(
        f"{phase} {t:.2f} s ({t / total:.0%})" for phase, t in out["work_seconds_per_epoch"].items()
    ))
    return out


def run(
    rows: int = 30000,
    epochs: int = 1,
    batch_size: int = 1024,
    log: Callable[[str], None] = print,
    processes: bool = False,
    profile: bool = False,
) -> dict[str, Any]:
    """ckks vs plain on the same federation set-up. The headline figures run without session checkpoints
    (they measure the cryptography); the checkpointed ckks epoch is reported beside them. All of them run the
    parties in this process; ``processes`` adds the figures with each party its own process (under
    ``"processes"``), ``profile`` where that ckks epoch's time goes (under ``"profile"``)."""
    ds = bench_dataset(rows)
    scaling, why = scaling_for(ds)
    log(f"scaling: {why}")
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
        "scaling": scaling,
        "scaling_note": why,
    }
    with tempfile.TemporaryDirectory(prefix="vflsec-bench-") as tmp:
        for label, backend, checkpoints in (
            ("plain", "plain", False),
            ("ckks", "ckks", False),
            ("ckks_checkpointed", "ckks", True),
        ):
            spec = _spec(ds, backend, checkpoints)
            layout = write_federation(spec, Path(tmp) / label)
            epoch, throughput, accuracy = _measure(layout, backend, epochs, batch_size, ds)
            result["train_epoch_seconds"][label] = epoch
            result["inference_samples_per_second"][label] = throughput
            result["accuracy"][label] = accuracy
            log(f"{label:>17}: epoch {epoch:7.2f} s   inference {throughput:10.0f} samples/s   accuracy {accuracy:.4f}")
        result["accuracy_gap_pp"] = _gaps(result["accuracy"])
        t, s = result["train_epoch_seconds"], result["inference_samples_per_second"]
        result["ratios"] = {
            **_ratios(t, s),
            "checkpoint_cost_per_epoch_seconds": t["ckks_checkpointed"] - t["ckks"],
        }
        log(
            f"ratios (in-process): training ckks/plain {result['ratios']['train_ckks_over_plain']:.1f}x, "
            f"inference plain/ckks {result['ratios']['inference_plain_over_ckks']:.1f}x"
        )
        if processes:
            result["processes"] = _processes(ds, Path(tmp), epochs, batch_size, log)
            r = result["processes"]["ratios"]
            log(
                f"ratios (processes): training ckks/plain {r['train_ckks_over_plain']:.1f}x, "
                f"inference plain/ckks {r['inference_plain_over_ckks']:.1f}x"
            )
        if profile:
            result["profile"] = _profile(ds, Path(tmp), max(epochs, 3), batch_size, log)
        result["splitnn"] = _splitnn(ds, Path(tmp), epochs, log)
        result["tree"] = _tree([datasets.load_dataset("digits"), ds], Path(tmp), log)
    return result
