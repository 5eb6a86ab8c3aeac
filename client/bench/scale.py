"""``vflsec bench scale``: how HE-LR's cost grows with rows, passive parties and features per party.

Every grid point is a fresh federation with each party its own ``vflsec serve`` process (the launcher
``bench load --processes`` uses), over loopback mTLS. Its data is synthetic, generated chunk by chunk
straight into each party's CSV shard (never the whole table in memory). On one federation the operator
runs a ckks and a plain session side by side: alignment, a timed training epoch, and a timed Predict of
every aligned row. Each party's peak RSS (the kernel's VmHWM of its process) is read before it stops; it
is the peak over both sessions. Three sweeps share one base point: rows, passive parties, features per
party; the exponent of time in rows is the slope of a least-squares fit in log-log.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vflsec.client.federation.launcher import FederationSpec, ProcessFederation, run_processes, write_federation
from vflsec.client.federation.operator import Operator
from vflsec.services.config import ServiceConfig
from vflsec.services.data import datasets
from vflsec.services.models import lr

BACKENDS = ("ckks", "plain")
DEFAULT_BATCH = 1024  # as `bench he`; raised to the federation's minimum batch (2 x the widest block)
CHUNK_ROWS = 50_000
GRIDS = {
    "default": {"rows": (10_000, 100_000, 1_000_000), "passive": (1, 2, 4, 8), "features": (10, 50, 100, 500)},
    "tiny": {"rows": (1_000, 2_000), "passive": (1, 2), "features": (5, 10)},
}


def _columns(n_passive: int, features: int) -> list[list[str]]:
    """Column names of the active party, then each passive party: ``features`` each."""
    return [[f"p{party}_x{j}" for j in range(features)] for party in range(n_passive + 1)]


def _chunks(rows: int, n_features: int, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(ids, X, y) of a logistic model over all columns, ``CHUNK_ROWS`` rows at a time (each chunk its own
    seeded stream, so the data does not depend on the chunk size's history)."""
    weights = np.random.default_rng([seed, 0]).normal(size=n_features) * 3.0 / np.sqrt(n_features)
    for start in range(0, rows, CHUNK_ROWS):
        n = min(CHUNK_ROWS, rows - start)
        rng = np.random.default_rng([seed, 1, start])
        X = rng.normal(size=(n, n_features))
        y = (X @ weights + rng.logistic(size=n) > 0).astype(np.int64)
        yield np.array([f"r{i:08d}" for i in range(start, start + n)]), X, y


def scale_spec(n_passive: int, features: int, seed: int = 0) -> FederationSpec:
    """The federation of one grid point, dealt from a 4-row stand-in of its columns (the layout, certificates,
    configs and the coordinator's schema come from it; the shards are then replaced by the synthetic rows)."""
    names = [c for cols in _columns(n_passive, features) for c in cols]
    stand_in = datasets.Dataset("synthetic-scale", ["a", "b", "c", "d"], np.eye(4, len(names)), [0, 1, 0, 1],
                                names, ["0", "1"])
    return FederationSpec(stand_in, n_passive=n_passive, passive_features=names[features:], drop_fraction=0.0,
                          allow_plain=True, checkpoints=False, seed=seed)


def point_batch(n_passive: int, features: int, batch_size: int = 0) -> int:
    """The batch of a grid point: ``batch_size``, or 0 for DEFAULT_BATCH raised to the point's minimum batch."""
    widths = scale_spec(n_passive, features).widths
    return max(batch_size or DEFAULT_BATCH, lr.min_batch_size(widths))


def write_scale_federation(rows: int, n_passive: int, features: int, workdir: Path, seed: int = 0):
    """The federation files of one grid point (certificates, configs) with each party's shard streamed in."""
    columns = _columns(n_passive, features)
    names = [c for cols in columns for c in cols]
    spec = scale_spec(n_passive, features, seed)
    layout = write_federation(spec, workdir)
    assert layout.split.parties == columns, "the dealer split the columns differently than the shards assume"
    parties = ["active", *layout.passive_parties]
    offsets = np.cumsum([0, *(len(c) for c in columns)])
    for k, party in enumerate(parties):
        block = slice(offsets[k], offsets[k + 1])
        labelled = party == "active"
        datasets.write_party_csv_chunks(
            workdir / party / "data.csv",
            columns[k],
            ((ids, X[:, block], y if labelled else None) for ids, X, y in _chunks(rows, len(names), seed)),
            class_names=["0", "1"] if labelled else None,
        )
    return layout


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set (VmHWM) in MiB, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


def _session(operator: Operator, backend: str, batch_size: int, epochs: int) -> dict[str, Any]:
    info = operator.create_session(backend, batch_size=batch_size, learning_rate=0.05, seed=0)
    start = time.perf_counter()
    ids = operator.align(info.session_id)
    align = time.perf_counter() - start
    start = time.perf_counter()
    for _ in operator.train(info.session_id, ids, epochs):
        pass
    epoch = (time.perf_counter() - start) / epochs
    # Predict in queries of at most the coordinator's cap (its [policy] max_query_rows): the bench never trips it.
    cap = ServiceConfig.__dataclass_fields__["max_query_rows"].default
    start = time.perf_counter()
    answered = sum(operator.predict(info.session_id, ids[i : i + cap]).scores.shape[0] for i in range(0, len(ids), cap))
    predict = time.perf_counter() - start
    operator.close(info.session_id)
    if answered != len(ids):
        raise RuntimeError(f"{backend}: Predict answered {answered} of {len(ids)} rows")
    return {
        "align_seconds": align,
        "train_epoch_seconds": epoch,
        "inference_seconds": predict,
        "inference_samples_per_second": len(ids) / predict,
    }


def measure_point(
    rows: int, n_passive: int, features: int, *, epochs: int, batch_size: int, workdir: Path,
    backends: Sequence[str] = BACKENDS, log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """One grid point: its own process federation, one session per backend, each party's peak RSS."""
    start = time.perf_counter()
    layout = write_scale_federation(rows, n_passive, features, workdir)
    generate = time.perf_counter() - start
    batch = point_batch(n_passive, features, batch_size)
    point: dict[str, Any] = {"rows": rows, "passive": n_passive, "features_per_party": features,
                             "batch_size": batch, "generate_seconds": generate}
    fed: ProcessFederation
    start = time.perf_counter()
    # A party parses its CSV shard before it serves: ~1 minute per 10 million cells on this host.
    timeout = 60.0 + rows * features * 12e-6
    with run_processes(layout, timeout=timeout) as fed, layout.operator_channel() as channel:
        point["start_seconds"] = time.perf_counter() - start  # processes up: includes each party loading its CSV
        operator = Operator(channel)
        for backend in backends:
            point[backend] = _session(operator, backend, batch, epochs)
        point["peak_rss_mib"] = {party: peak_rss_mib(proc.pid) for party, proc in fed.processes.items()}
    line = "   ".join(
        f"{b} epoch {point[b]['train_epoch_seconds']:7.2f} s, {point[b]['inference_samples_per_second']:9.0f} pred/s, "
        f"align {point[b]['align_seconds']:.1f} s"
        for b in backends
    )
    rss = point["peak_rss_mib"]
    log(f"rows {rows:>8} passive {n_passive} features {features:>3}: {line}   peak RSS max "
        f"{max(rss.values()):.0f} MiB (passive-1 {rss['passive-1']:.0f})")
    return point


def fitted_exponent(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Slope of log(y) on log(x) (cost ~ x^slope); None with fewer than two distinct x."""
    if len(set(xs)) < 2:
        return None
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def run(
    rows: Sequence[int] = GRIDS["default"]["rows"],
    passive: Sequence[int] = GRIDS["default"]["passive"],
    features: Sequence[int] = GRIDS["default"]["features"],
    *,
    base_rows: int | None = None,
    epochs: int = 1,
    batch_size: int = 0,
    backends: Sequence[str] = BACKENDS,
    plot: Path | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The three sweeps around the base point (the first of each list; ``base_rows`` for the passive and
    feature sweeps, default the smallest rows). ``batch_size`` 0: 1024 raised to each point's minimum batch."""
    base = {"rows": base_rows or min(rows), "passive": passive[0], "features": features[0]}
    sweeps = {
        "rows": [(r, base["passive"], base["features"]) for r in rows],
        "passive": [(base["rows"], p, base["features"]) for p in passive],
        "features": [(base["rows"], base["passive"], f) for f in features],
    }
    for r, p, f in (k for keys in sweeps.values() for k in keys):  # the coordinator's bound, before any work
        smallest = lr.min_batch_size(scale_spec(p, f).widths)
        if batch_size and batch_size < smallest:
            raise ValueError(f"batch size {batch_size} is below the minimum batch {smallest} of {p} passive parties "
                             f"x {f} features (2 x the widest block); pass at least {smallest}")
        if r < smallest:
            raise ValueError(f"{r} rows cannot fill one minimum batch of {smallest} ({p} passive parties x {f} "
                             f"features: 2 x the widest block); use at least {smallest} rows there")
    if not batch_size:
        log(f"batch size: {DEFAULT_BATCH}, raised per point to the minimum batch (2 x the widest block)")
    points: dict[tuple[int, int, int], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="vflsec-scale-") as tmp:
        # Each distinct point once, the fewest rows first (the long ones last, their lines logged as they end).
        for key in sorted(dict.fromkeys(k for keys in sweeps.values() for k in keys)):
            points[key] = measure_point(*key, epochs=epochs, batch_size=batch_size, backends=backends,
                                        workdir=Path(tmp) / "-".join(map(str, key)), log=log)
    result: dict[str, Any] = {
        "epochs": epochs, "backends": list(backends), "base": base,
        "sweeps": {name: [points[k] for k in keys] for name, keys in sweeps.items()},
    }
    by_rows = result["sweeps"]["rows"]
    result["rows_exponent"] = {
        b: {
            "train_epoch": fitted_exponent(
                [p["rows"] for p in by_rows], [p[b]["train_epoch_seconds"] for p in by_rows]
            ),
            "inference": fitted_exponent([p["rows"] for p in by_rows], [p[b]["inference_seconds"] for p in by_rows]),
        }
        for b in backends
    }
    by_passive = result["sweeps"]["passive"]
    result["passive_epoch_ratio"] = {  # the widest federation's epoch over the one-passive epoch
        b: by_passive[-1][b]["train_epoch_seconds"] / by_passive[0][b]["train_epoch_seconds"] for b in backends
    }
    for b in backends:
        e = result["rows_exponent"][b]
        log(f"{b}: epoch ~ rows^{_fmt(e['train_epoch'])}, inference ~ rows^{_fmt(e['inference'])}; "
            f"{by_passive[-1]['passive']} passive parties / 1: {result['passive_epoch_ratio'][b]:.2f}x epoch")
    if plot is not None:
        plot_sweeps(result, plot)
        result["plot"] = str(plot)
    return result


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def plot_sweeps(result: dict[str, Any], path: Path) -> None:
    """One panel per sweep: training epoch seconds (solid) and inference seconds (dashed) per backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes_of = {"rows": "rows (log)", "passive": "passive parties", "features": "features per party"}
    keys = {"rows": "rows", "passive": "passive", "features": "features_per_party"}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, (sweep, points) in zip(axes, result["sweeps"].items(), strict=True):
        xs = [p[keys[sweep]] for p in points]
        for backend in result["backends"]:
            ax.plot(xs, [p[backend]["train_epoch_seconds"] for p in points], "o-", label=f"{backend} epoch")
            ax.plot(xs, [p[backend]["inference_seconds"] for p in points], "s--", label=f"{backend} inference")
        ax.set_xscale("log" if sweep in ("rows", "features") else "linear")
        ax.set_yscale("log")
        ax.set_xlabel(axes_of[sweep])
        ax.set_ylabel("seconds")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("vflsec bench scale: HE-LR, each party its own process (2-core host)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown_table(result: dict[str, Any]) -> str:
    """The sweeps as one Markdown table (docs/performance.md), then the fitted exponents."""
    backends = result["backends"]
    head = ["sweep", "rows", "passive", "features/party", "batch"]
    for b in backends:
        head += [f"{b} epoch s", f"{b} inference rows/s", f"{b} align s"]
    head += ["peak RSS MiB (coordinator / active / passive max)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for sweep, points in result["sweeps"].items():
        for p in points:
            rss = p["peak_rss_mib"]
            passive_max = max(v for k, v in rss.items() if k.startswith("passive"))
            cells = [sweep, f"{p['rows']:,}", str(p["passive"]), str(p["features_per_party"]), str(p["batch_size"])]
            for b in backends:
                cells += [
                    f"{p[b]['train_epoch_seconds']:.2f}",
                    f"{p[b]['inference_samples_per_second']:,.0f}",
                    f"{p[b]['align_seconds']:.1f}",
                ]
            cells.append(f"{rss['coordinator']:.0f} / {rss['active']:.0f} / {passive_max:.0f}")
            lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for b in backends:
        e = result["rows_exponent"][b]
        lines.append(
            f"- {b}: epoch time ~ rows^{_fmt(e['train_epoch'])}, inference time ~ rows^{_fmt(e['inference'])}; "
            f"{result['sweeps']['passive'][-1]['passive']} passive parties take "
            f"{result['passive_epoch_ratio'][b]:.2f}x the one-passive epoch"
        )
    return "\n".join(lines) + "\n"
