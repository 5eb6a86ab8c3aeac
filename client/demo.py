"""Run a federation end to end as its operator: align, train, predict on a held-out split, report.

``vflsec demo`` starts every party as its own process on loopback first; ``vflsec run`` drives parties that
already run elsewhere (docker compose, separate hosts).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from vflsec.client.federation import FederationLayout, FederationSpec, run_processes, write_federation
from vflsec.client.operator import Operator
from vflsec.services.data import datasets
from vflsec.services.models import lr


@dataclass
class DemoOptions:
    dataset: str = "breast_cancer"
    label: str | None = None
    n_passive: int = 1
    passive_features: int | float | Sequence[str] | None = None
    backend: str = "ckks"
    epochs: int = 30
    batch_size: int = 0  # 0: lr.DEFAULT_BATCH_SIZE, raised to the federation's minimum batch
    learning_rate: float = 0.1
    l2: float = 1e-4
    optimizer: str = "adam"
    seed: int = 0
    test_fraction: float = 0.2
    # Standardised features train the LR best; the attack harness uses min-max ([0, 1]), as the papers do.
    scaling: str = "standard"
    compare_plain: bool = False
    score_release: Sequence[str] = ()
    param_release: Sequence[str] = ()
    plugins: Sequence[dict] = ()
    workdir: Path | None = None


@dataclass
class Run:
    """One trained session evaluated on the held-out split."""

    backend: str
    session_id: str
    accuracy: float
    train_seconds: float
    predict_seconds: float
    argmax_changed: int
    chain: list[tuple[str, dict[str, str]]]


ProgressCallback = Callable[[str, int, int, int, int], None]  # backend, epoch, epochs, batch, n_batches


def train_and_evaluate(
    operator: Operator,
    options: DemoOptions,
    backend: str,
    split: tuple[list[str], list[str], np.ndarray],
    progress: ProgressCallback | None = None,
) -> Run:
    train_ids, test_ids, test_labels = split
    info = operator.create_session(
        backend,
        optimizer=options.optimizer,
        learning_rate=options.learning_rate,
        l2=options.l2,
        batch_size=options.batch_size,
        seed=options.seed,
    )
    operator.align(info.session_id)
    start = time.perf_counter()
    for p in operator.train(info.session_id, train_ids, options.epochs):
        if progress is not None and not p.done:
            progress(backend, p.epoch, options.epochs, p.batch, p.n_batches)
    train_seconds = time.perf_counter() - start
    start = time.perf_counter()
    released = operator.predict(info.session_id, test_ids)
    predict_seconds = time.perf_counter() - start
    accuracy = float(np.mean(released.scores.argmax(axis=1) == test_labels))
    return Run(
        backend, info.session_id, accuracy, train_seconds, predict_seconds, released.argmax_changed, released.chain
    )


def operator_labels(path: Path) -> dict[str, int]:
    """The operator's own labels: the active party's data file."""
    data = datasets.read_party_csv(path)
    if data.y is None:
        raise ValueError(f"{path} has no label column")
    return dict(zip(data.ids.tolist(), data.y.tolist(), strict=True))


def evaluate(
    channel: grpc.Channel,
    labels: Mapping[str, int],
    options: DemoOptions,
    progress: ProgressCallback | None = None,
) -> dict[str, Any]:
    """Align, split the common IDs (stratified, seeded), train and evaluate; optionally on plain too."""
    operator = Operator(channel)
    info = operator.create_session(options.backend, seed=options.seed)
    common = sorted(operator.align(info.session_id))  # PSI's common order is random; runs must not depend on it
    operator.close(info.session_id)
    smallest = lr.min_batch_size([info.n_active_features + 1, *info.passive_features.values()])
    if options.batch_size:
        batch_note = "as requested"
    else:
        options = replace(options, batch_size=max(lr.DEFAULT_BATCH_SIZE, smallest))
        batch_note = (
            f"default {lr.DEFAULT_BATCH_SIZE}"
            if options.batch_size == lr.DEFAULT_BATCH_SIZE
            else f"default {lr.DEFAULT_BATCH_SIZE} raised to the minimum batch (2 x the widest block)"
        )
    y = np.array([labels[i] for i in common])
    train_ids, test_ids = datasets.train_test_split_ids(np.asarray(common), y, options.test_fraction, options.seed)
    split = (list(train_ids), list(test_ids), np.array([labels[i] for i in test_ids]))
    runs = [train_and_evaluate(operator, options, options.backend, split, progress)]
    if options.compare_plain:
        runs.append(train_and_evaluate(operator, options, "plain", split, progress))
    main = runs[0]
    result: dict[str, Any] = {
        "dataset": options.dataset,
        "n_classes": info.n_classes,
        "n_active_rows": len(labels),
        "n_common": len(common),
        "n_train": len(train_ids),
        "n_test": len(test_ids),
        "n_passive": len(info.passive_features),
        "features": {"active": info.n_active_features, "passive": dict(info.passive_features)},
        "backend": main.backend,
        "epochs": options.epochs,
        "accuracy": main.accuracy,
        "train_seconds": main.train_seconds,
        "predict_seconds": main.predict_seconds,
        "predictions_per_second": len(test_ids) / main.predict_seconds,
        "score_release": [name for name, _ in main.chain],
        "released_argmax_agreement": 1.0 - main.argmax_changed / len(test_ids),
        "batch_size": options.batch_size,
        "batch_size_note": f"{batch_note}; minimum {smallest}",
    }
    if options.compare_plain:
        result["plain_accuracy"] = runs[1].accuracy
        result["plain_train_seconds"] = runs[1].train_seconds
    return result


def run_demo(
    options: DemoOptions,
    progress: ProgressCallback | None = None,
    on_layout: Callable[[FederationLayout], None] | None = None,
) -> dict[str, Any]:
    ds = datasets.load_dataset(options.dataset, label=options.label)
    spec = FederationSpec(
        dataset=ds,
        n_passive=options.n_passive,
        passive_features=options.passive_features,
        backend=options.backend,
        allow_plain=options.compare_plain,
        score_release=options.score_release,
        param_release=options.param_release,
        plugins=options.plugins,
        scaling=options.scaling,
        seed=options.seed,
    )
    with tempfile.TemporaryDirectory(prefix="vflsec-demo-") as tmp:
        layout = write_federation(spec, options.workdir or Path(tmp))
        if on_layout is not None:
            on_layout(layout)
        with run_processes(layout), layout.operator_channel() as channel:
            result = evaluate(channel, operator_labels(layout.configs["active"].parent / "data.csv"), options, progress)
    return {"dataset": ds.name, "n_samples": ds.n_samples, **result}
