"""``vflsec bench align``: PSI alignment time, by protocol, against a yardstick and a floor, and each party's peak
memory.

The active party holds ``rows`` ids; each passive party holds the first 90 % of them plus ``rows - 90 %`` ids of
its own, so the common set is known and checked. ``--protocol``: ``oprf`` (OT extension, the parties'
default: services/crypto/oprf.py), ``ecdh`` (services/crypto/psi.py) or ``both`` (the bench's default), run one
after the other in this run.
Two transports:

- ``grpc`` (default), the shipped path: each party's shard is written (ids plus one feature column, streamed to
  disk), every party runs as its own ``vflsec serve`` process over loopback mTLS, and the operator's ``AlignStream``
  call is timed: the streamed exchange (PsiOprfStream or PsiExchangeStream), the intersection, PsiFinish, the
  active party's ID index and the common IDs streamed back in chunks.
- ``pipes``: every party in its own spawned process generating its ids itself, the protocol messages on pipes,
  so the figure is the PSI computation alone (the functions the engines call, with their process pools).

The yardstick, measured in the same run: a million X25519 scalar multiplications on one core (``cryptography``'s
exchange), timed on a sample and scaled. ECDH's floor is its curve work at the per-operation costs measured here on
one core, divided by the worker processes: (hash-to-group ops x its cost + scalar multiplications x theirs) /
workers. Both costs are the shipped group's (``psi.SUITE``, reported as ``group``): ristretto255's hash (SHA-512
expansion and libsodium's map) and its scalar multiplication, whose decoding is the only check a received value
needs. OPRF's curve work is 640 base OTs a passive party, whatever the sizes: its floor is not curve work.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import resource
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from vflsec.client.bench import usage
from vflsec.client.federation.launcher import FederationLayout, run_processes, write_federation
from vflsec.services.crypto import oprf, psi

OVERLAP = 0.9
ACTIVE = "active"
_SAMPLE_IDS = 4096  # per-op costs from this many ids, in this process, one core
X25519_SAMPLE = 50_000  # X25519 exchanges timed for the yardstick (about 2 s), scaled to a million


def n_common(rows: int) -> int:
    return round(OVERLAP * rows)


def party_ids(party: str, rows: int) -> Iterator[str]:
    """A party's ids, generated one at a time: the common ones, then (passive parties) ids of its own."""
    for i in range(rows if party == ACTIVE else n_common(rows)):
        yield f"{i:012d}"
    if party != ACTIVE:
        for i in range(rows - n_common(rows)):
            yield f"{party}-{i:012d}"


def measure_per_op_us(n: int = _SAMPLE_IDS, clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Microseconds per hash-to-group and per scalar multiplication (of a received value: decoding included), one
    core, through the same functions the pool runs (the pool itself is bypassed)."""
    ids = [f"sample-{i}" for i in range(n)]
    salt, key = psi.new_salt(), psi.PsiKey()
    start = clock()
    points = psi.hash_ids(ids, salt)
    hashed = clock()
    key.reblind(points, workers=1)
    done = clock()
    return {"hash_to_group": (hashed - start) / n * 1e6, "scalar_mult": (done - hashed) / n * 1e6}


def op_counts(rows: int, parties: int) -> dict[str, int]:
    """Curve operations of one alignment: A blinds its n ids; each P reblinds them and blinds its own n;
    A reblinds every P's list."""
    return {"hash_to_group": rows * (1 + parties), "scalar_mult": rows * (1 + parties) + 2 * rows * parties}


def x25519_seconds(n: int = X25519_SAMPLE, scale_to: int = 1_000_000) -> tuple[float, float]:
    """The yardstick: (wall, CPU) seconds of ``scale_to`` X25519 scalar multiplications (``cryptography``'s
    exchange, one core), measured on ``n`` and scaled linearly. On a shared machine the wall figure moves with the
    other jobs; the CPU one much less."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    key, peer = X25519PrivateKey.generate(), X25519PrivateKey.generate().public_key()
    exchange = key.exchange
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        exchange(peer)
    return (time.perf_counter() - start) * scale_to / n, (time.process_time() - cpu) * scale_to / n


def _passive(party: str, rows: int, conn: Connection, protocol: str) -> None:
    ids = list(party_ids(party, rows))
    cpu = usage.tree_cpu_seconds(os.getpid())
    conn.send("ready")
    if protocol == "oprf":
        salt, hash_key, m, point = conn.recv()
        base_ot, code_seed = oprf.BaseOtReceiver(), os.urandom(oprf.KEY_BYTES)
        conn.send((code_seed, base_ot.answer(point)))
        sender = oprf.Sender(oprf.item_hashes(ids, salt), hash_key, m, base_ot, code_seed)
        for _ in range(oprf.row_chunks(m)):
            sender.add(conn.recv_bytes())
        conn.send_bytes(sender.challenge)
        sender.verify(oprf.Proof.from_bytes(conn.recv_bytes(), conn.recv_bytes()))
        conn.send_bytes(sender.values().tobytes())
        sent_rows = sender.rows
        del sender
    else:
        salt = conn.recv()
        reply = psi.passive_reply(psi.PsiKey(), ids, np.frombuffer(conn.recv_bytes(), dtype=psi._DTYPE), salt)
        conn.send_bytes(b"".join(reply.reblinded_active))
        conn.send_bytes(b"".join(reply.blinded_own))
        sent_rows = reply.permutation
        del reply
    own_rows = psi.rows_from_positions(np.frombuffer(conn.recv_bytes(), dtype=np.int64), sent_rows)
    conn.send("done")
    # Outside the timing: the common id of each common index, as the active row it must match.
    conn.send_bytes(np.array([int(ids[row]) if row < n_common(rows) else -1 for row in own_rows]).tobytes())
    conn.send((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, usage.tree_cpu_seconds(os.getpid()) - cpu))


def _oprf_align(ids: list[str], conns: list[Connection]) -> psi.Alignment:
    """The active side of the OPRF exchange with every passive party in turn, then the intersection."""
    salt = psi.new_salt()
    hashed = oprf.item_hashes(ids, salt)
    m = oprf.bins(len(ids))
    hash_key, table = oprf.place(hashed, m)
    bins, mine = oprf.Bins(table, hashed), []
    for conn in conns:
        base_ot = oprf.BaseOtSender()
        conn.send((salt, hash_key, m, base_ot.point))
        code_seed, answers = conn.recv()
        receiver = oprf.Receiver(bins, *base_ot.keys(answers), code_seed)
        for chunk in receiver.u_chunks():
            conn.send_bytes(chunk)
        words, rows = receiver.proof(conn.recv_bytes()).to_bytes()
        conn.send_bytes(words)
        conn.send_bytes(rows)
        mine.append(receiver.values())
        receiver.close()
    bins.close()
    theirs = [np.frombuffer(conn.recv_bytes(), dtype=f"S{oprf.VALUE_BYTES}") for conn in conns]
    return psi.intersect(mine, theirs, names=[f"passive-{p + 1}" for p in range(len(conns))])


def _ecdh_align(ids: list[str], conns: list[Connection]) -> psi.Alignment:
    key, salt = psi.PsiKey(), psi.new_salt()
    blinded = key.blind(ids, salt).tobytes()
    for conn in conns:
        conn.send(salt)
        conn.send_bytes(blinded)
    del blinded
    replies = [(conn.recv_bytes(), conn.recv_bytes()) for conn in conns]
    return psi.active_align(
        key,
        [np.frombuffer(double, dtype=psi._DTYPE) for double, _ in replies],
        [np.frombuffer(own, dtype=psi._DTYPE) for _, own in replies],
        names=[f"passive-{p + 1}" for p in range(len(conns))],
    )


def _active(rows: int, conns: list[Connection], result: Connection, protocol: str) -> None:
    ids = list(party_ids(ACTIVE, rows))
    for conn in conns:
        conn.recv()
    result.send("ready")
    result.recv()
    start, cpu = time.perf_counter(), usage.tree_cpu_seconds(os.getpid())
    alignment = (_oprf_align if protocol == "oprf" else _ecdh_align)(ids, conns)
    for conn, positions in zip(conns, alignment.passive_positions, strict=True):
        conn.send_bytes(np.ascontiguousarray(positions, dtype=np.int64).tobytes())
    for conn in conns:
        conn.recv()
    seconds = time.perf_counter() - start
    cpu = usage.tree_cpu_seconds(os.getpid()) - cpu
    matched = [np.frombuffer(conn.recv_bytes(), dtype=np.int64) for conn in conns]
    correct = (
        alignment.size == n_common(rows)
        and bool(np.all(alignment.active_rows < n_common(rows)))
        and all(np.array_equal(m, alignment.active_rows) for m in matched)
    )
    passive_peaks = [conn.recv() for conn in conns]
    result.send((seconds, alignment.size, correct, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, cpu))
    result.send(passive_peaks)


def _pipes(rows: int, parties: int, log: Callable[[str], None], workers: int, protocol: str) -> dict:
    context = multiprocessing.get_context("spawn")
    names = [f"passive-{p + 1}" for p in range(parties)]
    links = [context.Pipe() for _ in names]
    here, there = context.Pipe()
    processes = {
        name: context.Process(target=_passive, args=(name, rows, end, protocol), name=name)
        for name, (_, end) in zip(names, links, strict=True)
    }
    processes[ACTIVE] = context.Process(
        target=_active, args=(rows, [end for end, _ in links], there, protocol), name=ACTIVE
    )
    for process in processes.values():
        process.start()
    sampler = _PeakSampler({name: process.pid for name, process in processes.items()})
    try:
        here.recv()
        log(f"{protocol}: aligning {rows:,} active ids with {parties} passive part{'y' if parties == 1 else 'ies'} "
            f"of {rows:,} ids ({workers} workers each, pipes) ...")
        here.send("go")
        seconds, size, correct, active_main, active_cpu = here.recv()
        passive_main, passive_cpu = zip(*here.recv(), strict=True)
    finally:
        sampler.stop()
        for process in processes.values():
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
                process.join()
    return {
        "transport": "pipes between one process per party (no gRPC)",
        "seconds": seconds,
        "common": size,
        "correct": correct,
        "cpu": active_cpu + sum(passive_cpu),
        "peaks": sampler.peaks,
        "pss_peaks": sampler.pss_peaks,
        "main": {ACTIVE: active_main, **dict(zip(names, passive_main, strict=True))},
    }


class _PeakSampler:
    """Every 0.2 s, the resident memory (RSS and PSS) of each party's process tree; the peaks per party."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.peaks = dict.fromkeys(pids, 0.0)
        self.pss_peaks = dict.fromkeys(pids, 0.0)
        self._stop = threading.Event()

        def sample() -> None:
            while not self._stop.wait(0.2):
                stats = usage.proc_stats()  # /proc read once a sample, for every party's tree
                for name, pid in pids.items():
                    self.peaks[name] = max(self.peaks[name], usage.tree_rss_mb(pid, stats))
                    self.pss_peaks[name] = max(self.pss_peaks[name], usage.tree_pss_mb(pid, stats))

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def write_align_federation(
    rows: int, parties: int, workdir: Path, protocol: str = psi.PROTOCOLS[0]
) -> FederationLayout:
    """A federation whose shards hold the bench's ids (one random feature column each), written chunk by chunk;
    its active party aligns by ``protocol``."""
    from vflsec.client.bench.scale import scale_spec
    from vflsec.services.data import datasets

    # The bench deploys every party itself: above the default caps its parties accept its own list sizes (the
    # deployment's caps, and the owner budget's 10 exchanges of such a list, are the operator's to set).
    limits = {"psi_max_ids": rows, "psi_owner_budget": 10 * oprf.bins(rows)} if rows > psi.MAX_IDS else None
    layout = write_federation(replace(scale_spec(parties, 1), psi_protocol=protocol, limits=limits), workdir)
    for party, columns in zip(["active", *layout.passive_parties], layout.split.parties, strict=True):
        labelled = party == ACTIVE

        def chunks(party: str = party, labelled: bool = labelled) -> Iterator[tuple]:
            ids = party_ids(party, rows)
            for start in range(0, rows, psi.CHUNK):
                block = list(itertools.islice(ids, psi.CHUNK))
                rng = np.random.default_rng([start])
                yield block, rng.random((len(block), 1)), np.arange(start, start + len(block)) % 2 if labelled else None

        datasets.write_party_csv_chunks(
            workdir / party / "data.csv", columns, chunks(), class_names=["0", "1"] if labelled else None
        )
    return layout


def _grpc(rows: int, parties: int, log: Callable[[str], None], workers: int, protocol: str) -> dict:
    from vflsec.client.bench.scale import peak_rss_mib
    from vflsec.client.federation.operator import Operator

    with tempfile.TemporaryDirectory(prefix="vflsec-bench-align-") as tmp:
        layout = write_align_federation(rows, parties, Path(tmp), protocol)
        names = [ACTIVE, *layout.passive_parties]
        with run_processes(layout, timeout=60 + rows * 2e-4) as fed, layout.operator_channel() as channel:
            operator = Operator(channel)
            session_id = operator.create_session("plain", seed=0).session_id
            pids = {name: fed.processes[name].pid for name in names}
            log(f"{protocol}: aligning {rows:,} active ids with {parties} passive "
                f"part{'y' if parties == 1 else 'ies'} of {rows:,} ids ({workers} workers each, gRPC over loopback "
                "mTLS, one vflsec serve per party) ...")
            stats = usage.proc_stats()
            cpu = sum(usage.tree_cpu_seconds(pid, stats) for pid in pids.values())
            before = {name: usage.tree_rss_mb(pid, stats) for name, pid in pids.items()}
            sampler = _PeakSampler(pids)
            start = time.perf_counter()
            try:
                common = operator.align(session_id)
            finally:
                seconds = time.perf_counter() - start
                sampler.stop()
            stats = usage.proc_stats()
            cpu = sum(usage.tree_cpu_seconds(pid, stats) for pid in pids.values()) - cpu
            main = {name: peak_rss_mib(pid) for name, pid in pids.items()}
    expected = n_common(rows)
    correct = len(common) == expected and len(set(common)) == expected and all(
        not i.startswith("passive") and int(i) < expected for i in common
    )
    return {
        "transport": "grpc: one vflsec serve process per party, loopback mTLS, the exchange streamed in chunks",
        "seconds": seconds,
        "common": len(common),
        "correct": correct,
        "cpu": cpu,
        "peaks": sampler.peaks,
        "pss_peaks": sampler.pss_peaks,
        "main": main,
        "before": before,
    }


def run(
    rows: int,
    parties: int = 1,
    log: Callable[[str], None] = print,
    transport: str = "grpc",
    protocol: str = "both",
) -> dict:
    """``protocol``: "oprf", "ecdh" or "both" (OPRF first). The top-level figures are the first protocol's; every
    run's are under ``runs``; ``default_protocol`` names the one the parties run unless configured otherwise."""
    if rows < 10:
        raise ValueError(f"--rows must be at least 10, got {rows}")
    if parties < 1:
        raise ValueError(f"--passive must be at least 1, got {parties}")
    if transport not in TRANSPORTS:
        raise ValueError(f"--transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
    if protocol not in (*psi.PROTOCOLS, "both"):
        raise ValueError(f"--protocol must be one of {', '.join((*psi.PROTOCOLS, 'both'))}, got {protocol!r}")
    load = os.getloadavg()[0]
    x25519, x25519_cpu = x25519_seconds()
    log(f"yardstick: 1M X25519 scalar multiplications on one core take {x25519:.1f} s, {x25519_cpu:.1f} CPU-s "
        f"(from {X25519_SAMPLE:,}; load average {load:.1f})")
    workers = psi.default_workers()
    runs = {p: _one(p, rows, parties, log, transport, workers, x25519, x25519_cpu) for p in (
        ("oprf", "ecdh") if protocol == "both" else (protocol,)
    )}
    first = next(iter(runs.values()))
    return {
        "rows": rows,
        "parties": parties,
        "workers": workers,
        "in_process": False,
        "load_average_1min": load,
        # The yardstick, measured in this run before the alignments: one core's X25519 exchanges (cryptography's,
        # OpenSSL), timed on X25519_SAMPLE and scaled to a million.
        "x25519_1m_seconds": x25519,
        "x25519_1m_cpu_seconds": x25519_cpu,
        "x25519_sample": X25519_SAMPLE,
        **first,
        "protocol": protocol,  # "both", or the one run's (as in runs)
        "default_protocol": psi.PROTOCOLS[0],  # what a party runs unless configured ([psi] protocol, accept)
        "correct": all(r["correct"] for r in runs.values()),
        "runs": runs,
    }


def _one(
    protocol: str,
    rows: int,
    parties: int,
    log: Callable[[str], None],
    transport: str,
    workers: int,
    x25519: float,
    x25519_cpu: float,
) -> dict:
    load = os.getloadavg()[0]
    measured = TRANSPORTS[transport](rows, parties, log, workers, protocol)
    seconds, size, cpu = measured["seconds"], measured["common"], measured["cpu"]
    figures = {
        "protocol": protocol,
        "transport": measured["transport"],
        "common": size,
        "correct": measured["correct"],
        "align_seconds": seconds,
        "ratio_to_x25519_1m": seconds / x25519,
        # CPU seconds of every party process and worker during the alignment (id generation and loading not).
        "cpu_seconds": cpu,
        # Load-independent: all parties' CPU seconds against the yardstick's CPU seconds.
        "cpu_ratio_to_x25519_1m": cpu / x25519_cpu,
        "load_average_1min_before": load,
        # Sampled during the alignment (grpc) or the party process's life (pipes): each party's process tree.
        "peak_rss_mb": {name: round(mb, 1) for name, mb in measured["peaks"].items()},
        # The party process's own exact peak (VmHWM); with grpc it includes loading its shard.
        "peak_rss_mb_main_process": {name: round(mb, 1) for name, mb in measured["main"].items()},
        # grpc: each party's process tree just before Align (a started vflsec serve with its shard loaded), so
        # the alignment's own share of peak_rss_mb is the difference; empty with pipes.
        "rss_before_align_mb": {name: round(mb, 1) for name, mb in measured.get("before", {}).items()},
        # The same trees' peak proportional set size: shared pages split between the processes sharing them.
        "peak_pss_mb": {name: round(mb, 1) for name, mb in measured["pss_peaks"].items()},
    }
    peak = max(figures["peak_rss_mb"].values())
    if protocol == "oprf":
        log(f"oprf: {seconds:.2f} s for {size:,} common ids ({seconds / x25519:.2f} x the X25519 yardstick; "
            f"CPU {cpu:.1f} s: {cpu / x25519_cpu:.2f} x its CPU; peak RSS {peak:.0f} MB; load average {load:.1f})")
        return figures
    per_op = measure_per_op_us()
    per_op_cpu = measure_per_op_us(clock=time.process_time)
    counts = op_counts(rows, parties)
    floor = sum(counts[op] * per_op[op] for op in counts) / 1e6 / workers
    cpu_floor = sum(counts[op] * per_op_cpu[op] for op in counts) / 1e6
    log(
        f"ecdh: {seconds:.2f} s for {size:,} common ids (floor {floor:.2f} s: ratio {seconds / floor:.2f}; "
        f"CPU {cpu:.1f} s for {cpu_floor:.1f} s of curve work: {cpu / cpu_floor:.2f}; "
        f"{seconds / x25519:.2f} x the X25519 yardstick; peak RSS {peak:.0f} MB; load average {load:.1f})"
    )
    return {
        **figures,
        "group": psi.SUITE,  # whose operations per_op_us measured
        "per_op_us": per_op,
        "ops": counts,
        "floor_seconds": floor,
        "ratio_to_floor": seconds / floor,
        # Load-independent view: the CPU seconds against the curve work at CPU-time per-op costs.
        "cpu_floor_seconds": cpu_floor,
        "cpu_ratio": cpu / cpu_floor,
        "per_op_cpu_us": per_op_cpu,
    }


TRANSPORTS: dict[str, Callable[[int, int, Callable[[str], None], int, str], dict]] = {"grpc": _grpc, "pipes": _pipes}
