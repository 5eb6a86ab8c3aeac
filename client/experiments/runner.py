"""Running an experiment: every cell of a scenario through the real services (client/experiments/harness.py),
resumable (a finished cell's result is kept on disk), in a process pool or on Ray, and its summary written as
results.json, results.md and PNG plots (results.py)."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from vflsec.client.experiments import harness
from vflsec.client.experiments.labels import plot_labels
from vflsec.client.experiments.results import markdown, plot, summarise
from vflsec.client.experiments.scenario import Cell, Scenario, attack_scenario, cell_key, expand, training_key
from vflsec.client.federation.launcher import temporary_folder

# --- running a cell -----------------------------------------------------------------------------------------


def write_atomic(path: Path, text: str) -> None:
    """Write to a temporary file beside ``path``, flush it to disk, rename it over ``path``: a reader sees the
    old file or the whole new one, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        # mkstemp makes 0600; results are measurements (no keys, no data rows), readable as the plots beside them.
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def finished(out: Path, key: str) -> dict[str, Any] | None:
    """A cell's result if it was written whole; None if it is missing or unreadable (then it is redone)."""
    try:
        return json.loads((out / "cells" / f"{key}.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock between the workers of one machine; the OS drops it when its holder dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def trained_base(scenario: harness.AttackScenario, folder: Path) -> dict[str, Any]:
    """The trained base federation of a training group: trained once, by whichever cell gets here first; a
    base without its ``trained.json`` (a run killed while training) is trained again from scratch."""
    with _locked(folder.with_suffix(".lock")):
        marker = folder / "trained.json"
        if marker.exists():
            return json.loads(marker.read_text())
        shutil.rmtree(folder, ignore_errors=True)
        trained, _ = harness.train_base(scenario, folder)
        write_atomic(marker, json.dumps(trained))
        return trained


def run_cell(scenario: harness.AttackScenario, base: Path, trained: dict[str, Any]) -> dict[str, Any]:
    """One cell through the services: a federation dealt from the cell's spec, started from the base's trained
    checkpoints, releasing through the cell's chains; the harness's report on its recordings."""
    with temporary_folder("vflsec-cell-") as workdir:
        return harness.score_run(scenario, harness.run_from_base(scenario, base, trained, workdir))


def run_label_cell(scenario: harness.AttackScenario) -> dict[str, Any]:
    """A passive attacker's cell: train with the curious plugin at that party, then its label attacks on the gradients
    it recorded (harness.score_label_run). Training is what it attacks and no release axis is swept with it, so a
    cell is its own training group: no checkpoints (their fsync'd writes cost most of a plain step on Bank)."""
    scenario = scenario.with_spec(checkpoints=False)
    with temporary_folder("vflsec-cell-") as workdir:
        return harness.score_label_run(scenario, harness.run_scenario(scenario, workdir))


def cell_task(scenario: Scenario, cell: Cell, out: Path) -> dict[str, Any]:
    """Run one cell unless its result is already on disk; writes the result atomically and returns it."""
    key = cell_key(scenario, cell)
    done = finished(out, key)
    if done is not None:
        return done
    attack = attack_scenario(scenario, cell)
    if attack.attacker != "active":  # label attacks read training itself: no trained base to share (see run_label_cell)
        report = run_label_cell(attack)
    else:
        base = out / "train" / training_key(scenario, cell)
        trained = trained_base(attack, base)
        report = run_cell(attack, base, trained)
    result = {"key": key, "cell": {"values": dict(cell.values), "repetition": cell.repetition}, "report": report}
    write_atomic(out / "cells" / f"{key}.json", json.dumps(result))
    return result


def pending(scenario: Scenario, out: Path) -> tuple[list[Cell], list[Cell]]:
    """(cells already finished, cells still to run), the latter ordered so that concurrent workers start on
    different training groups first (one trains a base while the others train theirs)."""
    done, todo = [], []
    for cell in expand(scenario):
        (done if finished(out, cell_key(scenario, cell)) is not None else todo).append(cell)
    groups: dict[str, list[Cell]] = {}
    for cell in todo:
        groups.setdefault(training_key(scenario, cell), []).append(cell)
    interleaved = [c for batch in itertools.zip_longest(*groups.values()) for c in batch if c is not None]
    return done, interleaved


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)


def run_experiment(
    scenario: Scenario,
    out: Path,
    *,
    workers: int | None = None,
    ray_address: str | None = None,
    on_cell: Callable[[Cell, dict[str, Any] | None], None] | None = None,
) -> dict[str, Any]:
    """Every cell (finished ones are read back, not re-run), then results.json, results.md and the plots."""
    out.mkdir(parents=True, exist_ok=True)
    done, todo = pending(scenario, out)
    for cell in done:
        if on_cell is not None:
            on_cell(cell, None)
    if todo:
        if ray_address is not None:
            _run_ray(scenario, todo, out, ray_address, on_cell)
        else:
            _run_pool(scenario, todo, out, workers or default_workers(), on_cell)
    results = [finished(out, cell_key(scenario, cell)) for cell in expand(scenario)]
    summary = summarise(scenario, [r for r in results if r is not None])
    write_atomic(out / "results.json", json.dumps(summary, indent=1, default=str))
    write_atomic(out / "results.md", markdown(summary))
    summary["plots"] = [str(p) for p in [*plot(summary, out), *plot_labels(summary, out)]]
    shutil.rmtree(out / "train", ignore_errors=True)  # every cell is on disk: the bases have served
    return summary


def _run_pool(
    scenario: Scenario,
    todo: list[Cell],
    out: Path,
    workers: int,
    on_cell: Callable[[Cell, dict[str, Any] | None], None] | None,
) -> None:
    if workers == 1:
        for cell in todo:
            result = cell_task(scenario, cell, out)
            if on_cell is not None:
                on_cell(cell, result)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # spawn: gRPC and torch are not fork-safe once initialised.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(cell_task, scenario, cell, out): cell for cell in todo}
        for future in as_completed(futures):
            result = future.result()
            if on_cell is not None:
                on_cell(futures[future], result)


def _run_ray(
    scenario: Scenario,
    todo: list[Cell],
    out: Path,
    address: str,
    on_cell: Callable[[Cell, dict[str, Any] | None], None] | None,
) -> None:
    """Each cell as a Ray task on an existing cluster (``address``: ``auto``, ``local`` or ``host:port``); the
    output folder must be shared by its nodes (the bases' lock files and the cells' results live there)."""
    try:
        import ray
    except ImportError as exc:
        raise RuntimeError("--ray needs Ray: pip install 'vflsec[ray]'") from exc
    ray.init(address=None if address == "local" else address, ignore_reinit_error=True, log_to_driver=False)
    task = ray.remote(cell_task)
    refs = {task.remote(scenario, cell, out): cell for cell in todo}
    remaining = list(refs)
    while remaining:
        ready, remaining = ray.wait(remaining, num_returns=1)
        result = ray.get(ready[0])
        if on_cell is not None:
            on_cell(refs[ready[0]], result)
