"""OPRF private set intersection by OT extension: KKRT16's batched OPRF (Kolesnikov, Kumaresan, Rosulek, Trieu,
CCS 2016) made secure against a deviating receiver by Orru, Orsini and Scholl's consistency check (OOS17: "Actively
secure 1-out-of-N OT extension with application to private set intersection", CT-RSA 2017); protocol.md,
"Alignment". The active party A is the OPRF receiver, each passive party P a sender; the curve work is 640 base
OTs per exchange, whatever the set sizes, and the rest is AES, blake2b and bit-matrix work over numpy arrays.

1. A hashes its ids (blake2b under the session salt) into ``m = bins(n_A)`` bins by cuckoo hashing with 3 hash
   functions under a hash key it draws (redrawn, before anything is sent, until every id has a bin of its own),
   and opens the base OTs: ``hello = (salt, hash key, m, S = aG)``.
2. P draws, from its OS entropy, the code seed, its secret choice bits ``s`` and its secret challenge seed, and
   answers the base OTs (Chou-Orlandi in ristretto255): ``R_i = b_i G + s_i S``. The seed expands (AES-CTR) to the
   generator G (96 x 640 bits) of the linear code ``C(w) = w G``; an id's word w is the first 96 bits of h(x).
3. A streams ``U`` in chunks of rows: ``u_j = T0_j ^ T1_j ^ C(w_j)`` for its m bins (w random for an empty bin),
   then CHECKS pad rows of random words w*_c, where ``T0, T1`` are the transposed AES-CTR streams of its base-OT
   keys; its OPRF output for bin j is ``H(j, T0_j)``.
4. P computes ``q_j = Ts_j ^ (u_j & s) = T0_j ^ (C(w_j) & s)`` and, for each own id y and each of its (distinct)
   bins j, ``H(j, q_j ^ (C(y) & s))``: equal to A's output iff ``C(y) = C(w_j)``. It also adds each q_j into the
   checks its challenge bits select (and pad row c into check c). Its 3 n_P values are made but not sent.
5. The check. Only once U is complete does P reveal the challenge seed: bit c of bin j's 8 AES-CTR bytes says
   whether check c holds bin j. A answers, per check, ``w~_c = XOR w_j ^ w*_c`` and ``t~_c = XOR T0_j ^ T0*_c``
   (regenerating T0 from its keys). P accepts iff ``XOR q_j ^ q*_c = t~_c ^ (C(w~_c) & s)`` for every c, which
   holds for an honest U by linearity; on any mismatch it sends no value and the exchange is void.
6. P sends exactly ``3 n_P`` values (a duplicate bin's value is random padding) in a secret random order, keeping
   which row each position is; A intersects (psi.intersect) and sends each P its positions (PsiFinish).

The check, as OOS17's own implementation runs it (libOTe's OOS extension: s pad rows, s checks with random bit
challenges): each check the XOR of a random subset of rows, repeated mu times, each masked by one extra pad row so
that the answers say nothing of A's words; no GF(2^k) multiplication as in KOS15's single combination, hence mu
checks rather than one. A row u_j = T0 ^ T1 ^ C(w) ^ e with e not a codeword moves check c by
``e & s`` whenever c holds j (probability 1/2 each): A passes only by guessing the bits of s its errors touch,
so it learns c bits of s with probability 2^-c, and all of them (F1: review 15) with probability ~2^-640. mu = 64
checks: a fixed e that A cannot make consistent survives all with probability 2^-64 (>= 40 + a margin).
The code must keep a value of an id A did not code hidden even after such guesses: C(y) ^ C(w) is a nonzero
codeword, so P's value hides ``(C(y) ^ C(w)) & s`` behind at least d unknown bits of s, d the minimum distance.
OOS17 asks d >= kappa (its implementation: BCH [511, 76, 171]); ours is a random [640, 96] code from P's seed:
Pr[d < 154] <= 2^96 * sum_{i<154} C(640, i) / 2^640 = 2^-40.4 (union bound over the 2^96 words; typically d is
near 180, d < 170 w.p. <= 2^-15), so after A guessed c bits (passing w.p. 2^-c) >= 154 - c unknown bits of s
remain: >= 138 for the c <= 16 the default psi_owner_budget allows (10M bins: about 78k exchanges of 128). A
[512, 96] code gave only d >= 100 (review 17, F1).

What each side learns: A, which of its ids are common (and, per P, which positions of P's list match), and
nothing if its U fails the check; P, nothing from U (each column is masked by an AES stream P cannot compute for
the bits it did not choose; the answers are masked by the pad rows) but the bin count m.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from pysodium import (
    crypto_core_ristretto255_add,
    crypto_core_ristretto255_scalar_random,
    crypto_core_ristretto255_sub,
    crypto_scalarmult_ristretto255,
    crypto_scalarmult_ristretto255_base,
)
from threadpoolctl import threadpool_limits

from vflsec.services.crypto import entropy, psi, spill
from vflsec.services.crypto.curve import POINT_BYTES
from vflsec.services.crypto.psi import _require_strings

CODE_BITS = 640  # the code's length: the base OTs, the columns of T0, T1, U; 5 AES blocks a row
CODE_BYTES = CODE_BITS // 8
WORD_BITS = 96  # the code's dimension: w = the first 96 bits of h(x)
WORD_BYTES = WORD_BITS // 8
CHECKS = 64  # mu: consistency checks (bit challenges), each masked by one pad row appended to U
HASHES = 3  # cuckoo hash functions
BIN_FACTOR = 1.27  # m = 1.27 n (+ BIN_FLOOR, rounded up to BIN_ALIGN): below 3-way cuckoo's 0.918 load threshold
BIN_FLOOR = 256
BIN_ALIGN = 128  # whole AES blocks per column chunk and whole bytes per transposed row
VALUE_BYTES = 16  # an OPRF output: >= 40 + log2(n_A) + log2(3 n_P) bits
KEY_BYTES = 16  # AES-128 code, hash and base-OT stream keys
ROWS_PER_CHUNK = 32_768  # U rows per message: 2 MB
VALUES_PER_CHUNK = 131_072  # OPRF values per message: 2 MB
_BLOCK = 65_536  # ids hashed or coded at once: a few MB of temporaries, whatever the set size
_CHECK_BLOCK = 4_096  # rows per GF(2) product in accumulate: 8 MB of float32 bits
RANGE_BINS = 8 * ROWS_PER_CHUNK  # bins per file of P's slots on disk: about 12 MB of slots in memory at a time
_BIN = np.dtype([("item", "<i4"), ("word", np.uint8, (WORD_BYTES,))])  # a bin of A's table on disk
_SLOT = np.dtype([("bin", "<i4"), ("row", "<i4"), ("word", np.uint8, (WORD_BYTES,))])  # an (ID, bin) slot of P's
CUCKOO_ROUNDS = 1000
CUCKOO_TRIES = 16
_PERSON = b"vflsec-kkrt-v1"
_random = entropy.os_entropy().bytes  # a party's randomness is its own: OS entropy, never a seed


@dataclass(frozen=True)
class Hello:
    """A's first message: the exchange's public parameters."""

    session_id: str
    salt: bytes
    hash_key: bytes  # keys the cuckoo hash functions
    bins: int  # m
    base_point: bytes  # S = aG


def bins(n: int) -> int:
    """The cuckoo table's size for ``n`` ids."""
    return -(-(math.ceil(BIN_FACTOR * n) + BIN_FLOOR) // BIN_ALIGN) * BIN_ALIGN


# --- hashing ids: h(x), the code C(x), the cuckoo bins h_1..h_3(x) ---
def item_hashes(ids: Sequence[str] | np.ndarray, salt: bytes) -> np.ndarray:
    """h(x) = blake2b(utf-8 id, key = salt), 16 bytes per id: an (n, 16) uint8 array; an id that is not a string
    is a ValueError naming its row."""
    if not isinstance(salt, bytes) or not 1 <= len(salt) <= 64:
        raise ValueError("salt must be 1 to 64 bytes shared by both parties")
    _require_strings(ids)
    blake = functools.partial(hashlib.blake2b, digest_size=16, key=salt, person=_PERSON)
    out = np.empty((len(ids), 16), dtype=np.uint8)
    for a in range(0, len(ids), _BLOCK):
        digests = b"".join([blake(x.encode("utf-8")).digest() for x in ids[a : a + _BLOCK]])
        out[a : a + _BLOCK] = np.frombuffer(digests, dtype=np.uint8).reshape(-1, 16)
    return out


def hash_column(ids: Sequence[str] | np.ndarray, salt: bytes, directory: str | None = None) -> spill.Column:
    """:func:`item_hashes` on disk (a spill.Column of S16, in ``directory``: the system's temporary one by default),
    made and written a block at a time: h(x) is never whole in memory (16 bytes per id, 160 MB at 10M)."""
    _require_strings(ids)  # a bad id named by its row in the whole list, not in its block
    column = spill.Column(np.dtype("S16"), directory)
    try:
        for a in range(0, len(ids), _BLOCK):
            column.add(item_hashes(ids[a : a + _BLOCK], salt).view("S16").reshape(-1))
    except BaseException:
        column.close()
        raise
    return column


Hashes = np.ndarray | spill.Column  # h(x) of a party's ids: (n, 16) uint8 in memory, or S16 on disk (hash_column)


def _hash_blocks(hashed: Hashes) -> Iterator[tuple[int, np.ndarray]]:
    """(start, h(x) of ids start.. as (k, 16) uint8), a block of _BLOCK ids at a time, in row order."""
    for start, block in spill.blocks(hashed, _BLOCK):
        yield start, block.view(np.uint8).reshape(-1, 16)


def _ecb(key: bytes, blocks: np.ndarray) -> np.ndarray:
    encryptor = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    return np.frombuffer(encryptor.update(np.ascontiguousarray(blocks).tobytes()), dtype=np.uint8)


def _tweaked(hashed: np.ndarray, count: int) -> np.ndarray:
    """(n, count, 16): h(x) with its last byte XORed with 0..count-1."""
    blocks = np.repeat(hashed[:, None, :], count, axis=1)
    blocks[:, :, 15] ^= np.arange(count, dtype=np.uint8)
    return blocks


def _ctr(key: bytes, nbytes: int) -> np.ndarray:
    return np.frombuffer(Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor().update(bytes(nbytes)), np.uint8)


class LinearCode:
    """C(w) = w G over GF(2), G a WORD_BITS x CODE_BITS generator matrix (rows packed MSB first) expanded by
    AES-CTR from P's seed. Encoding XORs one precomputed codeword per byte of w: tables[t][b] is the sum of the
    rows 8t..8t+7 of G that b's bits select."""

    def __init__(self, seed: bytes) -> None:
        if not isinstance(seed, bytes) or len(seed) != KEY_BYTES:
            raise ValueError(f"the code seed must be {KEY_BYTES} bytes")
        self.generator = _ctr(seed, WORD_BITS * CODE_BYTES).reshape(WORD_BITS, CODE_BYTES)
        bits = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1)  # (256, 8): byte b's bits, MSB first
        g = self.generator.view(np.uint64).reshape(WORD_BYTES, 8, CODE_BYTES // 8)
        self._tables = np.zeros((WORD_BYTES, 256, CODE_BYTES // 8), dtype=np.uint64)
        for k in range(8):
            self._tables ^= np.where(bits[None, :, k, None].astype(bool), g[:, None, k, :], np.uint64(0))

    def encode(self, words: np.ndarray) -> np.ndarray:
        """(n, WORD_BYTES) uint8 words -> (n, CODE_BYTES) uint8 codewords, in blocks."""
        out = np.empty((len(words), CODE_BYTES // 8), dtype=np.uint64)
        for a in range(0, len(words), _BLOCK):
            w = words[a : a + _BLOCK]
            acc = self._tables[0][w[:, 0]]
            for t in range(1, WORD_BYTES):
                acc ^= self._tables[t][w[:, t]]
            out[a : a + _BLOCK] = acc
        return out.view(np.uint8).reshape(len(words), CODE_BYTES)


@functools.lru_cache(maxsize=4)
def linear_code(seed: bytes) -> LinearCode:
    return LinearCode(seed)


def words_of(hashed: np.ndarray) -> np.ndarray:
    """An id's word w, the code's input: the first WORD_BYTES of h(x)."""
    return np.ascontiguousarray(hashed[:, :WORD_BYTES])


# --- the consistency check (OOS17) ---
class Challenge:
    """Check c's challenge bit for bin j: bit c of bytes 8j..8j+7 of AES-CTR under the seed, made in bin order."""

    def __init__(self, seed: bytes) -> None:
        self._stream = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()

    def next(self, count: int) -> np.ndarray:
        """The next ``count`` bins' challenge bits: (count, CHECKS) uint8 0/1."""
        data = np.frombuffer(self._stream.update(bytes(count * CHECKS // 8)), dtype=np.uint8)
        return np.unpackbits(data.reshape(count, CHECKS // 8), axis=1)


def accumulate(bits: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """For each check c, the XOR of the rows whose challenge bit c is set: (CHECKS, width) uint8. A GF(2) matrix
    product bits^T rows: an exact float32 product of 0/1 matrices (counts < 2^24) taken mod 2, in row blocks."""
    out = np.zeros((CHECKS, rows.shape[1] * 8), dtype=np.uint8)
    # One BLAS thread: idle OpenBLAS threads spin between products, taking the core the other work (or the other
    # party, on a shared machine) needs; measured, 4-5 CPU-s of spin per 1M exchange and no wall-time gain.
    with threadpool_limits(1, user_api="blas"):
        for a in range(0, len(rows), _CHECK_BLOCK):
            x = bits[a : a + _CHECK_BLOCK].astype(np.float32)
            r = np.unpackbits(rows[a : a + _CHECK_BLOCK], axis=1).astype(np.float32)
            out ^= (x.T @ r).astype(np.int64).astype(np.uint8) & 1
    return np.packbits(out, axis=1)


def bins_of(hash_key: bytes, hashed: np.ndarray, m: int) -> np.ndarray:
    """h_1..h_3(x) in [0, m): three 64-bit words of AES_hash_key(h(x) ^ i), i = 0, 1, reduced mod m; (n, 3) int32
    (m < 2^31: any list a party's caps accept)."""
    out = np.empty((len(hashed), HASHES), dtype=np.int32)
    for a in range(0, len(hashed), _BLOCK):
        words = _ecb(hash_key, _tweaked(hashed[a : a + _BLOCK], 2)).view(np.uint64).reshape(-1, 4)[:, :HASHES]
        out[a : a + _BLOCK] = (words % np.uint64(m)).astype(np.int32)
    return out


class CuckooFailure(ValueError):
    """Insertion did not settle: the caller redraws the hash key."""


def cuckoo(candidates: np.ndarray, m: int, rounds: int = CUCKOO_ROUNDS) -> np.ndarray:
    """bin -> item (-1: empty) placing every item in one of its candidate bins (``candidates``: the (n, 3) bins of
    each item), one item per bin. Vectorised in rounds: every homeless item writes itself into its current choice
    (one writer per bin wins), evicting the occupant; losers and the evicted move on to their next hash function.
    Items come in blocks of _BLOCK, each when few of the last remain homeless: a round's temporaries stay a few MB
    whatever n."""
    n = len(candidates)

    def choice_of(items: np.ndarray) -> np.ndarray:
        return candidates[items, choice[items]]

    table = np.full(m, -1, dtype=np.int32)  # int32 throughout: 4 bytes a bin and a homeless item, 1 a choice
    choice = np.zeros(n, dtype=np.int8)
    homeless, coming, idle = np.empty(0, dtype=np.int32), 0, 0
    while True:
        if coming < n and len(homeless) < _BLOCK // 8:
            homeless = np.concatenate([homeless, np.arange(coming, min(coming + _BLOCK, n), dtype=np.int32)])
            coming, idle = min(coming + _BLOCK, n), 0
        if not homeless.size:
            return table
        if idle >= rounds:
            raise CuckooFailure(f"cuckoo hashing of {n} ids into {m} bins did not settle in {rounds} rounds")
        target = choice_of(homeless)
        occupants = table[target]
        table[target] = homeless
        won = table[target] == homeless
        evicted = np.unique(occupants[occupants >= 0])
        evicted = evicted[table[choice_of(evicted)] != evicted]
        homeless = np.concatenate([homeless[~won], evicted])
        choice[homeless] = (choice[homeless] + 1) % HASHES
        idle += 1


def place(hashed: Hashes, m: int) -> tuple[bytes, np.ndarray]:
    """(hash key, bin -> item) for A's ids: a fresh key from OS entropy until insertion succeeds. Each id's three
    bins are made once per key, from h(x) read a block at a time (12 bytes per id: h(x), 16, is not held)."""
    candidates = np.empty((len(hashed), HASHES), dtype=np.int32)
    for _ in range(CUCKOO_TRIES):
        hash_key = _random(KEY_BYTES)
        for start, block in _hash_blocks(hashed):
            candidates[start : start + len(block)] = bins_of(hash_key, block, m)
        try:
            return hash_key, cuckoo(candidates, m)
        except CuckooFailure:
            continue
    raise CuckooFailure(f"cuckoo hashing of {len(hashed)} ids into {m} bins failed {CUCKOO_TRIES} times")


# --- bit matrices ---
_M1, _M2, _M3 = np.uint64(0x00AA00AA00AA00AA), np.uint64(0x0000CCCC0000CCCC), np.uint64(0x00000000F0F0F0F0)
_S7, _S14, _S28 = np.uint64(7), np.uint64(14), np.uint64(28)


def transpose(bits: np.ndarray) -> np.ndarray:
    """Transpose a bit matrix of R rows (R a multiple of 8) of 8C bits each, packed MSB first as an (R, C) uint8
    array: the (8C, R/8) uint8 array of its columns. Each 8x8 bit block is one 64-bit word, transposed by three
    delta swaps (Hacker's Delight, transpose8), all blocks at once."""
    r, c = bits.shape
    blocks = bits.reshape(r // 8, 8, c).transpose(0, 2, 1)[:, :, ::-1]  # (rg, cb, 8 rows): row 0 the top byte
    x = np.ascontiguousarray(blocks).view(np.uint64)
    t = (x ^ (x >> _S7)) & _M1
    x = x ^ t ^ (t << _S7)
    t = (x ^ (x >> _S14)) & _M2
    x = x ^ t ^ (t << _S14)
    t = (x ^ (x >> _S28)) & _M3
    x = x ^ t ^ (t << _S28)
    out = x.view(np.uint8).reshape(r // 8, c, 8)[:, :, ::-1]  # (rg, cb, bit k of the byte column)
    return np.ascontiguousarray(out.transpose(1, 2, 0)).reshape(8 * c, r // 8)


def output_hash(index: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """H(j, row) = blake2b(j as 8 bytes || CODE_BYTES-byte row), 16 bytes: an S16 array (correlation robust)."""
    blob = np.empty((len(rows), 8 + CODE_BYTES), dtype=np.uint8)
    blob[:, :8] = index.astype("<u8")[:, None].view(np.uint8)
    blob[:, 8:] = rows
    data, width, size = blob.tobytes(), 8 + CODE_BYTES, VALUE_BYTES
    blake = functools.partial(hashlib.blake2b, digest_size=size, person=_PERSON)
    out = b"".join([blake(data[i : i + width]).digest() for i in range(0, len(data), width)])
    return np.frombuffer(out, dtype=f"S{VALUE_BYTES}") if out else np.empty(0, dtype=f"S{VALUE_BYTES}")


# --- base OTs: Chou-Orlandi in ristretto255, A the sender ---
def check_point(value: bytes, what: str) -> bytes:
    """``value`` if it is the canonical encoding of a ristretto255 element other than the identity, else a
    ValueError naming ``what``."""
    problem = f"{what} is not a canonical point of ristretto255 (the encoding of an element other than the identity)"
    if not isinstance(value, bytes) or len(value) != POINT_BYTES or value[-1] & 0x80:
        raise ValueError(problem)
    try:  # libsodium decodes (refusing non-canonical encodings) and refuses the identity's product
        crypto_scalarmult_ristretto255(_ONE, value)
    except ValueError:
        raise ValueError(problem) from None
    return value


_ONE = (1).to_bytes(32, "little")


def _ot_key(i: int, s: bytes, r: bytes, shared: bytes) -> bytes:
    return hashlib.blake2b(i.to_bytes(4, "little") + s + r + shared, digest_size=KEY_BYTES, person=_PERSON).digest()


class BaseOtSender:
    """A's side: ``point`` (S = aG) goes to P; :meth:`keys` turns P's R_i into both keys of each OT."""

    def __init__(self) -> None:
        self._a = crypto_core_ristretto255_scalar_random()
        self.point = crypto_scalarmult_ristretto255_base(self._a)

    def keys(self, answers: Sequence[bytes]) -> tuple[list[bytes], list[bytes]]:
        if len(answers) != CODE_BITS:
            raise ValueError(f"{len(answers)} base-OT points, not {CODE_BITS}")
        k0, k1 = [], []
        for i, r in enumerate(answers):
            check_point(r, f"base-OT point {i}")
            k0.append(_ot_key(i, self.point, r, crypto_scalarmult_ristretto255(self._a, r)))
            if r == self.point:  # R_i - S would be the identity, whose product P knows: both keys would be its
                raise ValueError(f"base-OT point {i} equals S")
            shared = crypto_scalarmult_ristretto255(self._a, crypto_core_ristretto255_sub(r, self.point))
            k1.append(_ot_key(i, self.point, r, shared))
        return k0, k1


class BaseOtReceiver:
    """P's side, with its secret choice bits: ``answers(S)`` are the R_i it sends, ``keys`` k_{s_i}."""

    def __init__(self) -> None:
        self.choices = np.frombuffer(_random(CODE_BYTES), dtype=np.uint8)  # s, packed MSB first
        self.keys: list[bytes] = []

    def answer(self, point: bytes) -> list[bytes]:
        check_point(point, "the base-OT point S")
        bits = np.unpackbits(self.choices)
        answers = []
        for i, bit in enumerate(bits):
            b = crypto_core_ristretto255_scalar_random()
            r = crypto_scalarmult_ristretto255_base(b)
            if bit:
                r = crypto_core_ristretto255_add(r, point)
            answers.append(r)
            self.keys.append(_ot_key(i, point, r, crypto_scalarmult_ristretto255(b, point)))
        return answers


# --- the extension ---
class _Columns:
    """Column i of a bit matrix of m rows: AES-128-CTR under key i, produced chunk by chunk in row order."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        self._streams = [Cipher(algorithms.AES(k), modes.CTR(bytes(16))).encryptor() for k in keys]

    def rows(self, count: int) -> np.ndarray:
        """The next ``count`` rows (a multiple of 8), transposed: (count, CODE_BYTES) uint8."""
        zeros = bytes(count // 8)
        columns = np.frombuffer(b"".join([s.update(zeros) for s in self._streams]), dtype=np.uint8)
        return transpose(columns.reshape(CODE_BITS, count // 8))


def _spans(m: int) -> Iterator[tuple[int, int]]:
    """U's row chunks: the m bins, then the CHECKS pad rows."""
    total = m + CHECKS
    return ((a, min(a + ROWS_PER_CHUNK, total)) for a in range(0, total, ROWS_PER_CHUNK))


def row_chunks(m: int) -> int:
    """U's messages for m bins (its pad rows included)."""
    return -(-(m + CHECKS) // ROWS_PER_CHUNK)


def _fold(acc: np.ndarray, a: int, m: int, x: Challenge, rows: np.ndarray) -> None:
    """Add U-ordered rows a.. (bins by their challenge bits, pad row m + c to check c) into ``acc``."""
    bins = max(0, min(len(rows), m - a))
    if bins:
        acc ^= accumulate(x.next(bins), rows[:bins])
    pads = np.arange(max(a, m), a + len(rows)) - m
    acc[pads] ^= rows[bins:]


@dataclass(frozen=True)
class Proof:
    """A's answer to the challenge, per check c: w~_c and t~_c, the XORs of w_j and T0_j over check c's bins and
    its pad row."""

    words: np.ndarray  # (CHECKS, WORD_BYTES) uint8
    rows: np.ndarray  # (CHECKS, CODE_BYTES) uint8

    def to_bytes(self) -> tuple[bytes, bytes]:
        return self.words.tobytes(), self.rows.tobytes()

    @classmethod
    def from_bytes(cls, words: bytes, rows: bytes) -> Proof:
        """A ValueError naming the field of the wrong size."""
        for name, data, width in (("words", words, WORD_BYTES), ("rows", rows, CODE_BYTES)):
            if len(data) != CHECKS * width:
                raise ValueError(
                    f"the proof's {name} hold {len(data)} bytes, not {CHECKS * width} ({CHECKS} x {width})"
                )
        return cls(
            np.frombuffer(words, np.uint8).reshape(CHECKS, WORD_BYTES),
            np.frombuffer(rows, np.uint8).reshape(CHECKS, CODE_BYTES),
        )


class CheckFailed(ValueError):
    """U did not pass the consistency check: not every row was a codeword of the announced code."""


class Bins:
    """A's cuckoo table, on disk for its exchanges: per bin, the row of the id it holds (-1: empty) and that id's
    word, in bin order (16 bytes a bin, in ``spill_dir``: the system's temporary directory by default), read back a
    U chunk at a time, so neither h(x) nor the table is kept while A exchanges. Made from h(x) read in row order (in
    memory or on disk: hash_column) and cut by bin range on disk, so no id's word is looked up at random; the table
    inverted (4 bytes per id) is the only per-id array. :meth:`close` removes it."""

    def __init__(self, table: np.ndarray, hashed: Hashes, spill_dir: str | None = None) -> None:
        self.m, self.n = len(table), len(hashed)
        self._file = spill.Parts(1, _BIN, spill_dir)
        try:
            where = np.full(self.n, -1, dtype=np.int32)  # each id's bin: the table inverted, 4 bytes per id
            for a in range(0, self.m, _BLOCK):
                items = table[a : a + _BLOCK]
                full = np.flatnonzero(items >= 0)
                where[items[full]] = a + full
            if self.n and where.min() < 0:
                raise ValueError("an id without a bin: the table does not place every id")
            # Each id's (bin, row, word) to the file of its bin range, in row order, then each range in bin order
            with spill.Parts(-(-self.m // RANGE_BINS), _SLOT, spill_dir) as placed:
                for start, block in _hash_blocks(hashed):
                    slots = np.empty(len(block), dtype=_SLOT)
                    slots["bin"], slots["word"] = where[start : start + len(block)], words_of(block)
                    slots["row"] = np.arange(start, start + len(block), dtype=np.int32)
                    placed.append(slots["bin"] // RANGE_BINS, slots)
                del where
                for r in range(placed.count):
                    slots, a = placed.records(r), r * RANGE_BINS
                    records = np.zeros(min(self.m, a + RANGE_BINS) - a, dtype=_BIN)
                    records["item"] = -1
                    records["item"][slots["bin"] - a], records["word"][slots["bin"] - a] = slots["row"], slots["word"]
                    self._file.append(np.zeros(len(records), dtype=np.int8), records)
        except BaseException:
            self._file.close()
            raise

    def read(self, a: int, b: int) -> np.ndarray:
        """Bins a..b (clipped to the table)."""
        return self._file.records(0, a, max(0, min(b, self.m) - a))

    def close(self) -> None:
        """Remove the file; idempotent."""
        self._file.close()


@dataclass
class Receiver:
    """A's OPRF state for one passive party: ``u_chunks`` yields U's row chunks (bytes) and puts each own ID's
    output (H(j, T0_j) of its bin j, tagged with its row) on disk by value range (spill.Ranges, in ``spill_dir``:
    the system's temporary directory by default), where :meth:`match` finds the party's values; :meth:`proof`
    answers P's challenge; :meth:`close` removes the outputs. Its bins (one :class:`Bins` for every party) are
    read from disk a chunk at a time."""

    bins: Bins
    k0: list[bytes]
    k1: list[bytes]
    code_seed: bytes
    spill_dir: str | None = None

    def __post_init__(self) -> None:
        self.outputs = spill.Ranges(spill.Ranges.count_for(self.bins.n), VALUE_BYTES, self.spill_dir)
        # The random w of empty bins and pad rows: AES under a key of our own, so the proof makes them again
        # rather than keeping 12 bytes per bin
        self._pad_key = _random(KEY_BYTES)

    def _words(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """(the items of bins a..b, w of U rows a..b): an id's word for a bin that holds one, else a pseudo-random
        word."""
        counters = np.zeros((b - a, 16), dtype=np.uint8)
        counters[:, :8] = np.arange(a, b, dtype="<u8")[:, None].view(np.uint8)
        words = _ecb(self._pad_key, counters).reshape(b - a, 16)[:, :WORD_BYTES].copy()
        records = self.bins.read(a, b)
        full = np.flatnonzero(records["item"] >= 0)
        words[full] = records["word"][full]
        return records["item"], words

    def u_chunks(self) -> Iterator[bytes]:
        code, m = linear_code(self.code_seed), self.bins.m
        t0, t1 = _Columns(self.k0), _Columns(self.k1)
        for a, b in _spans(m):
            rows0 = t0.rows(b - a)
            items, words = self._words(a, b)
            u = rows0 ^ t1.rows(b - a) ^ code.encode(words)
            full = np.flatnonzero(items >= 0)
            self.outputs.add(items[full], output_hash(a + full, rows0[full]))
            yield u.tobytes()

    def proof(self, challenge: bytes) -> Proof:
        """The answer to P's challenge seed: T0 is made again from our keys, chunk by chunk, not kept."""
        if len(challenge) != KEY_BYTES:
            raise ValueError(f"the challenge holds {len(challenge)} bytes, not {KEY_BYTES}")
        m, t0, x = self.bins.m, _Columns(self.k0), Challenge(challenge)
        acc = np.zeros((CHECKS, CODE_BYTES + WORD_BYTES), dtype=np.uint8)
        for a, b in _spans(m):
            _fold(acc, a, m, x, np.concatenate([t0.rows(b - a), self._words(a, b)[1]], axis=1))
        return Proof(acc[:, CODE_BYTES:].copy(), acc[:, :CODE_BYTES].copy())

    def match(self, name: str) -> psi.RangeMatch:
        """The party's values, as they come, matched against our outputs range by range (after every U chunk)."""
        return psi.RangeMatch(self.outputs, self.bins.n, name, self.spill_dir)

    def values(self) -> np.ndarray:
        """Each of A's ids' output, in row order, in memory (small lists: tests, the pipes bench)."""
        out = np.zeros(self.bins.n, dtype=f"S{VALUE_BYTES}")
        for r in range(self.outputs.count):
            rows, values = self.outputs.part(r)
            out[rows] = values
        return out

    def close(self) -> None:
        """Remove our outputs from disk; idempotent."""
        self.outputs.close()


class Sender:
    """P's OPRF state: :meth:`add` takes U's row chunks in order; :meth:`verify` checks A's proof against the
    challenge drawn here at the start; only then ``rows`` is the secret row of each value in the order sent (-1:
    padding) and :meth:`value_chunks` the values in that order. Its (ID, bin) slots, with each ID's row and word,
    wait on disk by bin range (services/crypto/spill.py, in ``spill_dir``: the system's temporary directory by
    default) and are read back a range at a time as U reaches it; codes and Q rows exist a chunk at a time, and
    each value goes to disk as it is made, to a bucket of a secret shuffle. :meth:`close` removes both; h(y) is not
    kept."""

    def __init__(
        self,
        own_hashed: Hashes,
        hash_key: bytes,
        m: int,
        ot: BaseOtReceiver,
        code_seed: bytes,
        spill_dir: str | None = None,
    ) -> None:
        n = len(own_hashed)
        self._m, self._s, self._code = m, ot.choices, linear_code(code_seed)
        self._columns = _Columns(ot.keys)
        self.challenge = _random(KEY_BYTES)  # secret until U is complete: A's rows are fixed before it learns it
        self._x = Challenge(self.challenge)
        self._acc = np.zeros((CHECKS, CODE_BYTES), dtype=np.uint8)  # per check, the XOR of its q_j
        self._verified = False
        self.total = HASHES * n
        # Each (ID, bin) slot with the ID's row and word, on disk in the file of its bin range (RANGE_BINS bins:
        # whole U chunks), read back a range at a time as U reaches it. A bin that two hash functions of the same ID
        # give counts once; its second slot is random padding.
        self._slots = spill.Parts(-(-m // RANGE_BINS), _SLOT, spill_dir)
        try:  # removed at once if anything fails here, not left to the collector
            filled = 0
            for a, block in _hash_blocks(own_hashed):
                candidates = bins_of(hash_key, block, m)
                distinct = np.ones(candidates.shape, dtype=bool)
                distinct[:, 1] = candidates[:, 1] != candidates[:, 0]
                distinct[:, 2] = (candidates[:, 2] != candidates[:, 0]) & (candidates[:, 2] != candidates[:, 1])
                slots = np.empty(candidates.shape, dtype=_SLOT)
                slots["bin"] = candidates
                slots["row"] = np.arange(a, a + len(candidates), dtype=np.int32)[:, None]
                slots["word"] = words_of(block)[:, None, :]
                self._slots.append(candidates[distinct] // RANGE_BINS, slots[distinct])
                filled += int(distinct.sum())
            self._shuffle = spill.Shuffle(self.total, VALUE_BYTES, spill_dir)
        except BaseException:
            self._slots.close()
            raise
        self._range, self._part = np.empty(0, dtype=_SLOT), 0  # the slots of the bin range U is in, in bin order
        pads = self.total - filled
        padding = np.frombuffer(_random(pads * VALUE_BYTES), f"S{VALUE_BYTES}")
        self._shuffle.add(np.full(pads, -1, dtype=np.int32), padding)
        self._next, self._done = 0, 0

    def add(self, chunk: bytes) -> None:
        """U's next row chunk; a ValueError if it has not the expected size."""
        a, total = self._next, self._m + CHECKS
        b = min(a + ROWS_PER_CHUNK, total)
        if a >= total:
            raise ValueError(f"a U chunk beyond the {row_chunks(self._m)} announced")
        if len(chunk) != (b - a) * CODE_BYTES:
            raise ValueError(
                f"U chunk {a // ROWS_PER_CHUNK} holds {len(chunk)} bytes, not {(b - a) * CODE_BYTES} ({b - a} rows of "
                f"{CODE_BYTES} bytes)"
            )
        u = np.frombuffer(chunk, dtype=np.uint8).reshape(b - a, CODE_BYTES)
        q = self._columns.rows(b - a) ^ (u & self._s)
        _fold(self._acc, a, self._m, self._x, q)
        slots = self._slots_below(b)
        bins_here = slots["bin"].astype(np.int64)
        masked = self._code.encode(np.ascontiguousarray(slots["word"])) & self._s  # C(y) & s
        self._shuffle.add(slots["row"], output_hash(bins_here, q[bins_here - a] ^ masked))
        self._next = b
        if self.complete:  # every value is made: the slots are no longer needed
            self._range = np.empty(0, dtype=_SLOT)
            self._slots.close()

    def _slots_below(self, b: int) -> np.ndarray:
        """The slots not yet taken of bins below ``b``, in bin order: the next bin ranges read from disk as needed."""
        taken = []
        while True:
            end = self._done + int(np.searchsorted(self._range["bin"][self._done :], b))
            taken.append(self._range[self._done : end])
            self._done = end
            if end < len(self._range) or self._part >= self._slots.count or self._part * RANGE_BINS >= b:
                return taken[0] if len(taken) == 1 else np.concatenate(taken)
            records = self._slots.records(self._part)
            self._range, self._part, self._done = records[np.argsort(records["bin"], kind="stable")], self._part + 1, 0

    @property
    def complete(self) -> bool:
        return self._next >= self._m + CHECKS

    @property
    def chunks(self) -> int:
        """U chunks taken so far."""
        return -(-self._next // ROWS_PER_CHUNK)

    def verify(self, proof: Proof) -> None:
        """CheckFailed unless, for every check c, the XOR of its q_j is t~_c ^ (C(w~_c) & s): true for an honest
        U; for a row off the code, each check holding it fails unless A guessed the bits of s it touches."""
        if not self.complete:
            raise ValueError(f"the proof came after {self.chunks} of {row_chunks(self._m)} U chunks")
        expected = proof.rows ^ (self._code.encode(proof.words) & self._s)
        if not np.array_equal(expected, self._acc):
            raise CheckFailed("U failed the consistency check: its rows are not all codewords of the announced code")
        self._verified = True

    @property
    def rows(self) -> np.ndarray:
        """Our row of each value in the order sent (-1: padding): the secret order, sealed on first use (one pass
        over the spilled values, a bucket at a time)."""
        if not self._verified:
            raise ValueError("no value before U passed the consistency check")
        return self._shuffle.seal()

    def value_chunks(self) -> Iterator[tuple[int, int, bytes]]:
        """(index, chunks, data): our values in the order sent, VALUES_PER_CHUNK at a time, read from disk as they
        go; one empty chunk for an empty list."""
        rows = self.rows  # the order sealed first; a ValueError before U passed the check
        n = max(1, -(-len(rows) // VALUES_PER_CHUNK))
        chunks = self._shuffle.chunks(VALUES_PER_CHUNK)
        for index in range(n):
            yield index, n, next(chunks, b"")

    def values(self) -> np.ndarray:
        """The whole list in the order sent, in memory (small lists: tests, the pipes bench)."""
        data = b"".join(data for _, _, data in self.value_chunks())
        return np.frombuffer(data, dtype=f"S{VALUE_BYTES}") if data else np.empty(0, dtype=f"S{VALUE_BYTES}")

    def close(self) -> None:
        """Remove the spilled slots and values; idempotent."""
        self._slots.close()
        self._shuffle.close()


