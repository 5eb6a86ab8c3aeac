"""How an (n, k) matrix is spread over the slots of ciphertexts (he.py's encrypted matrices), and the choice of R.

Packing (protocol step 5, "many (k, j) blocks per ciphertext"). A logical matrix M (n rows x k columns) with
replication factor R is split into chunks of ``C = rows_per_ct`` rows; ciphertext i holds rows
[i*C, (i+1)*C) flattened row-major (zero-padded for a short last chunk), repeated R times, so slot
``r*C*k + row*k + col`` holds ``M[i*C + row, col]``. The replicas let one element-wise ct x pt product
multiply the residual δ by R different feature columns at once, which is the fast path the protocol notes
recommend over ``CKKSVector.mm``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "ENCRYPT_COST",
    "LR_ENCRYPT_COST",
    "LR_OPEN_COST",
    "OPEN_COST",
    "MatrixLayout",
    "WireMatrix",
    "choose_replicas",
    "layout_error",
]

# choose_replicas with folding: a δ ciphertext (encrypt, serialize, read) and a folded product (mask, serialize,
# read, decrypt) in units of one ct x pt product with its plaintext's encoding (CKKS N = 8192, measured 2026-11):
# trees' [[Y]] and one-hot products, and LR's [[p]] / δ and gradient products (the key holder's symmetric encryption,
# the owner's δ and every reader's parse, 8.2 ms a ciphertext; a product's re-randomising zero, mask and save, 6.7
# ms, and its opening, 2.6 ms; against 1.4 ms a ct x pt product; one thread, 2026-11-29).
ENCRYPT_COST, OPEN_COST = 3.0, 3.0
LR_ENCRYPT_COST, LR_OPEN_COST = 5.8, 6.6


def layout_error(
    shape: Sequence[int], replicas: int, rows_per_ct: int, n_ciphertexts: int | None, slots: int
) -> str | None:
    """Why (shape, replicas, rows_per_ct[, ciphertext count]) is not a valid layout, or None if it is."""
    if len(shape) != 2:
        return f"shape must have 2 dimensions, got {len(shape)}"
    n, k = shape
    if n < 1 or k < 1:
        return f"shape must be positive, got {tuple(shape)}"
    if replicas < 1:
        return f"replicas must be >= 1, got {replicas}"
    if not 1 <= rows_per_ct <= n:
        return f"rows_per_ct must be in 1..{n}, got {rows_per_ct}"
    if replicas * rows_per_ct * k > slots:
        return f"replicas*rows_per_ct*k = {replicas}*{rows_per_ct}*{k} exceeds {slots} slots"
    if n_ciphertexts is not None and n_ciphertexts != math.ceil(n / rows_per_ct):
        return (
            f"{n} rows at {rows_per_ct} per ciphertext need {math.ceil(n / rows_per_ct)} ciphertexts, "
            f"got {n_ciphertexts}"
        )
    return None


@dataclass(frozen=True, slots=True)
class MatrixLayout:
    """How an (n, k) matrix is spread over ciphertexts (see the module docstring)."""

    shape: tuple[int, int]
    replicas: int
    rows_per_ct: int

    @classmethod
    def for_matrix(cls, shape: tuple[int, int], replicas: int, slots: int) -> MatrixLayout:
        """The densest layout: as many rows per ciphertext as the slots allow."""
        n, k = shape
        if n < 1 or k < 1 or replicas < 1:
            raise ValueError(f"shape {shape} and replicas {replicas} must be positive")
        if k * replicas > slots:
            raise ValueError(f"one row of {k} columns x {replicas} replicas does not fit in {slots} slots")
        layout = cls((n, k), replicas, min(n, slots // (k * replicas)))
        layout.validate(slots)
        return layout

    def validate(self, slots: int, n_ciphertexts: int | None = None) -> None:
        error = layout_error(self.shape, self.replicas, self.rows_per_ct, n_ciphertexts, slots)
        if error is not None:
            raise ValueError(f"invalid encrypted-matrix layout: {error}")

    @property
    def n_chunks(self) -> int:
        return math.ceil(self.shape[0] / self.rows_per_ct)

    @property
    def block_size(self) -> int:
        return self.rows_per_ct * self.shape[1]

    @property
    def ct_size(self) -> int:
        return self.replicas * self.block_size

    def pack(self, M: np.ndarray) -> np.ndarray:
        """(n_chunks, ct_size) slot vectors holding M in this layout, replicas included."""
        M = np.asarray(M, dtype=np.float64)
        if M.shape != self.shape:
            raise ValueError(f"matrix shape {M.shape} does not match layout shape {self.shape}")
        n, k = self.shape
        padded = np.zeros((self.n_chunks * self.rows_per_ct, k))
        padded[:n] = M
        blocks = padded.reshape(self.n_chunks, 1, self.block_size)
        return np.ascontiguousarray(
            np.broadcast_to(blocks, (self.n_chunks, self.replicas, self.block_size)).reshape(
                self.n_chunks, self.ct_size
            )
        )

    def unpack(self, slot_vectors: Sequence[np.ndarray]) -> np.ndarray:
        """Inverse of :meth:`pack`, reading the first replica."""
        first = np.stack([np.asarray(v)[: self.block_size] for v in slot_vectors])
        n, k = self.shape
        return first.reshape(-1, k)[:n]


@dataclass(frozen=True, slots=True)
class WireMatrix:
    """Transport form of an EncryptedMatrix (maps 1:1 onto a protobuf message)."""

    shape: tuple[int, int]
    replicas: int
    rows_per_ct: int
    ciphertexts: list[bytes]


def choose_replicas(
    n: int,
    k: int,
    d: int,
    slots: int,
    *,
    fold: int | None = None,
    parts: int = 1,
    costs: tuple[float, float] = (ENCRYPT_COST, OPEN_COST),
) -> int:
    """Replication factor R minimising the masked-product ciphertexts for an (n, k) δ and d features.

    With ``fold`` (products of up to that many chunks added before they are masked, :func:`masked_column_products`)
    the ciphertexts sent are few, and R minimises the work instead, in units of one ct x pt product (measured, CKKS
    N = 8192): each δ ciphertext costs ``costs[0]`` of them (encrypted, sent, read), each folded product
    ``costs[1]`` (masked, sent, decrypted). ``parts``: groups a product carries (:func:`masked_column_products`).
    """
    if min(n, k, d) < 1 or k > slots:
        raise ValueError(f"cannot pack n={n}, k={k}, d={d} into {slots} slots")

    def cost(r: int) -> tuple[float, int]:
        layout = MatrixLayout.for_matrix((n, k), r, slots)
        groups, chunks = math.ceil(math.ceil(d / r) / parts), layout.n_chunks
        if fold is None:  # fewest product ciphertexts first, then fewest δ ciphertexts to send
            return groups * chunks, chunks
        work = groups * chunks + costs[0] * chunks + costs[1] * groups * math.ceil(chunks / fold)
        return work, chunks

    return min(range(1, min(d, slots // k) + 1), key=cost)
