"""ECDH private set intersection over X25519 for sample alignment (protocol.md, "Alignment").

Each party hashes its ids to 32 bytes (SHA-256, domain-separated, salted per session) and blinds them with a
secret X25519 scalar. Scalar multiplication commutes, so ``a·(p·H(x)) == p·(a·H(x))``: double-blinded values
match exactly for common ids while raw ids and single-blinded values reveal nothing.

Protocol between the active party A and each passive party P (one A key, one key per P):

1. A sends ``key_a.blind_ids(ids_a, salt)`` to every P.
2. P answers with :func:`passive_reply`: A's list blinded again (same order) and its own blinded ids in a
   secret random order (P keeps the permutation).
3. A calls :func:`active_align`, which blinds P's lists a second time and intersects across all passive
   parties. The common samples are put in a uniformly random order, so positions reveal nothing about either
   party's row order; A sends each P its ``Alignment.passive_positions[p]``.
4. P maps common index -> own row with :func:`rows_from_positions`.

X25519 in ``cryptography`` holds the GIL (measured: two threads are no faster than one), so blinding is a
plain loop; about 30-40 µs per id.
"""

from __future__ import annotations

import hashlib
import random
import secrets
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

POINT_BYTES = 32
# Separates these hashes from any other SHA-256 of the same ids; bump the version if the encoding changes.
_DOMAIN = b"vflsec/psi/x25519/v1\x00"
# Both the common order and P's shuffle hide row orders, so they come from the OS CSPRNG.
_SECURE_RANDOM = random.SystemRandom()


def new_salt() -> bytes:
    """A fresh per-session salt; it is public to both sides and only separates sessions."""
    return secrets.token_bytes(32)


def hash_ids(ids: Sequence[str], salt: bytes) -> list[bytes]:
    """Hash ids to 32-byte X25519 inputs; the salt is length-prefixed so (salt, id) splits are unambiguous."""
    if not salt:
        raise ValueError("salt must be non-empty bytes shared by both parties")
    prefix = hashlib.sha256(_DOMAIN + len(salt).to_bytes(4, "big") + salt)
    hashed = []
    for sample_id in ids:
        h = prefix.copy()
        h.update(sample_id.encode("utf-8"))
        hashed.append(h.digest())
    return hashed


class PsiKey:
    """A party's secret blinding scalar, fresh and random for each session."""

    __slots__ = ("_key",)

    def __init__(self) -> None:
        self._key = X25519PrivateKey.generate()

    def blind_ids(self, ids: Sequence[str], salt: bytes) -> list[bytes]:
        """``k·H(id)`` for each id, in order. Duplicate ids are rejected: rows must be addressable by id."""
        _require_unique(ids, "ids")
        return self._multiply(hash_ids(ids, salt))

    def reblind(self, points: Sequence[bytes]) -> list[bytes]:
        """``k·P`` for each point received from the other party, in order."""
        for index, point in enumerate(points):
            if not isinstance(point, bytes) or len(point) != POINT_BYTES:
                got = f"{len(point)} bytes" if isinstance(point, bytes) else type(point).__name__
                raise ValueError(f"point at index {index} must be {POINT_BYTES} bytes, got {got}")
        return self._multiply(points)

    def _multiply(self, points: Sequence[bytes]) -> list[bytes]:
        exchange = self._key.exchange
        from_bytes = X25519PublicKey.from_public_bytes
        out = []
        for index, point in enumerate(points):
            try:
                out.append(exchange(from_bytes(point)))
            except ValueError as error:
                # cryptography refuses an all-zero result, i.e. a low-order input point.
                raise ValueError(f"point at index {index} is a low-order X25519 point") from error
        return out


@dataclass(frozen=True)
class PassiveReply:
    """What a passive party sends back, plus the permutation it keeps secret."""

    reblinded_active: list[bytes]  # A's blinded ids, blinded again by P, in A's order
    blinded_own: list[bytes]  # P's blinded ids in shuffled order
    permutation: np.ndarray  # secret: blinded_own[j] is P's row permutation[j]


def passive_reply(key: PsiKey, own_ids: Sequence[str], active_blinded: Sequence[bytes], salt: bytes) -> PassiveReply:
    """Passive side of step 2: reblind A's list and blind own ids in a secret random order."""
    permutation = list(range(len(own_ids)))
    _SECURE_RANDOM.shuffle(permutation)
    return PassiveReply(
        reblinded_active=key.reblind(active_blinded),
        blinded_own=key.blind_ids([own_ids[row] for row in permutation], salt),
        permutation=np.asarray(permutation, dtype=np.int64),
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
    key: PsiKey, reblinded_active: Sequence[Sequence[bytes]], blinded_passive: Sequence[Sequence[bytes]]
) -> Alignment:
    """Active side of step 3: per passive party p, ``reblinded_active[p]`` and ``blinded_passive[p]`` are
    the two lists of its :class:`PassiveReply`."""
    return intersect(reblinded_active, [key.reblind(points) for points in blinded_passive])


def intersect(active_double: Sequence[Sequence[bytes]], passive_double: Sequence[Sequence[bytes]]) -> Alignment:
    """Intersect double-blinded values across all passive parties.

    ``active_double[p][i]`` is A's row i blinded by A and passive party p; ``passive_double[p][j]`` is the
    j-th value p sent, blinded by p and A. A sample is common when its value matches for every party.
    """
    if not active_double or len(active_double) != len(passive_double):
        raise ValueError(
            f"need one active and one passive list per passive party, got {len(active_double)} and "
            f"{len(passive_double)}"
        )
    n_active = len(active_double[0])
    if any(len(values) != n_active for values in active_double):
        raise ValueError(f"every active list must have {n_active} values, one per active row")
    for p, (active_values, passive_values) in enumerate(zip(active_double, passive_double, strict=True)):
        _require_unique(active_values, f"active values for passive party {p}")
        _require_unique(passive_values, f"values sent by passive party {p}")

    position_maps = [{value: j for j, value in enumerate(values)} for values in passive_double]
    common: list[tuple[int, list[int]]] = []
    for row in range(n_active):
        positions: list[int] = []
        for positions_of, values in zip(position_maps, active_double, strict=True):
            position = positions_of.get(values[row])
            if position is None:
                break
            positions.append(position)
        else:
            common.append((row, positions))
    _SECURE_RANDOM.shuffle(common)

    n_passive = len(passive_double)
    rows = np.fromiter((row for row, _ in common), dtype=np.int64, count=len(common))
    table = np.asarray([positions for _, positions in common], dtype=np.int64).reshape(len(common), n_passive)
    return Alignment(active_rows=rows, passive_positions=tuple(table[:, p].copy() for p in range(n_passive)))


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


def _require_unique(values: Sequence[Hashable], what: str) -> None:
    first_row: dict[Hashable, int] = {}
    for row, value in enumerate(values):
        previous = first_row.setdefault(value, row)
        if previous != row:
            # Rows only, never the value: the message may travel in an RPC error.
            raise ValueError(f"duplicate {what} at rows {previous} and {row}")
