"""Masked ct x pt products against 0/1 one-hot columns, spread over a process pool (a tree node's at a passive party),
and the encryptions of a node's class indicators the same way (at the active party).

TenSEAL holds the GIL in ``mul_plain`` (400 products: 0.69 s in one thread, 0.68 s in two), so only processes put a
second core to work. :class:`ProductPool` splits a node's feature groups (masking.masked_column_products: R columns of
the one-hot matrix per group) into contiguous ranges, a few per worker; each worker makes its range's masked
products exactly as the calling process would, its masks drawn from its own OS entropy, and returns them serialized
with their mask sums, which the caller concatenates in group order: the same products, layout and count as in
process (only the masks differ, as they do between any two runs).

What a task carries: where the node's encrypted indicators wait (their bytes as they came off the wire, written once
per node into a shared-memory segment: pickled into every task they cost the caller seconds a tree at 285k rows),
the epoch's public context (bytes), the node's bin codes (smallest unsigned type) and the group range. A worker
keeps the last context it parsed and the last node's parsed indicators (by a token per call), so each is read and
parsed once per worker however many of its ranges it runs: a worker holds at most one node's indicators. The
segment is the caller's (mode 0600), unlinked when the node's tasks are done, and by multiprocessing's resource
tracker if the caller is killed (its workers then exit too, psi.exit_with: while one lives, the tracker waits).
The pool (forkserver, never fork: the party is a multi-threaded gRPC server) lives as long as its owner's session
and is shut down when the session closes, or after any error (a later node starts a fresh one). What it would not
pay for (:meth:`ProductPool.pays`: one worker, a plain backend, a node of few products) the caller makes in process.
"""

from __future__ import annotations

import itertools
import math
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from vflsec.services.crypto import entropy, he, masking, psi

WORKERS_ENV = "VFLSEC_PRODUCT_WORKERS"
# A node whose products (ct x pt, ~1.7 ms each with the plaintext's encoding) are fewer than this is made in the
# calling process: the tasks' round trip (pickling the indicators, parsing them in each worker) would cost more than
# the second core saves.
MIN_POOLED_PRODUCTS = 64
RANGES_PER_WORKER = 4  # a few ranges each, so that a worker slowed by another job's load does not hold the node up
# A node's encrypted class indicators (the active party's [[Y]], 6-7 ms a ciphertext) with fewer ciphertexts than this
# are encrypted in the calling process.
MIN_POOLED_ENCRYPTIONS = 8


class BadIndicators(ValueError):
    """The encrypted indicators do not parse under the node's keys (the sender's fault)."""


def default_workers() -> int:
    """Processes for a node's products: ``$VFLSEC_PRODUCT_WORKERS`` if set, else the CPUs this process may run on."""
    return psi.default_workers(WORKERS_ENV)


def one_hot_columns(codes: np.ndarray, starts: np.ndarray) -> Callable[[int, int], np.ndarray]:
    """columns(lo, hi): columns lo..hi-1 of the (n, starts[-1]) 0/1 matrix with row i's 1 of feature f at column
    starts[f] + codes[i, f] (the features' one-hot blocks side by side); a few columns at a time, never all at once."""

    def columns(lo: int, hi: int) -> np.ndarray:
        at = np.arange(lo, hi)
        feature = np.searchsorted(starts, at, side="right") - 1
        return (codes[:, feature] == at - starts[feature]).astype(np.float64)

    return columns


def parse(backend: he.Backend, wire: he.WireMatrix) -> he.EncryptedMatrix:
    """he.matrix_from_wire of a node's encrypted indicators and the form of a product operand (he.Backend.encrypt;
    before anything is multiplied: a refusal on the bytes alone, never on this party's bins), its refusal as
    BadIndicators."""
    try:
        received = he.matrix_from_wire(backend, wire)
        backend.check_form(received.ciphertexts, product=False, form=he.OPERAND)
        return received
    except ValueError as exc:
        raise BadIndicators(str(exc)) from None  # pickled back from a worker: its message, not a chained traceback


@dataclass(frozen=True, slots=True)
class _Shared:
    """A node's indicators in shared memory: the he.WireMatrix's layout, the segment, each ciphertext's length."""

    shape: tuple[int, int]
    replicas: int
    rows_per_ct: int
    segment: str
    lengths: tuple[int, ...]

    @classmethod
    def write(cls, wire: he.WireMatrix) -> tuple[_Shared, shared_memory.SharedMemory]:
        lengths = tuple(len(blob) for blob in wire.ciphertexts)
        segment = shared_memory.SharedMemory(create=True, size=max(1, sum(lengths)))
        try:
            at = 0
            for blob in wire.ciphertexts:
                segment.buf[at : at + len(blob)] = blob
                at += len(blob)
        except BaseException:
            _release(segment)
            raise
        return cls(tuple(wire.shape), wire.replicas, wire.rows_per_ct, segment.name, lengths), segment

    def read(self) -> he.WireMatrix:
        segment = _attach(self.segment)
        try:
            ends = np.cumsum((0, *self.lengths))
            blobs = [bytes(segment.buf[a:b]) for a, b in itertools.pairwise(ends)]
        finally:
            segment.close()
        return he.WireMatrix(self.shape, self.replicas, self.rows_per_ct, blobs)


def _attach(name: str) -> shared_memory.SharedMemory:
    """The caller's segment, for reading. Python 3.11 and 3.12 register every attachment with the resource tracker:
    a forkserver worker's tracker is its caller's, where the segment is registered already, so that changes nothing,
    and only the caller unlinks it (and its tracker, if the caller is killed)."""
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)
    return shared_memory.SharedMemory(name=name)


def _release(segment: shared_memory.SharedMemory) -> None:
    segment.close()
    segment.unlink()


_WORKER: dict[str, Any] = {}  # in a worker: its last public context and backend, its last node's token and indicators


Span = tuple[int, int, int, int]  # a task's first and last column (whole products' groups), the fold and the parts


def _backend(name: str, context: bytes) -> he.Backend:
    """In a worker: the public keys of ``context``, parsed once however many tasks bring them."""
    if _WORKER.get("context") != context:
        _WORKER.update(context=context, backend=he.open_public(name, context), token=None, delta=None)
    return _WORKER["backend"]


def _encrypted(name: str, context: bytes, vectors: np.ndarray, form: he.Form) -> list[bytes]:
    """In a worker: each slot vector encrypted in ``form`` as it goes on the wire, by this process's SEAL (its
    randomness from this process's OS entropy, as the calling process's would be)."""
    backend = _backend(name, context)
    return [backend.encrypt(v, form=form, serialized=True) for v in vectors]


def _pooled(
    name: str, context: bytes, token: int, shared: _Shared, codes: np.ndarray, starts: np.ndarray, span: Span
) -> tuple[list[bytes], np.ndarray]:
    """In a worker: the masked products of columns lo..hi-1 (whole feature groups) of the one-hot matrix, serialized,
    and their mask sums (``span``: lo, hi, fold), the masks drawn from this process's OS entropy."""
    _backend(name, context)
    if _WORKER["token"] != token:
        _WORKER.update(token=None, delta=None)  # the last node's indicators go before this one's are parsed
        _WORKER.update(token=token, delta=parse(_WORKER["backend"], shared.read()))
    backend, (lo, hi, fold, parts), columns = _WORKER["backend"], span, one_hot_columns(codes, starts)
    products, mask_sums = masking.masked_column_products(
        backend,
        _WORKER["delta"],
        lambda a, b: columns(lo + a, lo + b),
        hi - lo,
        entropy.os_entropy(),
        fold=fold,
        parts=parts,
        serialized=True,
    )
    return products, mask_sums


class ProductPool:
    """One session's masked one-hot products (a passive party's) or one growing's encrypted class indicators (the
    active party's); its worker processes start at the first node that pays for them."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = default_workers() if workers is None else workers
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self._calls = itertools.count()

    def pays(self, keys: he.Backend, indicators: he.WireMatrix, width: int, parts: int = 1) -> bool:
        """Whether the products of ``width`` one-hot columns against these indicators are worth the pool: more than one
        worker, ciphertexts (CKKS), at least two groups and MIN_POOLED_PRODUCTS products. BadIndicators if their layout
        is not one (nothing is parsed here)."""
        layout = he.MatrixLayout(tuple(int(s) for s in indicators.shape), indicators.replicas, indicators.rows_per_ct)
        try:
            layout.validate(keys.slots, len(indicators.ciphertexts))
        except ValueError as exc:
            raise BadIndicators(str(exc)) from None
        products = math.ceil(math.ceil(width / layout.replicas) / parts)
        enough = products > 1 and products * layout.n_chunks >= MIN_POOLED_PRODUCTS
        return self.workers > 1 and keys.name != "plain" and enough

    def products(
        self,
        keys: he.Backend,
        indicators: he.WireMatrix,
        codes: np.ndarray,
        starts: np.ndarray,
        fold: int,
        parts: int = 1,
    ) -> tuple[list[bytes], np.ndarray]:
        """Masked [[indicators ⊙ one-hot columns]] (masking.masked_column_products, ``fold``, ``parts``), serialized,
        and their mask sums, made by the workers (after :meth:`pays`). BadIndicators if the indicators do not parse
        under ``keys``; any error shuts the pool down."""
        width, replicas = int(starts[-1]), indicators.replicas
        codes = codes.astype(np.min_scalar_type(int(codes.max(initial=0))))  # 1 byte a code for up to 256 bins
        step = replicas * parts  # the columns one product carries: a task's range is whole products
        units = math.ceil(width / step)
        cuts = [step * int(u) for u in np.linspace(0, units, min(units, RANGES_PER_WORKER * self.workers) + 1)]
        spans = [(lo, min(hi, width), fold, parts) for lo, hi in itertools.pairwise(cuts) if lo < hi]
        token, context = next(self._calls), keys.public_context()
        shared, segment = _Shared.write(indicators)
        try:
            done = self._map(_pooled, [(keys.name, context, token, shared, codes, starts, s) for s in spans])
        finally:
            _release(segment)  # after close(): no task still reads it
        return [blob for blobs, _ in done for blob in blobs], np.concatenate([sums for _, sums in done])

    def encrypt_to_wire(self, keys: he.Backend, M: np.ndarray, replicas: int, *, form: he.Form) -> he.WireMatrix:
        """he.encrypt_to_wire of M (the same layout and form), its ciphertexts encrypted by the workers a range each;
        in process where that would not pay (one worker, a plain backend, fewer than MIN_POOLED_ENCRYPTIONS
        ciphertexts). Any error shuts the pool down."""
        layout = he.MatrixLayout.for_matrix(np.shape(M), replicas, keys.slots)
        if self.workers < 2 or keys.name == "plain" or layout.n_chunks < MIN_POOLED_ENCRYPTIONS:
            return he.encrypt_to_wire(keys, M, replicas, form=form)
        vectors = layout.pack(M)
        cuts = np.linspace(0, len(vectors), min(len(vectors), RANGES_PER_WORKER * self.workers) + 1).astype(int)
        context = keys.public_context()
        done = self._map(_encrypted, [(keys.name, context, vectors[a:b], form) for a, b in itertools.pairwise(cuts)])
        blobs = [blob for ranged in done for blob in ranged]
        return he.WireMatrix(layout.shape, layout.replicas, layout.rows_per_ct, blobs)

    def _map(self, task: Callable[..., Any], calls: list[tuple]) -> list[Any]:
        """``task(*args)`` for each of ``calls`` in the workers, their results in order; on any error the tasks not
        yet started are cancelled and the pool shut down (the next call starts fresh workers)."""
        futures: list[Future] = []
        try:
            pool = self._executor()
            futures = [pool.submit(task, *args) for args in calls]
            return [future.result() for future in futures]
        except BaseException:
            for future in futures:
                future.cancel()
            self.close()
            raise

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = psi.pool(self.workers)  # workers that exit with this process
            return self._pool

    def __enter__(self) -> ProductPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Shut the workers down (a range under way finishes first); a later call starts fresh ones."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
