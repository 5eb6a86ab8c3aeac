"""ECDH private set intersection in ristretto255, a group of prime order (protocol.md, "Alignment").

Each party hashes its ids into the group with RFC 9380's ``hash_to_ristretto255`` (suite
``ristretto255_XMD:SHA-512_R255MAP_RO_``, salted per session) and blinds them with a secret scalar k uniform in
[1, L). Scalar multiplication commutes, so ``a·(p·H(x)) == p·(a·H(x))``: double-blinded values match exactly for
common ids, while under DDH in the prime-order group raw ids' blinded values look like random group elements.
Every received value must be the canonical encoding of a non-identity element before it is used: ristretto255 has
no cofactor and no twist, so a value that decodes is a group element and nothing else rides along through blinding.

Protocol between the active party A and each passive party P (one A key, one key per P, one exchange per
session, enforced by the parties' engines):

1. A sends ``key_a.blind(ids_a, salt)`` to every P.
2. P answers with :func:`passive_stream` (:func:`passive_reply` collects it): A's list blinded again (same
   order) and its own blinded ids in a secret random order (P keeps the permutation).
3. A calls :func:`active_align`, which blinds P's lists a second time and intersects across all passive
   parties. The common samples are put in a uniformly random order, so positions reveal nothing about either
   party's row order; A sends each P its ``Alignment.passive_positions[p]``.
4. P maps common index -> own row with :func:`rows_from_positions`.

Hashing (services/crypto/curve.py) is SHA-512 and libsodium's ristretto255 map; scalar multiplication and
decoding are libsodium's. Each value costs a few Python calls that hold the GIL, so the work is cut into chunks of up
to :data:`CHUNK` ids or points (the unit of work: pure functions of the scalar, salt and chunk, so they could go to
other machines too) run in a process pool of :func:`default_workers` processes. Lists are S32 numpy arrays (32 bytes
per value, no per-row Python object); they travel between the parties as :class:`Chunk` s of the same size, streamed
as the pool finishes them and checked on arrival by :class:`ChunkReader`. The intersection is a sort and a binary
search over those arrays, not a per-row dict (docs/performance.md, "Alignment").
"""

from __future__ import annotations

import functools
import itertools
import math
import multiprocessing
import os
import secrets
import select
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
from pysodium import crypto_core_ristretto255_scalar_reduce

from vflsec.services.crypto import entropy, spill
from vflsec.services.crypto.curve import (  # the curve work; also this module's API
    DST,
    POINT_BYTES,
    SUITE,
    _message,
    blind_task,
    expand_message_xmd,
    hash_to_group,
    multiply_task,
)

__all__ = ["DST", "POINT_BYTES", "SUITE", "expand_message_xmd", "hash_to_group"]  # and every public name below

# Default cap on the IDs a party accepts in one exchange ([limits] psi_max_ids): it bounds how many candidate
# IDs the active party can test per session, and sits above the million-row deployments the system targets.
MAX_IDS = 2_000_000
# Default cap relative to the receiving party's own set ([limits] psi_max_ratio): a partner's list may hold up to
# this many times our own IDs. Equal sets, 90 % overlaps and a partner twice our size pass; a list of a million
# candidates against a few thousand rows does not (each extra candidate is one more membership test).
MAX_RATIO = 2.0
# ... above a floor ([limits] psi_ratio_floor): a list of up to a million IDs is never refused by default, whatever
# our own size (a million-row partner is the deployment the system targets); psi_max_ids still bounds it.
RATIO_FLOOR = 1_000_000
# Ids or points per unit of work: at most CHUNK (a task's pickling is noise next to its ~1 s of curve arithmetic;
# 1M ids make ~120 tasks), and about 4 per worker for shorter lists so no worker waits on a long last one; a list of
# up to MIN_CHUNK is one task, done in the calling process (a pool's start-up would cost more than it saves).
# The alignment protocols an active party may run ([psi] protocol); the first is the default, and a passive party
# serves all of them unless its [psi] accept narrows them. "oprf": OT-extension PSI (services/crypto/oprf.py, with
# OOS17's consistency check against a deviating active party); "ecdh": this module's.
PROTOCOLS = ("oprf", "ecdh")
CHUNK = 8192
MIN_CHUNK = 2048
_POSITIONS_BLOCK = 1 << 20  # positions mapped at once against a block of an order on disk: a few MB of temporaries
WORKERS_ENV = "VFLSEC_PSI_WORKERS"


def new_salt() -> bytes:
    """A fresh per-session salt; it is public to both sides and only separates sessions."""
    return secrets.token_bytes(32)


def _require_salt(salt: bytes) -> None:
    if not isinstance(salt, bytes) or not salt:
        raise ValueError("salt must be non-empty bytes shared by both parties")


def hash_ids(ids: Sequence[str], salt: bytes) -> list[bytes]:
    """Hash ids into the prime-order group, salted per session."""
    _require_salt(salt)
    _require_strings(ids)
    return hash_to_group([_message(sample_id.encode("utf-8"), salt) for sample_id in ids])


def _require_strings(ids: Sequence[str] | np.ndarray) -> None:
    if isinstance(ids, np.ndarray) and ids.dtype.kind == "U":  # a string array holds nothing else
        return
    for row, sample_id in enumerate(ids):
        if not isinstance(sample_id, str):
            raise ValueError(f"sample id at row {row} is a {type(sample_id).__name__}, not a string")


# --- parallel units of work: pure functions of (scalar, salt, chunk), so any process or machine can run one ---
_DTYPE = np.dtype(f"S{POINT_BYTES}")  # one encoding per row; S32 compares all 32 bytes, trailing zeros included
Task = tuple[Callable[..., bytes], tuple]


def default_workers(env: str = WORKERS_ENV) -> int:
    """Processes for blinding: ``$VFLSEC_PSI_WORKERS`` (or ``env``) if set, else the CPUs this process may run on."""
    configured = os.environ.get(env, "").strip()
    if configured:
        if not configured.isdigit() or int(configured) < 1:
            raise ValueError(f"{env} must be a positive integer, got {configured!r}")
        return int(configured)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def forkserver() -> multiprocessing.context.ForkServerContext:
    """The context of every process pool of a party (this module's, services/crypto/product_pool.py's): forkserver,
    not fork (the parties are multi-threaded gRPC servers, and a fork copies whatever lock another thread holds). A
    process has one forkserver, preloaded once by whichever pool starts it, so there is one preload list: the curve
    code, and workers that do not re-import the caller's main module (services/crypto/psi_pool.py)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["vflsec.services.crypto.psi_pool"])
    return context


def pool(workers: int) -> ProcessPoolExecutor:
    """A process pool of :func:`forkserver` workers that exit when the calling process does (:func:`exit_with`)."""
    return ProcessPoolExecutor(
        max_workers=workers, mp_context=forkserver(), initializer=exit_with, initargs=(os.getpid(),)
    )


def exit_with(caller: int) -> None:
    """A worker's initializer: exit once ``caller`` has. A forkserver worker outlives a caller killed with SIGKILL
    (it waits on a task queue it holds both ends of, and holds the forkserver's liveness pipe, so the forkserver stays
    too), and with them the resource tracker, which unlinks a killed caller's shared memory only when every process
    holding it has gone (review 20: a node's indicators stayed in /dev/shm)."""
    threading.Thread(target=_exit_when_gone, args=(caller,), name="exit-with-caller", daemon=True).start()


def _exit_when_gone(caller: int) -> None:
    try:
        select.select([os.pidfd_open(caller)], [], [])  # readable once the caller has exited (Linux >= 5.3)
    except (AttributeError, OSError):  # no pidfd here, or the caller is gone already
        while _alive(caller):
            time.sleep(1.0)
    os._exit(1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _workers(workers: int | None) -> int:
    if workers is None:
        return default_workers()
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    return workers


def _chunk(n: int, workers: int) -> int:
    return min(CHUNK, max(MIN_CHUNK, -(-n // (4 * workers))))


def _stream(tasks: Iterable[Task], n_tasks: int, workers: int) -> Iterator[bytes]:
    """The tasks' results in order, each as soon as it and those before it are done: in this process for one task
    or one worker, else in a process pool that lives for this generator only (no worker, nor the scalar it was
    sent, outlives it; a failed task, or a consumer that stops early, cancels the rest). Tasks are made as the pool
    takes them and at most 2 per worker are in flight or waiting to be consumed, so memory stays bounded however
    long the list. (:func:`forkserver`, which preloads only the curve code: a worker is about 20 MB.)"""
    n = min(workers, n_tasks)
    if n <= 1:
        yield from (fn(*args) for fn, args in tasks)
        return
    executor = pool(n)
    try:
        pending: deque = deque()
        for fn, args in tasks:
            pending.append(executor.submit(fn, *args))
            if len(pending) >= 2 * n:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


Progress = Callable[[int], None]  # told the number of values of each chunk as it is done


def _collect(
    results: Iterable[bytes], n: int, progress: Progress | None = None, out: np.ndarray | None = None
) -> np.ndarray:
    """The chunks' values in one S32 array of ``n`` (``out``, else a new one), filled as they come (no list of
    chunks, no joined copy)."""
    out, filled = np.empty(n, dtype=_DTYPE) if out is None else out, 0
    for blob in results:
        values = _from_blob(blob)
        out[filled : filled + len(values)] = values
        filled += len(values)
        if progress is not None:
            progress(len(values))
    assert filled == n
    return out


def _spans(n: int, workers: int) -> list[tuple[int, int]]:
    step = _chunk(n, workers)
    return [(start, min(start + step, n)) for start in range(0, n, step)]


def _blind_tasks(
    scalar: bytes, ids: Sequence[str], salt: bytes, spans: list[tuple[int, int]], order: np.ndarray | None = None
) -> Iterator[Task]:
    """Blinding tasks over ``ids`` (in the given ``order``, if any), made one at a time as the pool takes them; a
    chunk travels as one buffer of fixed-width UTF-8 encodings, never one Python object per id."""

    def chunk(a: int, b: int) -> np.ndarray:
        if order is None:
            return np.asarray(ids[a:b], dtype=str)
        if isinstance(ids, np.ndarray):
            return ids[order[a:b]]
        return np.asarray([ids[row] for row in order[a:b]], dtype=str)

    def task(a: int, b: int) -> Task:
        encoded = np.char.encode(chunk(a, b), "utf-8")  # S dtype: zero-padded to the longest id of the chunk
        return blind_task, (scalar, salt, encoded.itemsize, encoded.tobytes(), a)

    return (task(a, b) for a, b in spans)


def _multiply_tasks(scalar: bytes, points: np.ndarray, spans: list[tuple[int, int]]) -> Iterator[Task]:
    return ((multiply_task, (scalar, points[a:b].tobytes(), a)) for a, b in spans)


def _points(values: Sequence[bytes] | np.ndarray) -> np.ndarray:
    """32-byte values as an S32 array; a value of another length or type is a ValueError with its index."""
    if isinstance(values, np.ndarray) and values.dtype.kind == "S":  # S32 points, or the OPRF's S16 values
        return values
    for index, point in enumerate(values):
        if not isinstance(point, bytes) or len(point) != POINT_BYTES:
            got = f"{len(point)} bytes" if isinstance(point, bytes) else type(point).__name__
            raise ValueError(f"point at index {index} must be {POINT_BYTES} bytes, got {got}")
    return _from_blob(b"".join(values))


def _from_blob(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype=_DTYPE) if blob else np.empty(0, dtype=_DTYPE)


def _as_list(points: np.ndarray) -> list[bytes]:
    # Through the raw buffer: an S32 element drops its trailing zero bytes.
    blob = points.tobytes()
    return [blob[i : i + POINT_BYTES] for i in range(0, len(blob), POINT_BYTES)]


# --- lists on the wire: chunks of at most CHUNK points, each with its index and the totals ---
@dataclass(frozen=True)
class Chunk:
    """Chunk ``index`` (0-based) of the ``chunks`` that carry a list of ``points`` values; ``data`` is its
    values' 32-byte encodings, concatenated."""

    index: int
    chunks: int
    points: int
    data: bytes


def chunks_of(points: np.ndarray, workers: int = 1) -> Iterator[Chunk]:
    """An S32 array as chunks, cut as the pool would cut it; an empty list is no chunk at all."""
    spans = _spans(len(points), workers)
    for index, (a, b) in enumerate(spans):
        yield Chunk(index, len(spans), len(points), points[a:b].tobytes())


class ChunkReader:
    """Assembles a list received in chunks, checking each on arrival; a breach is a ValueError naming it (the
    caller names the sender). ``check_size(points)`` may refuse the announced size before any memory is taken
    for it. No chunk at all is the empty list. With ``keep=False`` nothing is assembled: the caller consumes each
    chunk's values, which :meth:`add` returns, and :meth:`total` checks the list ended where announced."""

    def __init__(
        self,
        check_size: Callable[[int], None] | None = None,
        *,
        width: int = POINT_BYTES,
        per_chunk: int = CHUNK,
        keep: bool = True,
    ) -> None:
        """``width`` bytes a value, at most ``per_chunk`` values a chunk (the OPRF's values: 16 and more)."""
        self._check_size = check_size
        self._width, self._per_chunk, self._keep = width, per_chunk, keep
        self._points: np.ndarray | None = None
        self._chunks = self._next = self._filled = self._total = 0

    def add(self, chunk: Chunk) -> np.ndarray:
        """Check ``chunk`` and take its values; they are returned too."""
        if not self._chunks:
            if chunk.points < 1 or not -(-chunk.points // self._per_chunk) <= chunk.chunks <= chunk.points:
                raise ValueError(
                    f"chunk {chunk.index} announces {chunk.chunks} chunks for {chunk.points} points: each chunk "
                    f"carries 1 to {self._per_chunk} points"
                )
            if self._check_size is not None:
                self._check_size(chunk.points)
            self._total, self._chunks = chunk.points, chunk.chunks
            if self._keep:
                self._points = np.empty(chunk.points, dtype=f"S{self._width}")
        elif (chunk.chunks, chunk.points) != (self._chunks, self._total):
            raise ValueError(
                f"chunk {chunk.index} announces {chunk.chunks} chunks of {chunk.points} points, the first "
                f"{self._chunks} chunks of {self._total} points"
            )
        if chunk.index != self._next or chunk.index >= self._chunks:
            if chunk.index >= self._chunks:
                problem = f"beyond the {self._chunks} announced"
            elif chunk.index < self._next:
                problem = f"repeated (chunk {self._next} expected)"
            else:
                problem = f"out of order: chunk {self._next} missing"
            raise ValueError(f"chunk {chunk.index} {problem}")
        n, rest = divmod(len(chunk.data), self._width)
        if rest or not 1 <= n <= self._per_chunk:
            raise ValueError(
                f"chunk {chunk.index} holds {len(chunk.data)} bytes, not 1 to {self._per_chunk} values of "
                f"{self._width} bytes"
            )
        if self._filled + n > self._total or (self._next == self._chunks - 1) != (self._filled + n == self._total):
            raise ValueError(
                f"chunk {chunk.index} of {self._chunks} brings the list to {self._filled + n} points, "
                f"{self._total} announced"
            )
        values = np.frombuffer(chunk.data, dtype=f"S{self._width}")
        if self._points is not None:
            self._points[self._filled : self._filled + n] = values
        self._filled += n
        self._next += 1
        return values

    def total(self) -> int:
        """The list's length; a ValueError if it ended before the announced last chunk."""
        if self._next != self._chunks:
            raise ValueError(f"the list ends after {self._next} of {self._chunks} chunks")
        return self._total

    def result(self) -> np.ndarray:
        """The whole list (``keep``); a ValueError if it ended before the announced last chunk."""
        self.total()
        return self._points if self._points is not None else np.empty(0, dtype=f"S{self._width}")


@dataclass(frozen=True)
class Caps:
    """A party's caps on a partner's list, whichever protocol carries it: [limits] psi_max_ids (absolute),
    psi_max_ratio (relative to our own IDs) above psi_ratio_floor."""

    max_ids: int = MAX_IDS
    max_ratio: float = MAX_RATIO
    ratio_floor: int = RATIO_FLOOR

    def largest(self, own: int) -> int:
        """The longest partner list accepted against our ``own`` IDs (an OPRF exchange's bins are sized by it)."""
        return min(self.max_ids, max(math.floor(self.max_ratio * own), self.ratio_floor))

    def check(self, n: int, own: int) -> None:
        """Refuse a partner's list of ``n`` ids against our ``own``: a ValueError naming the bound it breaks and the
        smallest setting that would accept it."""
        if n > self.max_ids:
            raise ValueError(
                f"{n} IDs announced, over this party's cap of {self.max_ids} ([limits] psi_max_ids; the smallest that "
                f"accepts them is {n})"
            )
        if n > self.largest(own):
            smallest = math.ceil(n * 100 / max(own, 1)) / 100
            raise ValueError(
                f"{n} IDs announced, over {self.max_ratio:g} x this party's own {own} IDs ([limits] psi_max_ratio; "
                f"the smallest that accepts them is {smallest:g}; lists up to [limits] psi_ratio_floor = "
                f"{self.ratio_floor} always pass)"
            )

    def checker(self, own: int) -> Callable[[int], None]:
        """:meth:`check` against our ``own`` IDs, for a list whose size is announced later (ChunkReader)."""
        return functools.partial(self.check, own=own)


_BLOCK = 65_536  # values compared at once: temporaries stay a few MB (a million S32 values are 32 MB)


def _require_unique(values: np.ndarray, what: str) -> np.ndarray:
    """The sorting order of ``values``; a ValueError naming two rows if a value repeats (rows only, never the value:
    the message may travel in an RPC error). The sorted values are compared block by block, never copied whole."""
    order = np.argsort(values, kind="stable")
    for start in range(0, max(len(order) - 1, 0), _BLOCK):
        run = values[order[start : start + _BLOCK + 1]]
        repeats = np.flatnonzero(run[1:] == run[:-1])
        if repeats.size:
            first, second = sorted(int(row) for row in order[start + repeats[0] : start + repeats[0] + 2])
            raise ValueError(f"duplicate {what} at rows {first} and {second}")
    return order


def require_unique_by_range(values: np.ndarray | spill.Column, what: str, directory: str | None = None) -> None:
    """:func:`_require_unique` for uniformly random values (keyed hashes: the OPRF's h(x)), in memory or on disk,
    in bounded memory: cut by value range on disk (spill.Ranges, removed on the way out), each range sorted alone;
    the same ValueError naming two rows."""
    with spill.Ranges(spill.Ranges.count_for(len(values)), values.dtype.itemsize, directory) as ranges:
        for start, block in spill.blocks(values, _BLOCK):
            ranges.add(np.arange(start, start + len(block), dtype=np.int32), block)
        for r in range(ranges.count):
            rows, part = ranges.part(r)
            order = np.argsort(part, kind="stable")
            run = part[order]
            repeats = np.flatnonzero(run[1:] == run[:-1])
            if repeats.size:
                first, second = sorted(int(row) for row in rows[order[repeats[0] : repeats[0] + 2]])
                raise ValueError(f"duplicate {what} at rows {first} and {second}")


class PsiKey:
    """A party's secret blinding scalar, uniform in [1, L) and fresh for each session."""

    __slots__ = ("_scalar",)

    def __init__(self) -> None:
        scalar = bytes(32)
        while scalar == bytes(32):  # reduce(64 random bytes) is uniform mod L up to 2^-256; 0 is redrawn
            scalar = crypto_core_ristretto255_scalar_reduce(secrets.token_bytes(64))
        self._scalar = scalar

    def blind_ids(self, ids: Sequence[str], salt: bytes, *, workers: int | None = None) -> list[bytes]:
        """``k·H(id)`` for each id, in order. Duplicate ids are rejected: rows must be addressable by id."""
        return _as_list(self.blind(ids, salt, workers=workers))

    def blind(
        self,
        ids: Sequence[str] | np.ndarray,
        salt: bytes,
        *,
        workers: int | None = None,
        progress: Progress | None = None,
    ) -> np.ndarray:
        """:meth:`blind_ids` as an S32 array (what the engines send, chunk by chunk); ``progress`` hears of each
        chunk done."""
        _require_salt(salt)
        _require_strings(ids)
        workers = _workers(workers)
        spans = _spans(len(ids), workers)
        tasks = _blind_tasks(self._scalar, ids, salt, spans)
        points = _collect(_stream(tasks, len(spans), workers), len(ids), progress)
        # Equal ids give equal points (distinct ids collide with negligible probability): one sort finds repeats.
        _require_unique(points, "ids")
        return points

    def reblind(self, points: Sequence[bytes] | np.ndarray, *, workers: int | None = None) -> list[bytes]:
        """``k·P`` for each point received from the other party, in order.

        Every point must be the canonical encoding of a non-identity ristretto255 element (the group has prime
        order: nothing but the element survives blinding); k is in [1, L), so a valid point never yields the
        identity.
        """
        return _as_list(self._reblind(_points(points), workers))

    def _reblind(
        self, points: np.ndarray, workers: int | None, progress: Progress | None = None, *, in_place: bool = False
    ) -> np.ndarray:
        """``in_place``: the results overwrite ``points`` (each chunk's task holds a copy of its input before its
        result arrives), so a list received whole is not held twice."""
        workers = _workers(workers)
        spans = _spans(len(points), workers)
        results = _stream(_multiply_tasks(self._scalar, points, spans), len(spans), workers)
        return _collect(results, len(points), progress, points if in_place else None)


@dataclass(frozen=True)
class PassiveReply:
    """What a passive party sends back, plus the permutation it keeps secret."""

    reblinded_active: list[bytes]  # A's blinded ids, blinded again by P, in A's order
    blinded_own: list[bytes]  # P's blinded ids in shuffled order
    permutation: np.ndarray  # secret: blinded_own[j] is P's row permutation[j]


# The passive party's two reply lists, named as the PsiExchangeReply fields that carry them.
DOUBLE, OWN = "double_blinded", "own_blinded"


@dataclass(frozen=True)
class PassiveStream:
    """The passive reply as it is computed: ``chunks`` yields ``(DOUBLE, chunk)`` for the whole of A's list
    re-blinded (same order) and then ``(OWN, chunk)`` for our own ids blinded in the order of ``permutation``
    (secret: the j-th own value is our row ``permutation[j]``). A bad point in A's list is a ValueError raised
    before any ``OWN`` chunk."""

    permutation: np.ndarray
    chunks: Iterator[tuple[str, Chunk]]


def passive_stream(
    key: PsiKey,
    own_ids: Sequence[str] | np.ndarray,
    received: Sequence[bytes] | np.ndarray,
    salt: bytes,
    *,
    workers: int | None = None,
) -> PassiveStream:
    """Passive side of step 2, one pool for both lists. Salt, id types and duplicate ids are checked before any
    curve work; each chunk is yielded as soon as the pool has it."""
    _require_salt(salt)
    _require_strings(own_ids)
    received = _points(received)
    _require_unique(np.asarray(own_ids, dtype=str), "ids")  # equal ids would give equal points: refuse them first
    permutation = entropy.os_entropy().permutation(len(own_ids))  # hides our row order from A
    workers = _workers(workers) if len(received) + len(own_ids) > MIN_CHUNK else 1  # small: no pool
    double, own = _spans(len(received), workers), _spans(len(own_ids), workers)
    tasks = itertools.chain(
        _multiply_tasks(key._scalar, received, double), _blind_tasks(key._scalar, own_ids, salt, own, permutation)
    )
    results = _stream(tasks, len(double) + len(own), workers)
    labels = [(DOUBLE, i, len(double), len(received)) for i in range(len(double))]
    labels += [(OWN, i, len(own), len(own_ids)) for i in range(len(own))]
    chunks = ((name, Chunk(i, n, total, data)) for (name, i, n, total), data in zip(labels, results, strict=True))
    return PassiveStream(permutation=permutation, chunks=chunks)


def passive_reply(
    key: PsiKey, own_ids: Sequence[str], active_blinded: Sequence[bytes], salt: bytes, *, workers: int | None = None
) -> PassiveReply:
    """:func:`passive_stream` collected into lists."""
    stream = passive_stream(key, own_ids, active_blinded, salt, workers=workers)
    lists: dict[str, list[bytes]] = {DOUBLE: [], OWN: []}
    for name, chunk in stream.chunks:
        lists[name].append(chunk.data)
    return PassiveReply(
        reblinded_active=_as_list(_from_blob(b"".join(lists[DOUBLE]))),
        blinded_own=_as_list(_from_blob(b"".join(lists[OWN]))),
        permutation=stream.permutation,
    )


@dataclass(frozen=True)
class Alignment:
    """The common samples in their agreed order.

    Common index i is active row ``active_rows[i]`` and, for passive party p, position
    ``passive_positions[p][i]`` in the shuffled list p sent.
    """

    active_rows: np.ndarray
    passive_positions: tuple[np.ndarray, ...]

    @property
    def size(self) -> int:
        return len(self.active_rows)


def active_align(
    key: PsiKey,
    reblinded_active: Sequence[Sequence[bytes]],
    blinded_passive: Iterable[Sequence[bytes]],
    *,
    names: Sequence[str] | None = None,
    workers: int | None = None,
    progress: Progress | None = None,
) -> Alignment:
    """Active side of step 3: per passive party p, ``reblinded_active[p]`` and ``blinded_passive[p]`` are
    the two lists of its :class:`PassiveReply`; ``names[p]`` names p in errors; ``progress`` hears of each
    re-blinded chunk. The passive lists are re-blinded one at a time, each as its turn comes; lists passed as an
    iterator (not a sequence) are consumed: a writable S32 array is re-blinded in place, so each received list is
    held once."""
    names = _names(names, len(reblinded_active))
    consumed = not isinstance(blinded_passive, Sequence)

    def doubles() -> Iterator[np.ndarray]:
        for name, points in zip(names, blinded_passive, strict=True):
            values = _points(points)
            in_place = consumed and values.flags.writeable
            try:
                double = key._reblind(values, workers, progress, in_place=in_place)
            except ValueError as exc:
                raise ValueError(f"list sent by {name}: {exc}") from None
            del points, values
            yield double

    return intersect(reblinded_active, doubles(), names=names)


def _names(names: Sequence[str] | None, n: int) -> list[str]:
    return list(names) if names is not None else [f"passive party {p}" for p in range(n)]


def intersect(
    active_double: Sequence[Sequence[bytes]],
    passive_double: Iterable[Sequence[bytes]],
    *,
    names: Sequence[str] | None = None,
) -> Alignment:
    """Intersect double-blinded values across all passive parties.

    ``active_double[p][i]`` is A's row i blinded by A and passive party p; ``passive_double[p][j]`` is the
    j-th value p sent, blinded by p and A. A sample is common when its value matches for every party. Each
    passive list's sorting order is found once (no sorted copy) and A's values are looked up in it by binary search,
    block by block; the common samples get a fresh uniform order from OS entropy (sorting by a value would leak row
    order to a party that can compute it).
    """
    if not active_double or (isinstance(passive_double, Sequence) and len(active_double) != len(passive_double)):
        raise ValueError(
            f"need one active and one passive list per passive party, got {len(active_double)} and "
            f"{len(passive_double) if isinstance(passive_double, Sequence) else 'more'}"
        )
    names = _names(names, len(active_double))
    n_active = len(active_double[0])
    if any(len(values) != n_active for values in active_double):
        raise ValueError(f"every active list must have {n_active} values, one per active row")
    return combine(
        match(mine, theirs, name) for name, mine, theirs in zip(names, active_double, passive_double, strict=True)
    )


def match(active_values: Sequence[bytes], passive_values: Sequence[bytes], name: str) -> tuple[np.ndarray, np.ndarray]:
    """One passive party's part of :func:`intersect`: (whether each active row's value is in the party's list, its
    position there). Only these 5 bytes per active row outlive the call, not the party's list."""
    matcher = StreamMatch(_points(active_values), name)
    theirs = _points(passive_values)
    _require_unique(theirs, f"values sent by {name}")  # a whole list is refused for any repeat, matched or not
    for start in range(0, len(theirs), _BLOCK):  # a block at a time: temporaries stay a few MB
        matcher.add(theirs[start : start + _BLOCK])
    return matcher.result()


class StreamMatch:
    """:func:`match` for a passive list that arrives in chunks, none of which is kept: each value is looked up among
    ours (sorted once) as it comes. A value of ours matched twice (the party sent it twice) is a ValueError naming
    both positions; repeats among values that match nothing of ours change nothing and are not looked for."""

    def __init__(self, active_values: np.ndarray, name: str) -> None:
        self._mine, self._name = active_values, name
        # The sort order stays int64: searchsorted would copy an int32 sorter to int64 on every call (80 MB at 10M)
        self._order = _require_unique(active_values, f"active values for {name}")
        self.common = np.zeros(len(active_values), dtype=bool)
        self.positions = np.zeros(len(active_values), dtype=np.int32)  # lists of up to 2^31 values
        self._seen = 0

    def add(self, values: np.ndarray) -> None:
        start, self._seen = self._seen, self._seen + len(values)
        if not len(self._mine):
            return
        rows = self._order[np.minimum(np.searchsorted(self._mine, values, sorter=self._order), len(self._mine) - 1)]
        hit = self._mine[rows] == values
        rows, at = rows[hit], start + np.flatnonzero(hit)
        twice = self.common[rows]
        if twice.any():
            first = int(np.flatnonzero(twice)[0])
            earlier = int(self.positions[rows[first]])
            raise ValueError(f"duplicate values sent by {self._name} at rows {earlier} and {int(at[first])}")
        unique, counts = np.unique(rows, return_counts=True)
        if (counts > 1).any():
            row = unique[np.flatnonzero(counts > 1)[0]]
            first, second = (int(a) for a in at[rows == row][:2])
            raise ValueError(f"duplicate values sent by {self._name} at rows {first} and {second}")
        self.common[rows] = True
        self.positions[rows] = at

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        return self.common, self.positions


class RangeMatch:
    """:class:`StreamMatch` for lists too long to hold: our values wait on disk cut into value ranges
    (spill.Ranges, tagged with their rows), the party's are cut alike as they arrive (tagged with their positions),
    and :meth:`result` matches range by range: a range of ours sorted (a few MB), the same range of theirs looked up
    in it. Only the 5 bytes per own row of the result are kept in memory. The same refusals as StreamMatch's, once
    the whole list came: a value of ours repeated, or one of ours sent twice (naming both positions)."""

    def __init__(self, mine: spill.Ranges, n_active: int, name: str, directory: str | None = None) -> None:
        self._mine, self._n, self._name = mine, n_active, name
        self._theirs = spill.Ranges(mine.count, mine.width, directory)
        self._seen = 0

    def add(self, values: np.ndarray) -> None:
        start, self._seen = self._seen, self._seen + len(values)
        self._theirs.add(np.arange(start, self._seen, dtype=np.int32), values)

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(whether each of our rows is in the party's list, its position there); the party's values are removed
        from disk, whatever happens."""
        common = np.zeros(self._n, dtype=bool)
        positions = np.zeros(self._n, dtype=np.int32)
        try:
            for r in range(self._mine.count):
                rows, mine = self._mine.part(r)
                at, theirs = self._theirs.part(r)
                if not len(mine):
                    continue
                order = np.argsort(mine)
                mine, rows = mine[order], rows[order]
                repeats = np.flatnonzero(mine[1:] == mine[:-1])
                if repeats.size:
                    first, second = sorted(int(row) for row in rows[repeats[0] : repeats[0] + 2])
                    raise ValueError(f"duplicate active values for {self._name} at rows {first} and {second}")
                found = np.minimum(np.searchsorted(mine, theirs), len(mine) - 1)
                hit = mine[found] == theirs
                matched, at = rows[found[hit]], at[hit]
                unique, counts = np.unique(matched, return_counts=True)  # a row's value lies in one range only
                if (counts > 1).any():
                    first, second = np.sort(at[matched == unique[np.flatnonzero(counts > 1)[0]]])[:2]
                    raise ValueError(f"duplicate values sent by {self._name} at rows {first} and {second}")
                common[matched], positions[matched] = True, at
        finally:
            self._theirs.close()
        return common, positions

    def close(self) -> None:
        """Remove the party's values from disk (result does too); idempotent."""
        self._theirs.close()


def combine(matches: Iterable[tuple[np.ndarray, np.ndarray]]) -> Alignment:
    """The samples common to every passive party's :func:`match`, in a fresh uniform order."""
    common: np.ndarray | None = None
    found: list[np.ndarray] = []
    for matched, positions in matches:
        common = matched if common is None else common & matched
        found.append(positions)
    if common is None:
        raise ValueError("need one match per passive party, got none")
    rows = entropy.os_entropy().shuffled(_nonzero(common))  # in the memory of the rows alone
    return Alignment(active_rows=rows, passive_positions=tuple(positions[rows] for positions in found))


def _nonzero(mask: np.ndarray) -> np.ndarray:
    """np.flatnonzero as int32 (rows below 2^31), a block at a time: 4 B a row, not 8 (36 MB less at 9M rows)."""
    out, filled = np.empty(np.count_nonzero(mask), dtype=np.int32), 0
    for start in range(0, len(mask), _POSITIONS_BLOCK):
        found = start + np.flatnonzero(mask[start : start + _POSITIONS_BLOCK])
        out[filled : filled + len(found)], filled = found, filled + len(found)
    return out


# The one refusal of a bad position list. It names no position: which positions are padding or name one row
# twice depends on the passive party's secret order (an OPRF list's), and no refusal may read that out.
BAD_POSITIONS = "positions: they do not name distinct IDs of the list this party sent"


def rows_from_positions(
    positions: Sequence[int] | np.ndarray, permutation: np.ndarray | spill.Column, *, consume: bool = False
) -> np.ndarray:
    """Passive side of step 4: own row of each common index, from positions into the list it sent (``permutation``:
    the row of each value sent, in memory or on disk (an OPRF sender's, spill.Column: read a block at a time); -1 for
    an OPRF list's padding). Positions out of range or repeated, naming padding, or two naming one row are all refused
    alike (:data:`BAD_POSITIONS`): an honest active party sends none. With ``consume``, an int64 array of positions
    becomes the rows (overwritten a block at a time: no second array of 8 B a position, 72 MB at 9M)."""
    positions = np.asarray(positions, dtype=np.int64)
    if positions.ndim != 1 or (positions.size and (positions.min() < 0 or positions.max() >= len(permutation))):
        raise ValueError(BAD_POSITIONS)
    rows = positions if consume and positions.flags.writeable else np.empty(len(positions), dtype=np.int64)
    if isinstance(permutation, np.ndarray):
        for start in range(0, len(positions), _BLOCK):
            rows[start : start + _BLOCK] = permutation[positions[start : start + _BLOCK]]
    else:
        _rows_by_block(positions, permutation, rows)
    if rows.size and rows.min() < 0:
        raise ValueError(BAD_POSITIONS)
    seen = np.zeros(int(rows.max()) + 1 if rows.size else 0, dtype=bool)  # a byte per row, not a sorted copy
    seen[rows] = True
    if np.count_nonzero(seen) != len(rows):  # repeated positions repeat their row too
        raise ValueError(BAD_POSITIONS)
    return rows


_MAPPED = np.int64(1 << 40)  # a row stands in rows as row - 2^40 until every block is read: below any position


def _rows_by_block(positions: np.ndarray, order: spill.Column, rows: np.ndarray) -> None:
    """:func:`rows_from_positions` against an order on disk, read once, a block at a time: each block maps the
    positions that fall in it (``rows`` may be ``positions`` itself: a row already mapped is negative, so no later
    block takes it for a position)."""
    if rows is not positions:
        rows[:] = positions
    for start, block in order.blocks():
        stop = start + len(block)
        for a in range(0, len(rows), _POSITIONS_BLOCK):
            part = rows[a : a + _POSITIONS_BLOCK]  # a view: mapped in place
            at = np.flatnonzero((part >= start) & (part < stop))
            part[at] = block[part[at] - start] - _MAPPED
    rows += _MAPPED
