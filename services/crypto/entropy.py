"""Random draws that no configuration can replay.

Two sources, one small numpy-style interface (the methods release steps and masks use):

* :func:`os_entropy` — every draw reads fresh bytes from ``os.urandom`` (the kernel CSPRNG). Release noise
  (gaussian, privee, the parameter chain's secret draws) comes from here: no seed in any config reaches it,
  and nothing is checkpointed that could replay it after a restart.
* :func:`keyed_stream` — an AES-256-CTR keystream under a party's own secret key (itself from os.urandom) and
  a per-use nonce. Gradient masks come from here: a party that repeats the same training step after a crash
  rebuilds the same masks (the coordinator then answers from its cache instead of
  decrypting new products), while without the key the stream is indistinguishable from random.
* :func:`tag` — HMAC-SHA256 of the same kind of context, under a key of its own (derived from the party's secret
  for the purpose: :func:`derive_key`): what a party shows to say "the same masks" without showing them (a repeat
  of a step's block sums).
* :func:`derive_key` — HKDF-SHA256 (RFC 5869) of a party's long-term secret for one named purpose: keys of
  distinct purposes are independent, and none reveals the secret or another (masquerade's Q and bit key).

Floats take the top 53 bits of a 64-bit word (uniform on [0, 1)); normals use Box-Muller. Both are exact in
distribution and vectorised, so a step's masks cost about as much as numpy's PCG64 (see ``bench he``).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
from collections.abc import Callable

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = [
    "KEY_BYTES",
    "NONCE_BYTES",
    "CryptoRandom",
    "derive_key",
    "keyed_stream",
    "new_key",
    "new_nonce",
    "os_entropy",
    "tag",
]

KEY_BYTES = 32
NONCE_BYTES = 16
_TWO_POW_53 = float(2**53)


def new_key() -> bytes:
    return os.urandom(KEY_BYTES)


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def derive_key(secret: bytes, purpose: str) -> bytes:
    """A 32-byte key for ``purpose`` (HKDF's info: name the use and any shape it depends on) from ``secret``."""
    if len(secret) != KEY_BYTES:
        raise ValueError(f"a long-term secret must be {KEY_BYTES} bytes, got {len(secret)}")
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=purpose.encode()).derive(secret)


class CryptoRandom:
    """``random``/``uniform``/``normal``/``standard_normal``/``laplace``/``permutation`` over a byte source.

    There is deliberately no seed and no state to save: a draw this class does not implement fails loudly
    rather than falling back to a non-cryptographic generator.
    """

    def __init__(self, source: Callable[[int], bytes]) -> None:
        self._source = source

    def bytes(self, length: int) -> bytes:
        return self._source(length)

    def _words(self, n: int) -> np.ndarray:
        return np.frombuffer(self._source(8 * n), dtype=np.uint64)

    @staticmethod
    def _shape(size: int | tuple[int, ...] | None, *params: object) -> tuple[int, ...]:
        if size is None:
            return np.broadcast(*params).shape if params else ()
        return (size,) if isinstance(size, int | np.integer) else tuple(int(s) for s in size)

    @staticmethod
    def _out(values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | float:
        return float(values.reshape(())) if shape == () else values.reshape(shape)

    def _unit(self, shape: tuple[int, ...]) -> np.ndarray:
        n = math.prod(shape)
        return (self._words(n) >> np.uint64(11)).astype(np.float64) / _TWO_POW_53

    def random(self, size: int | tuple[int, ...] | None = None) -> np.ndarray | float:
        shape = self._shape(size)
        return self._out(self._unit(shape), shape)

    def uniform(self, low=0.0, high=1.0, size: int | tuple[int, ...] | None = None) -> np.ndarray | float:
        shape = self._shape(size, low, high)
        low, high = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
        return self._out(low + (high - low) * self._unit(shape).reshape(shape), shape)

    def _gaussian(self, shape: tuple[int, ...]) -> np.ndarray:
        n = math.prod(shape)
        pairs = (n + 1) // 2
        u = self._unit((2, pairs))
        radius = np.sqrt(-2.0 * np.log1p(-u[:pairs]))  # 1 - u in (0, 1]: the log is finite
        angle = 2.0 * np.pi * u[pairs:]
        return np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:n].reshape(shape)

    def standard_normal(self, size: int | tuple[int, ...] | None = None) -> np.ndarray | float:
        shape = self._shape(size)
        return self._out(self._gaussian(shape), shape)

    def normal(self, loc=0.0, scale=1.0, size: int | tuple[int, ...] | None = None) -> np.ndarray | float:
        shape = self._shape(size, loc, scale)
        return self._out(np.asarray(loc) + np.asarray(scale) * self._gaussian(shape), shape)

    def laplace(self, loc=0.0, scale=1.0, size: int | tuple[int, ...] | None = None) -> np.ndarray | float:
        shape = self._shape(size, loc, scale)
        u = self._unit(shape).reshape(shape) - 0.5
        return self._out(np.asarray(loc) - np.asarray(scale) * np.sign(u) * np.log1p(-2.0 * np.abs(u)), shape)

    def permutation(self, n: int) -> np.ndarray:
        """A uniform permutation of range(n): sort 64-bit random keys (a tie has probability < n²/2^65)."""
        return np.argsort(self._words(n), kind="stable")

    def shuffled(self, values: np.ndarray) -> np.ndarray:
        """Non-negative integers below 2^31 in a uniform random order, as int64, in one array of their size (no
        permutation or key array beside it: 72 MB, not about 250, for 9M values). Each value gets random high bits
        above its own and one in-place sort orders them; values whose random bits tie are put in a fresh uniform
        order of their own, so every order stays equally likely (random keys, ties broken at random)."""
        values = np.asarray(values)
        if not len(values):
            return np.empty(0, dtype=np.int64)
        if values.min() < 0 or values.max() >= 2**31:
            raise ValueError("shuffled takes integers in [0, 2^31)")
        low = max(1, int(values.max()).bit_length())
        keyed, shift, block = np.empty(len(values), dtype=np.uint64), np.uint64(low), 1 << 20
        for a in range(0, len(values), block):  # in blocks: no whole-size temporary
            part = values[a : a + block]
            keyed[a : a + len(part)] = self._words(len(part)) >> shift << shift | part.astype(np.uint64)
        keyed.sort()
        for start, stop in _tied_runs(keyed, low):  # about n^2 / 2^(65 - low) pairs: a few at 9M values
            keyed[start:stop] = keyed[start:stop][self.permutation(stop - start)]
        keyed &= np.uint64((1 << low) - 1)
        return keyed.view(np.int64)


def _tied_runs(keyed: np.ndarray, low: int, block: int = 1 << 20) -> list[tuple[int, int]]:
    """[start, stop) of each run of sorted ``keyed`` whose bits above the ``low`` ones are equal, found a block at a
    time."""
    shift, ties = np.uint64(low), []
    for a in range(0, len(keyed) - 1, block):
        high = keyed[a : a + block + 1] >> shift
        ties.append(a + np.flatnonzero(high[1:] == high[:-1]))
    runs: list[tuple[int, int]] = []
    for i in np.concatenate(ties).tolist() if ties else []:
        if runs and runs[-1][1] == i + 1:
            runs[-1] = (runs[-1][0], i + 2)
        else:
            runs.append((i, i + 2))
    return runs


def os_entropy() -> CryptoRandom:
    """Fresh OS entropy on every draw (release noise, secret parameter-chain draws)."""
    return CryptoRandom(os.urandom)


def keyed_stream(key: bytes, *context: bytes | int | str) -> CryptoRandom:
    """AES-256-CTR keystream under ``key``; the nonce is a digest of ``context`` (e.g. session, step, input)."""
    if len(key) != KEY_BYTES:
        raise ValueError(f"stream key must be {KEY_BYTES} bytes, got {len(key)}")
    nonce = hashlib.sha256(_encoded(context)).digest()[:16]
    encryptor = Cipher(algorithms.AES(key), modes.CTR(nonce)).encryptor()
    return CryptoRandom(lambda length: encryptor.update(bytes(length)))


def tag(key: bytes, *context: bytes | int | str) -> bytes:
    """HMAC-SHA256 under ``key`` of ``context`` (32 bytes): equal for equal (key, context), unpredictable without
    the key. Give it a key of its own (:func:`derive_key`), not one that also keys a :func:`keyed_stream`."""
    if len(key) != KEY_BYTES:
        raise ValueError(f"tag key must be {KEY_BYTES} bytes, got {len(key)}")
    return hmac.new(key, _encoded(context), hashlib.sha256).digest()


def _encoded(context: tuple[bytes | int | str, ...]) -> bytes:
    """The parts, each length-prefixed (so that no two contexts encode alike)."""
    parts = (part if isinstance(part, bytes) else str(part).encode() for part in context)
    return b"".join(len(data).to_bytes(8, "little") + data for data in parts)
