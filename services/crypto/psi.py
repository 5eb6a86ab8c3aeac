"""ECDH private set intersection in the prime-order group of edwards25519 (protocol.md, "Alignment").

Each party hashes its ids into the prime-order subgroup with RFC 9380's random-oracle suite
``edwards25519_XMD:SHA-512_ELL2_RO_`` (salted per session) and blinds them with a secret scalar k uniform in
[1, L). Scalar multiplication commutes, so ``a·(p·H(x)) == p·(a·H(x))``: double-blinded values match exactly for
common ids, while under DDH in the prime-order group raw ids' blinded values look like random group elements.
Every received point must be a canonical, non-identity point of the prime-order subgroup before it is used: no
small-order component (and no twist) can carry a bit of the id through blinding.

Protocol between the active party A and each passive party P (one A key, one key per P, one exchange per
session, enforced by the parties' engines):

1. A sends ``key_a.blind(ids_a, salt)`` to every P.
2. P answers with :func:`passive_stream` (:func:`passive_reply` collects it): A's list blinded again (same
   order) and its own blinded ids in a secret random order (P keeps the permutation).
3. A calls :func:`active_align`, which blinds P's lists a second time and intersects across all passive
   parties. The common samples are put in a uniformly random order, so positions reveal nothing about either
   party's row order; A sends each P its ``Alignment.passive_positions[p]``.
4. P maps common index -> own row with :func:`rows_from_positions`.

Hashing runs in Python integers with batched inversions, taking each Elligator 2 square root from libsodium's
point decompression (PyNaCl exposes no ristretto255 and no RFC 9380 hash); scalar multiplication and point
validation are libsodium's. All of it holds the GIL, so the work is cut into chunks of up to :data:`CHUNK` ids or
points (the unit of work: pure functions of the scalar, salt and chunk, so they could go to other machines too)
run in a process pool of :func:`default_workers` processes. Lists are S32 numpy arrays (32 bytes per value, no
per-row Python object); they travel between the parties as :class:`Chunk` s of the same size, streamed as the
pool finishes them and checked on arrival by :class:`ChunkReader`. The intersection is a sort and a binary search
over those arrays, not a per-row dict (docs/performance.md, "Alignment").
"""

from __future__ import annotations

import hashlib
import itertools
import math
import multiprocessing
import os
import secrets
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
from nacl.bindings import (
    crypto_core_ed25519_add,
    crypto_core_ed25519_scalar_reduce,
    crypto_scalarmult_ed25519_noclamp,
)
from nacl.exceptions import CryptoError

from vflsec.services.crypto import entropy

POINT_BYTES = 32
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
# RFC 9380 §3.1 tag: application, version, suite. Bump the version if the encoding changes.
SUITE = "edwards25519_XMD:SHA-512_ELL2_RO_"
DST = f"vflsec-psi-v2-with-{SUITE}".encode()
# Ids or points per unit of work: at most CHUNK (a task's pickling is noise next to its ~1 s of curve arithmetic;
# 1M ids make ~120 tasks), and about 4 per worker for shorter lists so no worker waits on a long last one; a list of
# up to MIN_CHUNK is one task, done in the calling process (a pool's start-up would cost more than it saves).
CHUNK = 8192
MIN_CHUNK = 2048
WORKERS_ENV = "VFLSEC_PSI_WORKERS"

# --- RFC 9380 hash_to_curve for edwards25519 (§6.7.1 Elligator 2, §6.8.2 rational map, h_eff = 8) ---
_P = 2**255 - 19
_A = 486662  # curve25519: v² = u³ + A·u² + u; Elligator 2 with Z = 2
_D2 = 2 * (-121665 * pow(121666, -1, _P)) % _P  # 2d of edwards25519: -x² + y² = 1 + d·x²·y²
_LOW_255 = (1 << 255) - 1


def _even_sqrt(a: int) -> int:
    """The even square root of a square ``a`` (p ≡ 5 mod 8); for the module's constants only."""
    root = pow(a, (_P + 3) // 8, _P)
    if root * root % _P != a:
        root = root * pow(2, (_P - 1) // 4, _P) % _P
    assert root * root % _P == a
    return root if root % 2 == 0 else _P - root


_C1 = _even_sqrt(_P - 486664)  # RFC 9380 §6.8.2: x = c1·s/t, sgn0(c1) = 0
_ORDER_4 = bytes(32)  # the point (i, 0), i = √-1 even: (x, y) + (i, 0) = (i·y, i·x)
_MINUS_I = _P - _even_sqrt(_P - 1)  # 1/i


def _edwards_x(y: int) -> int | None:
    """The even x with (x, y) on edwards25519, or None if there is none.

    The square root is libsodium's (decompression, in C; a Python 255-bit ``pow`` made hashing 2x slower). Adding the
    order-4 point (i, 0) to the decompressed point yields (i·y, i·x), so x comes back as the sum's y. libsodium's
    addition requires both points on the curve, not in the subgroup; the RFC 9380 vector test guards this.
    """
    try:
        total = crypto_core_ed25519_add(y.to_bytes(32, "little"), _ORDER_4)
    except CryptoError:  # (y² − 1)/(d·y² + 1) is not a square
        return None
    return _MINUS_I * (int.from_bytes(total, "little") & _LOW_255) % _P


def expand_message_xmd(msg: bytes, dst: bytes, length: int) -> bytes:
    """RFC 9380 §5.3.1 with SHA-512 (b = 64, s = 128 bytes)."""
    if len(dst) > 255 or length > 255 * 64:
        raise ValueError("DST longer than 255 bytes or output too long")
    dst_prime = dst + bytes([len(dst)])
    b0 = hashlib.sha512(bytes(128) + msg + length.to_bytes(2, "big") + b"\x00" + dst_prime).digest()
    blocks = [hashlib.sha512(b0 + b"\x01" + dst_prime).digest()]
    while len(blocks) * 64 < length:
        mixed = (int.from_bytes(b0, "big") ^ int.from_bytes(blocks[-1], "big")).to_bytes(64, "big")
        blocks.append(hashlib.sha512(mixed + bytes([len(blocks) + 1]) + dst_prime).digest())
    return b"".join(blocks)[:length]


def _batch_invert(values: list[int]) -> list[int]:
    """Montgomery's trick: every inverse for one exponentiation. Zero maps to zero (RFC 9380's inv0)."""
    prefix, acc = [], 1
    for v in values:
        prefix.append(acc)
        if v:
            acc = acc * v % _P
    inv = pow(acc, _P - 2, _P)
    out = [0] * len(values)
    for i in range(len(values) - 1, -1, -1):
        if values[i]:
            out[i] = prefix[i] * inv % _P
            inv = inv * values[i] % _P
    return out


Point = tuple[int, int, int, int]  # extended coordinates (X, Y, Z, T), x = X/Z, y = Y/Z, x·y = T/Z
_IDENTITY: Point = (0, 1, 1, 0)


def _map_to_curve(us: list[int]) -> list[Point]:
    """Elligator 2 onto curve25519 (Z = 2), then the rational map onto edwards25519, for many u at once.

    Montgomery s is x1 = -A/(1 + 2u²) if g(x1) = x1³ + A·x1² + x1 is a square, else x2 = -x1 - A; Edwards
    y = (s − 1)/(s + 1), which has an x exactly when g(s) is a square (here -(d+1) is a square), so libsodium's
    decompression decides the branch and gives x up to sign. The sign follows RFC 9380: the Montgomery
    t = c1·s/x has sgn0(t) = 1 in the x1 branch, 0 in the x2 branch. s = -1 or t = 0 maps to the identity.
    """
    x1s = [-_A * inv % _P or _P - _A for inv in _batch_invert([(1 + 2 * u * u) % _P for u in us])]
    candidates = [*x1s, *((-x1 - _A) % _P for x1 in x1s)]
    inv_plus_one = _batch_invert([(s + 1) % _P for s in candidates])
    n, found = len(us), []
    for k in range(n):
        for branch, index in ((1, k), (0, n + k)):
            s = candidates[index]
            y = (s - 1) * inv_plus_one[index] % _P
            x = _edwards_x(y)
            if x is not None:
                found.append((s, x, y, branch, inv_plus_one[index] == 0))
                break
        else:  # unreachable: g(x2) = 2u²·g(x1) is a square when g(x1) is not
            raise AssertionError("Elligator 2 found no point")
    inv_x = _batch_invert([x for _, x, _, _, _ in found])
    points = []
    for (s, x, y, branch, at_infinity), ix in zip(found, inv_x, strict=True):
        if at_infinity or x == 0:
            points.append(_IDENTITY)
            continue
        if (_C1 * s % _P * ix % _P) & 1 != branch:
            x = _P - x
        points.append((x, y, 1, x * y % _P))
    return points


def _add(p: Point, q: Point) -> Point:
    """Complete addition on edwards25519 (a = -1), extended coordinates (Hisil et al. 2008, add-2008-hwcd-3)."""
    x1, y1, z1, t1 = p
    x2, y2, z2, t2 = q
    a = (y1 - x1) * (y2 - x2) % _P
    b = (y1 + x1) * (y2 + x2) % _P
    c = t1 * _D2 % _P * t2 % _P
    d = 2 * z1 * z2 % _P
    e, f, g, h = b - a, d - c, d + c, b + a
    return e * f % _P, g * h % _P, f * g % _P, e * h % _P


def _double(p: Point) -> Point:
    """Doubling on edwards25519 (a = -1), extended coordinates (dbl-2008-hwcd)."""
    x1, y1, z1, _ = p
    a, b, c = x1 * x1 % _P, y1 * y1 % _P, 2 * z1 * z1 % _P
    e = ((x1 + y1) * (x1 + y1) - a - b) % _P
    g = b - a
    f, h = g - c, -a - b
    return e * f % _P, g * h % _P, f * g % _P, e * h % _P


def hash_to_group(messages: Sequence[bytes], dst: bytes = DST) -> list[bytes]:
    """RFC 9380 ``hash_to_curve`` (suite :data:`SUITE`) of each message, as 32-byte edwards25519 encodings."""
    # Chunks keep the intermediate integers of a million-ID list out of memory; inversions stay batched.
    chunk = 4096
    return [point for i in range(0, len(messages), chunk) for point in _hash_chunk(messages[i : i + chunk], dst)]


def _hash_chunk(messages: Sequence[bytes], dst: bytes) -> list[bytes]:
    us: list[int] = []
    for msg in messages:
        uniform = expand_message_xmd(msg, dst, 96)
        us += (int.from_bytes(uniform[:48], "big") % _P, int.from_bytes(uniform[48:], "big") % _P)
    mapped = _map_to_curve(us)
    points = []
    for i in range(0, len(mapped), 2):
        q = _add(mapped[i], mapped[i + 1])
        points.append(_double(_double(_double(q))))  # clear_cofactor, h_eff = 8
    inv_z = _batch_invert([z for _, _, z, _ in points])
    return [
        ((y * iz % _P) | ((x * iz % _P) & 1) << 255).to_bytes(32, "little")
        for (x, y, _, _), iz in zip(points, inv_z, strict=True)
    ]


def _message(sample_id: str, salt: bytes) -> bytes:
    # The salt is length-prefixed so (salt, id) splits are unambiguous.
    return len(salt).to_bytes(4, "big") + salt + sample_id.encode("utf-8")


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
    return hash_to_group([_message(sample_id, salt) for sample_id in ids])


def _require_strings(ids: Sequence[str] | np.ndarray) -> None:
    if isinstance(ids, np.ndarray) and ids.dtype.kind == "U":  # a string array holds nothing else
        return
    for row, sample_id in enumerate(ids):
        if not isinstance(sample_id, str):
            raise ValueError(f"sample id at row {row} is a {type(sample_id).__name__}, not a string")


# --- parallel units of work: pure functions of (scalar, salt, chunk), so any process or machine can run one ---
_DTYPE = np.dtype(f"S{POINT_BYTES}")  # one encoding per row; S32 compares all 32 bytes, trailing zeros included
Task = tuple[Callable[..., bytes], tuple]


def _blind_task(scalar: bytes, salt: bytes, ids: Sequence[str] | np.ndarray, start: int) -> bytes:
    return _multiply_task(scalar, b"".join(hash_to_group([_message(str(i), salt) for i in ids])), start)


def _multiply_task(scalar: bytes, blob: bytes, start: int) -> bytes:
    """``scalar·P`` for each 32-byte point of ``blob``; libsodium refuses any point that is not the canonical
    encoding of a non-identity point of the prime-order subgroup (``crypto_scalarmult_ed25519``'s contract)."""
    out = bytearray(len(blob))
    for i in range(0, len(blob), POINT_BYTES):
        try:
            out[i : i + POINT_BYTES] = crypto_scalarmult_ed25519_noclamp(scalar, blob[i : i + POINT_BYTES])
        except CryptoError:
            raise ValueError(
                f"point at index {start + i // POINT_BYTES} is not a canonical point of the prime-order subgroup "
                "of edwards25519"
            ) from None
    return bytes(out)


def default_workers() -> int:
    """Processes for blinding: ``$VFLSEC_PSI_WORKERS`` if set, else the CPUs this process may run on."""
    configured = os.environ.get(WORKERS_ENV, "").strip()
    if configured:
        if not configured.isdigit() or int(configured) < 1:
            raise ValueError(f"{WORKERS_ENV} must be a positive integer, got {configured!r}")
        return int(configured)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


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
    sent, outlives it; a failed task, or a consumer that stops early, cancels the rest). At most 2 tasks per
    worker are in flight or waiting to be consumed, so memory stays bounded however long the list.
    forkserver, not fork: the parties are multi-threaded gRPC servers, and a fork copies whatever lock another
    thread holds. (Like any forkserver user, a script calling this needs the ``if __name__ == "__main__":``
    guard.)"""
    n = min(workers, n_tasks)
    if n <= 1:
        yield from (fn(*args) for fn, args in tasks)
        return
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    pool = ProcessPoolExecutor(max_workers=n, mp_context=context)
    try:
        pending: deque = deque()
        for fn, args in tasks:
            pending.append(pool.submit(fn, *args))
            if len(pending) >= 2 * n:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


Progress = Callable[[int], None]  # told the number of values of each chunk as it is done


def _collect(results: Iterable[bytes], n: int, progress: Progress | None = None) -> np.ndarray:
    """The chunks' values in one S32 array of ``n``, filled as they come (no list of chunks, no joined copy)."""
    out, filled = np.empty(n, dtype=_DTYPE), 0
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
    """Blinding tasks over ``ids`` (in the given ``order``, if any), made one at a time as the pool takes them: a
    chunk's ids become Python strings only in the worker (an array's slice travels as one buffer)."""
    if order is None:
        return ((_blind_task, (scalar, salt, ids[a:b], a)) for a, b in spans)
    if isinstance(ids, np.ndarray):
        return ((_blind_task, (scalar, salt, ids[order[a:b]], a)) for a, b in spans)
    return ((_blind_task, (scalar, salt, [ids[row] for row in order[a:b]], a)) for a, b in spans)


def _multiply_tasks(scalar: bytes, points: np.ndarray, spans: list[tuple[int, int]]) -> Iterator[Task]:
    return ((_multiply_task, (scalar, points[a:b].tobytes(), a)) for a, b in spans)


def _points(values: Sequence[bytes] | np.ndarray) -> np.ndarray:
    """32-byte values as an S32 array; a value of another length or type is a ValueError with its index."""
    if isinstance(values, np.ndarray) and values.dtype == _DTYPE:
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
    for it. No chunk at all is the empty list."""

    def __init__(self, check_size: Callable[[int], None] | None = None) -> None:
        self._check_size = check_size
        self._points: np.ndarray | None = None
        self._chunks = self._next = self._filled = 0

    def add(self, chunk: Chunk) -> None:
        if self._points is None:
            if chunk.points < 1 or not -(-chunk.points // CHUNK) <= chunk.chunks <= chunk.points:
                raise ValueError(
                    f"chunk {chunk.index} announces {chunk.chunks} chunks for {chunk.points} points: each chunk "
                    f"carries 1 to {CHUNK} points"
                )
            if self._check_size is not None:
                self._check_size(chunk.points)
            self._points, self._chunks = np.empty(chunk.points, dtype=_DTYPE), chunk.chunks
        elif (chunk.chunks, chunk.points) != (self._chunks, len(self._points)):
            raise ValueError(
                f"chunk {chunk.index} announces {chunk.chunks} chunks of {chunk.points} points, the first "
                f"{self._chunks} chunks of {len(self._points)} points"
            )
        if chunk.index != self._next or chunk.index >= self._chunks:
            if chunk.index >= self._chunks:
                problem = f"beyond the {self._chunks} announced"
            elif chunk.index < self._next:
                problem = f"repeated (chunk {self._next} expected)"
            else:
                problem = f"out of order: chunk {self._next} missing"
            raise ValueError(f"chunk {chunk.index} {problem}")
        n, rest = divmod(len(chunk.data), POINT_BYTES)
        if rest or not 1 <= n <= CHUNK:
            raise ValueError(
                f"chunk {chunk.index} holds {len(chunk.data)} bytes, not 1 to {CHUNK} values of {POINT_BYTES} bytes"
            )
        if self._filled + n > len(self._points) or (self._next == self._chunks - 1) != (
            self._filled + n == len(self._points)
        ):
            raise ValueError(
                f"chunk {chunk.index} of {self._chunks} brings the list to {self._filled + n} points, "
                f"{len(self._points)} announced"
            )
        self._points[self._filled : self._filled + n] = _from_blob(chunk.data)
        self._filled += n
        self._next += 1

    def result(self) -> np.ndarray:
        """The whole list; a ValueError if it ended before the announced last chunk."""
        if self._points is None:
            return np.empty(0, dtype=_DTYPE)
        if self._next != self._chunks:
            raise ValueError(f"the list ends after {self._next} of {self._chunks} chunks")
        return self._points


def check_size(
    n: int, own: int, *, max_ids: int = MAX_IDS, max_ratio: float = MAX_RATIO, ratio_floor: int = RATIO_FLOOR
) -> None:
    """Refuse a partner's list of ``n`` ids against our ``own``: a ValueError naming the bound it breaks and the
    smallest setting that would accept it."""
    if n > max_ids:
        raise ValueError(
            f"{n} IDs announced, over this party's cap of {max_ids} ([limits] psi_max_ids; the smallest that "
            f"accepts them is {n})"
        )
    if n > max(max_ratio * own, ratio_floor):
        smallest = math.ceil(n * 100 / max(own, 1)) / 100
        raise ValueError(
            f"{n} IDs announced, over {max_ratio:g} x this party's own {own} IDs ([limits] psi_max_ratio; the "
            f"smallest that accepts them is {smallest:g}; lists up to [limits] psi_ratio_floor = {ratio_floor} "
            "always pass)"
        )


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


class PsiKey:
    """A party's secret blinding scalar, uniform in [1, L) and fresh for each session."""

    __slots__ = ("_scalar",)

    def __init__(self) -> None:
        scalar = bytes(32)
        while scalar == bytes(32):  # reduce(64 random bytes) is uniform mod L up to 2^-256; 0 is redrawn
            scalar = crypto_core_ed25519_scalar_reduce(secrets.token_bytes(64))
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

        Every point must be the canonical encoding of a non-identity point of the prime-order subgroup: no
        small-order component can carry a bit of the id through blinding; k is in [1, L), so a valid point never
        yields the identity.
        """
        return _as_list(self._reblind(_points(points), workers))

    def _reblind(self, points: np.ndarray, workers: int | None, progress: Progress | None = None) -> np.ndarray:
        workers = _workers(workers)
        spans = _spans(len(points), workers)
        results = _stream(_multiply_tasks(self._scalar, points, spans), len(spans), workers)
        return _collect(results, len(points), progress)


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
    key: PsiKey, own_ids: Sequence[str] | np.ndarray, received: Sequence[bytes] | np.ndarray, salt: bytes, *,
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
    re-blinded chunk. The passive lists are re-blinded one at a time, each as its turn comes: a caller that passes
    an iterator holding no other reference frees each received list once it is re-blinded."""
    names = _names(names, len(reblinded_active))

    def doubles() -> Iterator[np.ndarray]:
        for name, points in zip(names, blinded_passive, strict=True):
            try:
                double = key._reblind(_points(points), workers, progress)
            except ValueError as exc:
                raise ValueError(f"list sent by {name}: {exc}") from None
            del points
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
    common = np.ones(n_active, dtype=bool)
    found: list[np.ndarray] = []
    for name, active_values, passive_values in zip(names, active_double, passive_double, strict=True):
        mine, theirs = _points(active_values), _points(passive_values)
        del passive_values
        _require_unique(mine, f"active values for {name}")
        order = _require_unique(theirs, f"values sent by {name}")
        positions = np.zeros(n_active, dtype=np.int64)
        if not len(theirs):
            common[:] = False
        for start in range(0, n_active if len(theirs) else 0, _BLOCK):
            block = mine[start : start + _BLOCK]
            at = order[np.minimum(np.searchsorted(theirs, block, sorter=order), len(theirs) - 1)]
            common[start : start + _BLOCK] &= theirs[at] == block
            positions[start : start + _BLOCK] = at
        found.append(positions)
        del theirs, order
    rows = np.flatnonzero(common)
    rows = rows[entropy.os_entropy().permutation(len(rows))].astype(np.int64)
    return Alignment(active_rows=rows, passive_positions=tuple(positions[rows] for positions in found))


def rows_from_positions(positions: Sequence[int] | np.ndarray, permutation: np.ndarray) -> np.ndarray:
    """Passive side of step 4: own row of each common index, from positions into the list it sent."""
    positions = np.asarray(positions, dtype=np.int64)
    if positions.ndim != 1:
        raise ValueError(f"positions must be one-dimensional, got shape {positions.shape}")
    if positions.size and (positions.min() < 0 or positions.max() >= len(permutation)):
        raise ValueError(f"positions must lie in [0, {len(permutation)})")
    if len(np.unique(positions)) != len(positions):
        raise ValueError("positions must not repeat: each sent value is at most one common sample")
    return permutation[positions]
