"""``vflsec bench align``: PSI alignment time against its floor, and each party's peak memory.

Every party runs in its own process (spawned, so each one's memory is its own) and generates its ids itself;
the protocol messages go through pipes instead of gRPC, so the figure is the PSI computation (the functions the
engines call, with their process pools), not serialisation. The active party holds ``rows`` ids; each passive
party holds the first 90 % of them plus ``rows - 90 %`` ids of its own, so the common set is known and checked.

The floor is the protocol's curve work at the per-operation costs measured here on one core, divided by the
worker processes: (hash-to-group ops x its cost + scalar multiplications x theirs) / workers.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection

import numpy as np

from vflsec.services.crypto import psi

OVERLAP = 0.9
ACTIVE = "active"
_SAMPLE_IDS = 4096  # per-op costs from this many ids, in this process, one core


def n_common(rows: int) -> int:
    return round(OVERLAP * rows)


def party_ids(party: str, rows: int) -> Iterator[str]:
    """A party's ids, generated one at a time: the common ones, then (passive parties) ids of its own."""
    for i in range(rows if party == ACTIVE else n_common(rows)):
        yield f"{i:012d}"
    if party != ACTIVE:
        for i in range(rows - n_common(rows)):
            yield f"{party}-{i:012d}"


def measure_per_op_us(n: int = _SAMPLE_IDS) -> dict[str, float]:
    """Microseconds per hash-to-group and per scalar multiplication, one core (the pool is bypassed)."""
    ids = [f"sample-{i}" for i in range(n)]
    salt, key = psi.new_salt(), psi.PsiKey()
    start = time.perf_counter()
    points = psi.hash_ids(ids, salt)
    hashed = time.perf_counter()
    key.reblind(points, workers=1)
    done = time.perf_counter()
    return {"hash_to_group": (hashed - start) / n * 1e6, "scalar_mult": (done - hashed) / n * 1e6}


def op_counts(rows: int, parties: int) -> dict[str, int]:
    """Curve operations of one alignment: A blinds its n ids; each P reblinds them and blinds its own n;
    A reblinds every P's list."""
    return {"hash_to_group": rows * (1 + parties), "scalar_mult": rows * (1 + parties) + 2 * rows * parties}


def _passive(party: str, rows: int, conn: Connection) -> None:
    ids = list(party_ids(party, rows))
    conn.send("ready")
    salt = conn.recv()
    reply = psi.passive_reply(psi.PsiKey(), ids, np.frombuffer(conn.recv_bytes(), dtype=psi._DTYPE), salt)
    conn.send_bytes(b"".join(reply.reblinded_active))
    conn.send_bytes(b"".join(reply.blinded_own))
    own_rows = psi.rows_from_positions(np.frombuffer(conn.recv_bytes(), dtype=np.int64), reply.permutation)
    conn.send("done")
    # Outside the timing: the common id of each common index, as the active row it must match.
    conn.send_bytes(np.array([int(ids[row]) if row < n_common(rows) else -1 for row in own_rows]).tobytes())
    conn.send(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def _active(rows: int, conns: list[Connection], result: Connection) -> None:
    ids = list(party_ids(ACTIVE, rows))
    for conn in conns:
        conn.recv()
    result.send("ready")
    result.recv()
    start = time.perf_counter()
    key, salt = psi.PsiKey(), psi.new_salt()
    blinded = b"".join(key.blind_ids(ids, salt))
    for conn in conns:
        conn.send(salt)
        conn.send_bytes(blinded)
    del blinded
    replies = [(conn.recv_bytes(), conn.recv_bytes()) for conn in conns]
    alignment = psi.active_align(
        key,
        [np.frombuffer(double, dtype=psi._DTYPE) for double, _ in replies],
        [np.frombuffer(own, dtype=psi._DTYPE) for _, own in replies],
        names=[f"passive-{p + 1}" for p in range(len(conns))],
    )
    del replies
    for conn, positions in zip(conns, alignment.passive_positions, strict=True):
        conn.send_bytes(np.ascontiguousarray(positions, dtype=np.int64).tobytes())
    for conn in conns:
        conn.recv()
    seconds = time.perf_counter() - start
    matched = [np.frombuffer(conn.recv_bytes(), dtype=np.int64) for conn in conns]
    correct = (
        alignment.size == n_common(rows)
        and bool(np.all(alignment.active_rows < n_common(rows)))
        and all(np.array_equal(m, alignment.active_rows) for m in matched)
    )
    passive_peaks = [conn.recv() for conn in conns]
    result.send((seconds, alignment.size, correct, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))
    result.send(passive_peaks)


def _tree_rss_mb(root: int) -> float:
    """Resident memory of ``root`` and all its descendants (pool workers included), in MB; a shared page counts
    once per process, so this errs high."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    tree, frontier = {root}, [root]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        tree.update(children)
        frontier = children
    return sum(rss.get(pid, 0) for pid in tree) / 2**20


def run(rows: int, parties: int = 1, log: Callable[[str], None] = print) -> dict:
    if rows < 10:
        raise ValueError(f"--rows must be at least 10, got {rows}")
    if parties < 1:
        raise ValueError(f"--parties must be at least 1, got {parties}")
    per_op = measure_per_op_us()
    workers = psi.default_workers()
    context = multiprocessing.get_context("spawn")
    names = [f"passive-{p + 1}" for p in range(parties)]
    links = [context.Pipe() for _ in names]
    here, there = context.Pipe()
    processes = {
        name: context.Process(target=_passive, args=(name, rows, end), name=name)
        for name, (_, end) in zip(names, links, strict=True)
    }
    processes[ACTIVE] = context.Process(target=_active, args=(rows, [end for end, _ in links], there), name=ACTIVE)
    peaks = dict.fromkeys(processes, 0.0)
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            for name, process in processes.items():
                if process.pid is not None:
                    peaks[name] = max(peaks[name], _tree_rss_mb(process.pid))

    for process in processes.values():
        process.start()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        here.recv()
        log(f"aligning {rows:,} active ids with {parties} passive part{'y' if parties == 1 else 'ies'} "
            f"of {rows:,} ids ({workers} workers each) ...")
        here.send("go")
        seconds, size, correct, active_main = here.recv()
        passive_main = here.recv()
    finally:
        stop.set()
        sampler.join()
        for process in processes.values():
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
                process.join()
    counts = op_counts(rows, parties)
    floor = sum(counts[op] * per_op[op] for op in counts) / 1e6 / workers
    log(f"{seconds:.2f} s for {size:,} common ids (floor {floor:.2f} s: ratio {seconds / floor:.2f})")
    return {
        "rows": rows,
        "parties": parties,
        "workers": workers,
        "in_process": False,
        "transport": "pipes between one process per party (no gRPC)",
        "common": size,
        "correct": correct,
        "align_seconds": seconds,
        "per_op_us": per_op,
        "ops": counts,
        "floor_seconds": floor,
        "ratio_to_floor": seconds / floor,
        "peak_rss_mb": {name: round(mb, 1) for name, mb in peaks.items()},
        "peak_rss_mb_main_process": {
            ACTIVE: round(active_main, 1),
            **{name: round(mb, 1) for name, mb in zip(names, passive_main, strict=True)},
        },
    }
