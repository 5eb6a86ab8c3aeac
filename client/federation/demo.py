"""Run a federation end to end as its operator: align, train, predict on a held-out split, report.

``vflsec demo`` starts every party as its own process on loopback first; ``vflsec run`` drives parties that
already run elsewhere (docker compose, separate hosts).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from vflsec.client.federation.launcher import (
    TREE_MODELS,
    FederationLayout,
    FederationSpec,
    run_processes,
    temporary_folder,
    write_federation,
)
from vflsec.client.federation.operator import Operator, Released
from vflsec.client.federation.training import TrainingRecord, train
from vflsec.services.config import ServiceConfig
from vflsec.services.data import datasets


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
    training: TrainingRecord


ProgressCallback = Callable[[str, int, int, int, int], None]  # backend, epoch, epochs, batch, n_batches
# A progress bar for one phase: (what, total count or None) -> a context yielding "advance by n" (and, if given, set
# the total to a new count: an alignment learns its total from the active party).
Advance = Callable[..., None]  # (n: int, total: int | None = None)
PhaseBar = Callable[[str, int | None], contextlib.AbstractContextManager[Advance]]


@contextlib.contextmanager
def _no_bar(what: str, total: int | None) -> Iterator[Advance]:
    yield lambda n, total=None: None


class Phases:
    """Wall seconds per phase of a run (a phase entered twice adds up), each announced on ``log`` when it starts
    and ends and shown on ``bar`` while it runs (counts where the phase has them), so a long load or alignment is
    never silent."""

    def __init__(self, log: Callable[[str], None] | None = None, bar: PhaseBar | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self._log = log or (lambda line: None)
        self._bar = bar or _no_bar

    def fresh(self) -> Phases:
        """New counts announced on the same log and bars (one run's seconds apart from another's)."""
        return Phases(self._log, self._bar)

    @contextlib.contextmanager
    def __call__(
        self, name: str, what: str, total: int | None = None, *, bar: bool = True
    ) -> Iterator[Advance]:
        """Time the phase; the caller advances its bar by the items done (``total`` of them; None: no counts
        until the end). ``bar=False``: the phase draws its own (training's epochs and batches)."""
        self._log(f"{name}: {what} ...")
        start = time.perf_counter()
        with self._bar(what, total) if bar else _no_bar(what, total) as advance:
            yield advance
        took = time.perf_counter() - start
        self.seconds[name] = self.seconds.get(name, 0.0) + took
        self._log(f"{name}: {what}: {took:.1f} s")


def align(operator: Operator, session_id: str, phases: Phases, what: str) -> list[str]:
    """``operator.align`` as the "align" phase, its bar counting the curve operations the active party reports
    (our IDs blinded, each passive party's lists blinded, theirs re-blinded) of all it will take."""
    with phases("align", what) as advance:
        done = 0

        def progress(now: int, total: int, stage: str) -> None:
            nonlocal done
            advance(now - done, total)
            done = now

        return operator.align(session_id, progress)


def peak_rss_mb(pids: Mapping[str, int]) -> dict[str, float]:
    """Each live process's peak resident memory so far (Linux VmHWM), in MB; a process without it is left out."""
    return memory_mb(pids, "VmHWM")


def memory_mb(pids: Mapping[str, int], field: str) -> dict[str, float]:
    """A memory field of each live process's /proc status (VmHWM: its peak, VmRSS: now), in MB; a process without it
    is left out."""
    values = {}
    for name, pid in pids.items():
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith(f"{field}:"):
                    values[name] = round(int(line.split()[1]) / 1024, 1)
    return values


def train_and_evaluate(
    operator: Operator,
    spec: FederationSpec,
    backend: str,
    split: tuple[list[str], list[str], np.ndarray],
    progress: ProgressCallback | None = None,
    validation: tuple[list[str], np.ndarray] = ([], np.zeros(0, dtype=int)),
    phases: Phases | None = None,
    session_id: str | None = None,
) -> Run:
    """Train and evaluate in ``session_id`` (already aligned), or in a new session of ``spec`` aligned here."""
    phases = phases or Phases()
    train_ids, test_ids, test_labels = split
    if session_id is None:
        session_id = operator.create_session(backend, **spec.session_options()).session_id
        align(operator, session_id, phases, f"aligning the {backend} session")
    start = time.perf_counter()
    with phases("train", f"training {len(train_ids):,} rows ({backend})", bar=False):
        record = train(
            operator,
            session_id,
            train_ids,
            spec.epochs,
            validation_ids=validation[0],
            validation_labels=validation[1],
            patience=spec.early_stopping_patience,
            on_step=None if progress is None else lambda e, b, n: progress(backend, e, spec.epochs, b, n),
        )
    train_seconds = time.perf_counter() - start
    start = time.perf_counter()
    with phases("predict", f"predicting {len(test_ids):,} held-out rows ({backend})", len(test_ids)) as advance:
        released = predict_all(operator, session_id, test_ids, advance)
    predict_seconds = time.perf_counter() - start
    accuracy = float(np.mean(released.scores.argmax(axis=1) == test_labels))
    return Run(
        backend,
        session_id,
        accuracy,
        train_seconds,
        predict_seconds,
        released.argmax_changed,
        released.chain,
        record,
    )


def predict_all(
    operator: Operator, session_id: str, sample_ids: Sequence[str], advance: Callable[[int], None] = lambda n: None
) -> Released:
    """Scores for every row, in queries of at most the coordinator's default cap ([policy] max_query_rows): a
    held-out split of a million-row table (200k rows) never trips it."""
    cap = ServiceConfig.__dataclass_fields__["max_query_rows"].default
    parts = []
    for start in range(0, len(sample_ids), cap):
        parts.append(operator.predict(session_id, sample_ids[start : start + cap]))
        advance(len(parts[-1].sample_ids))
    return Released(
        [i for p in parts for i in p.sample_ids],
        np.concatenate([p.scores for p in parts]),
        parts[0].chain,
        sum(p.argmax_changed for p in parts),
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
    spec: FederationSpec,
    *,
    compare_plain: bool = False,
    progress: ProgressCallback | None = None,
    phases: Phases | None = None,
    on_split: Callable[[list[str], list[str]], None] | None = None,
    dealt_train_rows: int | None = None,
) -> dict[str, Any]:
    """Align, split the common IDs (stratified, seeded), train and evaluate; optionally on plain too.
    ``on_split`` sees the training and held-out IDs (the demo's central reference on the same rows).

    The session's default batch size follows from its training rows. An explicit batch, or a dealer who knows
    the rows ahead (the demo: ``dealt_train_rows``), lets the training session align once; otherwise a first
    session aligns to count them and the training session aligns again, and ``align_seconds`` counts both."""
    operator = Operator(channel)
    phases = phases or Phases()
    planned = spec.batch_size if spec.batch_size and spec.model not in TREE_MODELS else None
    if dealt_train_rows is not None:
        planned = spec.batch_size_for(spec.widths, dealt_train_rows)[0]
    options = {"seed": spec.seed} if planned is None else replace(spec, batch_size=planned).session_options()
    info = operator.create_session(spec.backend, **options)
    passives = f"{len(info.passive_features)} passive part{'y' if len(info.passive_features) == 1 else 'ies'}"
    common = align(operator, info.session_id, phases, f"aligning {len(labels):,} active IDs with {passives}")
    train_ids, validation_ids, test_ids = spec.session_sets(common, np.array([labels[i] for i in common]))
    validation = (validation_ids, np.array([labels[i] for i in validation_ids], dtype=int))
    widths = [info.n_active_features + 1, *info.passive_features.values()]
    batch_size, batch_note = spec.batch_size_for(widths, len(train_ids))
    if planned is None:
        operator.close(info.session_id)
    elif batch_size != planned:
        raise RuntimeError(f"alignment found {len(train_ids)} training rows, the dealer dealt {dealt_train_rows}")
    spec = replace(spec, batch_size=batch_size, epochs=spec.epochs_for(len(train_ids))[0])
    split = (list(train_ids), list(test_ids), np.array([labels[i] for i in test_ids]))
    if on_split is not None:
        on_split(split[0], split[1])
    session_id = None if planned is None else info.session_id
    runs = [train_and_evaluate(operator, spec, spec.backend, split, progress, validation, phases, session_id)]
    align_seconds = phases.seconds["align"]  # the comparison run's alignment is not the main run's
    if compare_plain:
        runs.append(train_and_evaluate(operator, spec, "plain", split, progress, validation))
    main = runs[0]
    result: dict[str, Any] = {
        "dataset": spec.name,
        "n_classes": info.n_classes,
        "n_active_rows": len(labels),
        "n_common": len(common),
        "n_train": len(train_ids),
        "n_test": len(test_ids),
        "n_passive": len(info.passive_features),
        "features": {"active": info.n_active_features, "passive": dict(info.passive_features)},
        "backend": main.backend,
        "epochs": spec.epochs,
        "accuracy": main.accuracy,
        "train_seconds": main.train_seconds,
        "predict_seconds": main.predict_seconds,
        "predictions_per_second": len(test_ids) / main.predict_seconds,
        "score_release": [name for name, _ in main.chain],
        "released_argmax_agreement": 1.0 - main.argmax_changed / len(test_ids),
        "batch_size": spec.batch_size,
        "batch_size_note": batch_note,
        "majority_rate": float(np.bincount(split[2]).max() / len(split[2])),  # of the held-out labels
        "epochs_trained": main.training.epochs_trained,
        "model": spec.model,
        "gradient_defense": list(spec.gradient_defense),  # the session's, run at the active party (split-NN)
        "partition_defense": list(spec.partition_defense),  # the session's, trees: nodes no passive party sees
    }
    if spec.early_stopping_patience:
        result["early_stopping"] = main.training.to_dict()
    if compare_plain:
        result["plain_accuracy"] = runs[1].accuracy
        result["plain_train_seconds"] = runs[1].train_seconds
    result["align_seconds"] = align_seconds
    return result


def run_demo(
    spec: FederationSpec,
    *,
    compare_plain: bool = False,
    workdir: Path | None = None,
    progress: ProgressCallback | None = None,
    on_layout: Callable[[FederationLayout], None] | None = None,
    log: Callable[[str], None] | None = None,
    phases: Phases | None = None,
) -> dict[str, Any]:
    """Deal the federation (into ``workdir``, or a temporary folder), run every party as a process, evaluate.

    Adds the phase timings: ``load_seconds`` (reading the dataset, then starting the parties until each has read
    its shard and answers), ``deal_seconds`` (writing the shards and configs) and each party's ``peak_rss_mb``
    (its process's VmHWM; the PSI pool's short-lived workers are not in it); ``operator_peak_rss_mb`` is this
    process's (the dealer's table and the operator). ``phases`` may come in with the load already timed (the CLI)."""
    phases = phases or Phases(log)
    with temporary_folder("vflsec-demo-") as tmp:
        if "load" not in phases.seconds:
            with phases("load", f"reading {spec.name}"):
                spec.data  # noqa: B018 (parsed once per process)
        n_samples = spec.data.n_samples
        dealt = sum(len(rows) for rows in spec.party_rows)
        with phases("deal", f"dealing {n_samples:,} rows to {spec.n_passive + 1} parties", dealt) as advance:
            layout = write_federation(spec, workdir or Path(tmp), on_rows=advance)
        if on_layout is not None:
            on_layout(layout)
        with contextlib.ExitStack() as running:
            what = "starting the parties (each reads its shard)"
            with phases("load", what, len(layout.configs)) as advance:
                federation = running.enter_context(run_processes(layout, on_ready=lambda party: advance(1)))
            channel = running.enter_context(layout.operator_channel())
            labels = operator_labels(layout.configs["active"].parent / "data.csv")
            reference: dict[str, Any] = {}
            on_split = None
            if spec.model in TREE_MODELS:  # the dealer holds every column: scikit-learn on the same rows and bins

                def on_split(train_ids: list[str], test_ids: list[str]) -> None:
                    reference["reference_accuracy"] = tree_reference(spec, train_ids, test_ids)

            result = evaluate(
                channel,
                labels,
                spec,
                compare_plain=compare_plain,
                progress=progress,
                phases=phases,
                on_split=on_split,
                dealt_train_rows=len(spec.dealt_sets()[0]),  # what alignment will find: the demo aligns once
            )
            # Each party's own process; parties run in this process (tests) have no peak of their own to report.
            processes = getattr(federation, "processes", {})
            peaks = peak_rss_mb({party: process.pid for party, process in processes.items()})
            own = peak_rss_mb({"operator": os.getpid()})  # the dealer's table and the operator
    timings = {f"{name}_seconds": phases.seconds[name] for name in ("load", "deal")}
    result = {"dataset": spec.name, "n_samples": n_samples, **result, **timings, "peak_rss_mb": peaks, **reference}
    return result | {"operator_peak_rss_mb": own.get("operator")}


def tree_reference(spec: FederationSpec, train_ids: list[str], test_ids: list[str]) -> float:
    """The accuracy of scikit-learn trained centrally on the same training rows and the same per-party quantile
    bins as the session (tree / forest, its settings and seed), on the same held-out rows."""
    from vflsec.services.models import family as families
    from vflsec.services.models.tree.reference import reference_accuracy

    values = {k: v for k, v in spec.session_options()["settings"].items() if v}
    config = families.get(spec.model).settings({**values, "seed": spec.seed}).config
    ds = spec.dealt_data()
    blocks = [ds.X[:, ds.column_indices(columns)] for columns in spec.split.parties]
    rows = datasets.select_ids(ds.ids, train_ids), datasets.select_ids(ds.ids, test_ids)
    return reference_accuracy(config, blocks, ds.y, *rows, ds.n_classes)
