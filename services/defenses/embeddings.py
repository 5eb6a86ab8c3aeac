"""Passive-side embedding defenses for active-top split-NN: what a passive party may do to z_B before it leaves.

* :class:`Masquerade` — ye Algorithm 3. The passive bottom becomes z_B = [P | u_1 … u_m] [Q x_B; a_1 … a_m] (+ b)
  with Q of reduced rank and m fabricated bits a(x_B) that enter the span exactly: Algorithms 1–2 then find the
  fabricated bits. ``drop`` says which directions of x_B Q leaves out. ``random`` is ye §5's: one keyed random
  direction (rank d_B − 1), which takes a binary column out of the exact span only when the other columns do not
  nearly rebuild it (on UCI Bank they do: the least-squares fit of ``contact`` from the span rounds to it on
  96.5–100 % of rows). ``binary`` (the default) keeps only directions v with v_j = 0 and vᵀ Σ e_j = 0 for every binary
  column j (Σ: the covariance of the party's shard, :func:`binary_free_basis`): every x v in the span leaves the
  binary columns out and is uncorrelated with each, so its best linear predictor from the span is the constant (the
  majority rate); K, the basis
  of those directions, is computed once from the party's shard and kept beside the secret (the same in every
  session). With m bits the rows split into 2^m patterns; m = ⌈log₂ n⌉ leaves the adaptive attack groups of about
  one row (ye §5). The bits are a keyed PRF of the row's bytes (AES-256 CBC-MAC over fixed-length messages, the
  length bound in a first block), so one sample always gets the same pattern — repeating a query cannot average or
  difference it away — while without the key the patterns are independent fair coins. One ECB pass per 16 bytes of
  row serves every row of a batch at once, which keeps the first layer's overhead small.
  Q is fixed (a buffer, never trained) and, with the bits' key, derived from the party's **long-term masquerade
  secret** (32 bytes of OS entropy kept in its state folder, never a config value or the session seed; HKDF-SHA256
  per purpose, Q's entries an AES-CTR stream): every session of the party has the same Q and the same bits, so the
  z_B of any number of sessions and model versions over the same rows, stacked side by side, span [Q x, a(x), 1]
  and nothing more. With a Q per session two sessions stacked spanned [Q_1 x, Q_2 x] ∋ x: the binary feature again.
  P's start is this session's own OS entropy (it trains anyway).
* :class:`EmbeddingNoise` — N(0, σ²) on every z_B entry sent, σ stated, a keyed function of the row and of the
  model version (a digest of the bottom's weights; its own 32-byte OS-entropy key): the same sample at the same
  weights always gets the same noise, so asking k times and averaging cannot shrink σ by √k, while another row or
  another model version gets independent noise (σ protects each version's answer; over k versions it composes as
  any per-release noise does). Since the active party picks the steps (a tiny learning rate makes many near-identical
  versions), each row is answered at most ``max_answers`` times a session (counted by the passive engine): an
  attacker averaging every answer it gets for a row still faces noise of σ/√max_answers at least. Its key stays
  per session: two sessions never share a model version (each bottom starts from its own OS entropy), so their
  noise for one row is independent whatever the key, and a long-term key would protect nothing more.

Both are public mechanisms (Kerckhoffs): ``public_params`` is what an attacker may know; the keys are not in it.
A session's keys are checkpointed with it (:attr:`EmbeddingChain.keys`; Q is in the layer's buffers). They are
plug-ins of :data:`EMBEDDING_STEPS` (services/registry.py: specs such as ``masquerade:m=4`` are parsed there, by the
one shared value parser).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from vflsec.services.crypto.entropy import KEY_BYTES, derive_key, keyed_stream, new_key
from vflsec.services.registry import Plugin, Registry, parse_spec

if TYPE_CHECKING:  # the layers need torch, imported only when a defended bottom is built
    import torch
    from torch import nn

    from vflsec.services.defenses.embedding_layers import MasqueradeLinear, NoisyEmbedding

__all__ = [
    "EMBEDDING_STEPS",
    "EmbeddingChain",
    "EmbeddingNoise",
    "Masquerade",
    "binary_columns",
    "binary_free_basis",
    "default_fabricated",
]

EMBEDDING_STEPS: Registry[Plugin] = Registry("embedding release step")

MAX_FABRICATED = 128  # bits of one AES block (m = ⌈log₂ n⌉ is 64 at most)
# Answers per row and session under embedding_noise: a default split-NN run asks each row at most 30 times in
# training (30 epochs) plus a few evaluation queries, well inside; counted in uint16, hence the ceiling.
DEFAULT_MAX_ANSWERS = 128
MAX_ANSWERS_CEILING = 2**16 - 1
# HKDF purposes of masquerade's keys. Fixed for good: another string gives a party's later sessions another Q and
# other bits, and those stacked with its earlier sessions would span x again.
_BITS_PURPOSE = "vflsec masquerade: row PRF key (AES-256 CBC-MAC of a row's float64 bytes)"
_Q_PURPOSE = "vflsec masquerade: Q stream key (AES-256-CTR, U(±1/√d_B) entries row by row), d_B = {d_in}"
# drop=binary's R (Q = R K): its own stream, so that it never repeats a row of the random mode's Q.
_R_PURPOSE = "vflsec masquerade drop=binary: R stream key (AES-256-CTR, U(±1/√(d_B − r)) entries), d_B = {d_in}"
DROPS = ("binary", "random")


def row_prf(key: bytes, x: np.ndarray) -> np.ndarray:
    """(n, 16) bytes: AES-256 CBC-MAC of each row's float64 bytes under ``key`` (fixed-length messages, the
    length in a first block), every row of the batch in one ECB pass per 16 bytes of row."""
    rows = np.ascontiguousarray(np.asarray(x, dtype=np.float64))
    if rows.ndim != 2:
        raise ValueError(f"embedding defense input must be an (n, d) matrix, got shape {rows.shape}")
    n, width = rows.shape[0], rows.shape[1] * 8
    data = np.zeros((n, -(-width // 16) * 16), dtype=np.uint8)
    data[:, :width] = rows.view(np.uint8).reshape(n, width)
    encryptor = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    state = np.zeros((n, 16), dtype=np.uint8)
    state[:, :8] = np.frombuffer(width.to_bytes(8, "little"), dtype=np.uint8)  # the message length first
    for start in range(-16, data.shape[1], 16):
        block = state if start < 0 else state ^ data[:, start : start + 16]
        state = np.frombuffer(encryptor.update(block.tobytes()), dtype=np.uint8).reshape(n, 16)
    return state


def default_fabricated(n_samples: int) -> int:
    """ye §5: m = ⌈log₂ n⌉, the fewest bits for which 2^m ≥ n (groups of about one row)."""
    if n_samples < 2:
        raise ValueError(f"masquerade needs at least 2 samples to size m, got {n_samples}")
    return math.ceil(math.log2(n_samples))


def binary_columns(x: np.ndarray) -> np.ndarray:
    """Indices of the columns of ``x`` that take exactly two distinct values (a constant column is not binary)."""
    x = np.asarray(x, dtype=np.float64)
    return np.array([j for j in range(x.shape[1]) if len(np.unique(x[:, j])) == 2], dtype=np.int64)


def binary_free_basis(x: np.ndarray, columns: Sequence[str] | None = None) -> np.ndarray:
    """K ((d − r) × d, orthonormal rows): a basis of {v : v_j = 0 and vᵀ Σ e_j = 0 for every binary column j of
    ``x``}, Σ the covariance of the rows of ``x`` and r the rank of those constraints (2 per binary column, fewer when
    a column is uncorrelated with the others or binary columns are collinear). Every x v, v in K's row space, leaves
    the binary columns out and is uncorrelated with each of them on these rows. Uncorrelated alone (v_j free) is not
    enough: on Bank the kept directions then carry `contact` plus the month-level indicators that cancel its
    correlation, and inside one month (rows the active party can pick by its own columns) `contact` reappears exactly
    (review 8b); with v_j = 0 what a group of rows shows is only what the other columns say about it there. No binary
    column: the identity (drop=binary then drops one keyed random direction, as drop=random does).

    ValueError when no direction is left (``columns`` names the binary columns)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"masquerade drop=binary needs the party's rows, an (n >= 2, d) matrix; got {x.shape}")
    d, binary = x.shape[1], binary_columns(x)
    if len(binary) == 0:
        return np.eye(d)
    constraints = np.vstack([np.cov(x, rowvar=False)[:, binary].T, np.eye(d)[binary]])  # (Σ e_j)ᵀ and e_jᵀ
    constraints /= np.linalg.norm(constraints, axis=1, keepdims=True)
    _, singular, vt = np.linalg.svd(constraints)
    rank = int(np.sum(singular > singular[0] * max(constraints.shape) * np.finfo(np.float64).eps))
    if rank >= d:
        names = [columns[j] for j in binary] if columns is not None else [f"column {j}" for j in binary]
        raise ValueError(
            f"masquerade drop=binary: no direction of this party's {d} columns leaves out its binary columns "
            f"({', '.join(names)}) and is uncorrelated with them; use masquerade:drop=random (ye's, which leaves "
            "combinations of the binary columns in the span) or do not share these columns"
        )
    return vt[rank:]


# drop=binary's K is kept from the shard it was made on; on the shard a party starts with, the best linear fit of a
# binary column from x Kᵀ may explain at most this share of its variance (R²) beyond chance. Made and checked on the
# same rows it is 0 (to rounding); on n rows of the same population a fit on k kept directions explains about k / n
# by chance (sd ≈ √(2k) / n): the bound is MAX_BINARY_R2 + 6 k / n, several sd above chance. A drifted shard
# exceeds it (Bank in date order, K from the first 30,000 rows: R² = 0.41 over all rows).
MAX_BINARY_R2 = 0.01


def binary_exposure(x: np.ndarray, basis: np.ndarray) -> dict[int, float]:
    """Per binary column j of ``x``: R² of its least-squares fit from [1, x Kᵀ], the share of its variance the span
    of drop=binary's kept directions explains on these rows (0 where K was made)."""
    x = np.asarray(x, dtype=np.float64)
    kept = x @ np.asarray(basis, dtype=np.float64).T
    design = np.hstack([np.ones((len(x), 1)), kept - kept.mean(axis=0)])
    exposure = {}
    for j in binary_columns(x):
        target = x[:, j] - x[:, j].mean()
        fitted = design @ np.linalg.lstsq(design, target, rcond=None)[0]
        exposure[int(j)] = float(fitted @ fitted / (target @ target))
    return exposure


def basis_problem(x: np.ndarray, basis: np.ndarray, columns: Sequence[str] | None = None) -> str | None:
    """Why a kept K does not fit the shard ``x`` (made for other columns) or no longer hides its binary columns (rows
    added or changed since it was made, or the scaling moved), or None. Not silently remade: a new K gives a new Q,
    and the z_B the active party recorded in earlier sessions, stacked with the new ones on shared rows, would span
    the binary columns again."""
    if basis.ndim != 2 or basis.shape[1] != x.shape[1]:
        return (
            f"masquerade's K was made for {basis.shape[-1]} columns, this party's shard has {x.shape[1]}: restore "
            "the shard's columns, or (for a new column set, whose sessions start anew) remove the file"
        )
    bound = MAX_BINARY_R2 + 6 * len(basis) / len(x)
    worst = max(binary_exposure(x, basis).items(), key=lambda item: item[1], default=None)
    if worst is None or worst[1] <= bound:
        return None
    name = columns[worst[0]] if columns is not None else f"column {worst[0]}"
    return (
        f"masquerade's K no longer hides the binary column {name} on this shard: its best linear fit from the kept "
        f"directions explains R² = {worst[1]:.3f} of it (at most {bound:.3f} for {len(x)} rows); the shard or its "
        "scaling changed since K was made. Restore the shard K was made on, or leave the binary columns out of "
        "[data] columns. Removing the file makes a new K, and the z_B the active party recorded with the old one, "
        "stacked with new ones on shared rows, would expose the binary columns there"
    )


@EMBEDDING_STEPS.register("masquerade")
class Masquerade(Plugin):
    """ye Algorithm 3: m fabricated binary features per sample and a rank-reduced true part.

    ``m=None`` sizes m from the party's row count when :meth:`resolve` is called (m = ⌈log₂ n⌉). Q and the bits'
    key come from a 32-byte secret: the party's long-term one (:meth:`with_secret`), else one this instance drew.

    ``drop``: which directions of x Q leaves out (public). ``random``: ye's, one keyed random direction, ``rank``
    default d_B − 1. ``binary``: Q = R K, K the party's :func:`binary_free_basis` (given to :meth:`with_secret`,
    computed once from its whole shard and kept) and R a keyed random (rank × (d_B − r)) matrix, ``rank`` default
    and ceiling d_B − r. A block with no binary column (K the identity) is treated exactly as under ``random``.
    The price: a model cannot use a binary column through this linear bottom (only through the active party's).
    """

    families = frozenset({"splitnn"})

    def __init__(
        self, m: int | None = None, rank: int | None = None, drop: Literal["binary", "random"] = "binary"
    ) -> None:
        if m is not None and not 1 <= m <= MAX_FABRICATED:
            raise ValueError(f"m must lie in [1, {MAX_FABRICATED}], got {m}")
        if rank is not None and rank < 1:
            raise ValueError(f"rank must be >= 1, got {rank}")
        if drop not in DROPS:
            raise ValueError(f"drop must be one of {', '.join(DROPS)}; got {drop!r}")
        self.m, self.rank, self.drop = m, rank, drop
        self._basis: np.ndarray | None = None  # K, drop=binary's
        self._keyed(new_key())  # OS entropy, never a parameter (so never announced or configured)

    def _keyed(self, secret: bytes, basis: np.ndarray | None = None) -> Masquerade:
        self._secret, self._basis = secret, basis
        self._key = derive_key(secret, _BITS_PURPOSE)  # the bits' PRF key (a restored session sets its own)
        return self

    def with_secret(self, secret: bytes, basis: np.ndarray | None = None) -> Masquerade:
        """This masquerade keyed by ``secret``, the party's long-term masquerade secret: the same Q (for a given
        d_B and ``basis``, drop=binary's K) and the same bits in every session."""
        return Masquerade(self.m, self.rank, self.drop)._keyed(secret, basis)

    def resolve(self, n_samples: int) -> Masquerade:
        """This masquerade with m fixed (the default ⌈log₂ n⌉ when m was not given); same secret, key and K."""
        m = self.m if self.m is not None else default_fabricated(n_samples)
        resolved = Masquerade(m, self.rank, self.drop)._keyed(self._secret, self._basis)
        resolved._key = self._key
        return resolved

    def public_params(self) -> dict[str, str]:
        params = {"m": "log2n" if self.m is None else str(self.m)}
        if self.rank is not None:
            params["rank"] = str(self.rank)
        params["drop"] = self.drop
        return params

    def bits(self, x: np.ndarray) -> np.ndarray:
        """(n, m) fabricated bits of the rows of ``x``: a keyed PRF of each row's float64 bytes."""
        if self.m is None:
            raise ValueError("masquerade m is not fixed yet: call resolve(n_samples) first")
        return np.unpackbits(row_prf(self._key, x), axis=1)[:, : self.m].astype(np.float64)

    def _kept(self, d_in: int) -> np.ndarray | None:
        """K under drop=binary with a binary column among the d_in; None where Q is ye's random one."""
        if self.drop == "random":
            return None
        if self._basis is None:
            raise ValueError(
                "masquerade drop=binary needs K, the directions kept free of the party's binary columns (a party "
                "keeps it in <state>/secrets/masquerade_basis.npy: restore that file from a backup; in code: "
                "with_secret(secret, binary_free_basis(x)); drop=random needs none)"
            )
        if self._basis.ndim != 2 or self._basis.shape[1] != d_in:
            raise ValueError(f"masquerade K has shape {self._basis.shape}, expected (kept, d_B = {d_in})")
        return None if self._basis.shape[0] == d_in else self._basis

    def _rank(self, d_in: int) -> int:
        if self.m is None:
            raise ValueError("masquerade m is not fixed yet: call resolve(n_samples) first")
        kept = self._kept(d_in)
        if kept is None:
            rank = self.rank if self.rank is not None else max(d_in - 1, 1)
            if rank > d_in:
                raise ValueError(f"masquerade rank must be <= d_B = {d_in}, got {rank}")
            return rank
        rank = self.rank if self.rank is not None else len(kept)
        if rank > len(kept):
            raise ValueError(
                f"masquerade drop=binary: rank must be <= {len(kept)}, the directions of the d_B = {d_in} columns "
                f"uncorrelated with the binary ones; got {rank}"
            )
        return rank

    def projection(self, d_in: int) -> np.ndarray:
        """Q (rank × d_in), a function of the secret, d_in (and K) alone: the first ``rank`` rows of one keyed
        stream, so sessions at different ranks still share nested row spaces (stacked, the larger rank, never x).
        Under drop=binary Q = R K, R's entries U(±1/√(d_B − r)): K's rows are orthonormal, so Q's rows have the
        norms of the random mode's."""
        rank, kept = self._rank(d_in), self._kept(d_in)
        if kept is None:
            bound = 1.0 / math.sqrt(d_in)  # torch's default for a layer of d_in inputs
            stream = keyed_stream(derive_key(self._secret, _Q_PURPOSE.format(d_in=d_in)), "rows of Q")
            return stream.uniform(-bound, bound, (rank, d_in))
        stream = keyed_stream(derive_key(self._secret, _R_PURPOSE.format(d_in=d_in)), "rows of R")
        bound = 1.0 / math.sqrt(len(kept))
        return stream.uniform(-bound, bound, (rank, len(kept))) @ kept

    def min_width(self, d_in: int) -> int:
        """The narrowest passive bottom (d_in inputs) that carries the rank-reduced part and every fabricated bit."""
        return self._rank(d_in) + (self.m or 0)

    def build(self, d_in: int, width: int, *, bias: bool, dtype: torch.dtype | None = None) -> MasqueradeLinear:
        """The passive bottom (d_in -> width) under this masquerade: Q from the secret, P's start from OS entropy;
        ``dtype``: the bottom's it replaces (:meth:`EmbeddingChain.module` passes it; split-NN runs in float64)."""
        rank = self._rank(d_in)
        if width < self.min_width(d_in):
            raise ValueError(
                f"masquerade needs the passive width >= rank + m = {rank + self.m} to carry every fabricated bit; "
                f"got {width} (raise passive_width to at least {rank + self.m}, or lower m)"
            )
        from vflsec.services.defenses.embedding_layers import MasqueradeLinear

        return MasqueradeLinear(self, d_in, width, rank, bias, dtype)


@EMBEDDING_STEPS.register("embedding_noise")
class EmbeddingNoise(Plugin):
    """z_B + N(0, σ²) on every entry sent, σ stated; the noise is a keyed PRF of the row's bytes and the model version.

    The row's CBC-MAC tag (:func:`row_prf`, under a MAC subkey bound to the version) seeds an AES-256-CTR-like
    expansion (under a second subkey) of 16 bytes per pair of entries, turned into normals by Box-Muller. The
    version is a digest of the wrapped bottom's weights (``embedding_layers.model_version``): asked again at the
    same weights, a row gets the same noise (no averaging of repeats); at other weights (a later training step, the
    final model) independent noise, so the difference of one row's answers at two versions does not cancel it.
    Distinct rows get independent noise, and without the key (32 bytes of OS entropy, never configured) it looks
    like i.i.d. draws.
    """

    families = frozenset({"splitnn"})

    def __init__(self, sigma: float, max_answers: int = DEFAULT_MAX_ANSWERS) -> None:
        if isinstance(sigma, bool) or not (math.isfinite(sigma) and sigma > 0):
            raise ValueError(f"sigma must be a finite number > 0, got {sigma!r}")
        if isinstance(max_answers, bool) or not 1 <= max_answers <= MAX_ANSWERS_CEILING:
            raise ValueError(f"max_answers must lie in [1, {MAX_ANSWERS_CEILING}], got {max_answers!r}")
        self.sigma = float(sigma)
        self.max_answers = int(max_answers)  # answers per row and session: averaging them leaves σ/√max_answers
        self._key = new_key()

    def public_params(self) -> dict[str, str]:
        return {"sigma": str(self.sigma), "max_answers": str(self.max_answers)}

    def _subkey(self, purpose: bytes) -> bytes:
        return hashlib.sha256(b"vflsec embedding_noise " + purpose + self._key).digest()

    def draw(self, x: np.ndarray, width: int, version: bytes = b"") -> np.ndarray:
        """(n, width) noise for the rows of ``x``: N(0, σ²) per entry, a fixed function of the row and ``version``
        (a 32-byte :func:`model_version`; empty for a fixed model)."""
        if len(version) not in (0, 32):
            raise ValueError(f"version must be a 32-byte digest or empty, got {len(version)} bytes")
        tags = row_prf(self._subkey(b"mac" + version), x)
        pairs = -(-width // 2)
        counters = np.zeros((pairs, 16), dtype=np.uint8)
        counters[:, :8] = np.arange(pairs, dtype="<u8")[:, None].view(np.uint8)
        blocks = (tags[:, None, :] ^ counters[None, :, :]).tobytes()
        encryptor = Cipher(algorithms.AES(self._subkey(b"stream")), modes.ECB()).encryptor()
        words = np.frombuffer(encryptor.update(blocks), dtype="<u8").reshape(len(tags), pairs, 2)
        u = (words >> np.uint64(11)).astype(np.float64) / float(2**53)  # uniform on [0, 1)
        radius = np.sqrt(-2.0 * np.log1p(-u[..., 0]))  # 1 − u in (0, 1]: the log is finite
        angle = 2.0 * np.pi * u[..., 1]
        normals = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=2).reshape(len(tags), 2 * pairs)
        return self.sigma * normals[:, :width]

    def __call__(self, x: np.ndarray, z: np.ndarray, version: bytes = b"") -> np.ndarray:
        """The released z for inputs ``x`` and clean embeddings ``z`` of the model at ``version``."""
        z = np.asarray(z, dtype=np.float64)
        return z + self.draw(x, z.shape[1], version)

    def wrap(self, module: nn.Module) -> NoisyEmbedding:
        """``module`` whose output carries this noise (training and inference); gradients pass unchanged."""
        from vflsec.services.defenses.embedding_layers import NoisyEmbedding

        return NoisyEmbedding(module, self)


@dataclass(frozen=True)
class EmbeddingChain:
    """A passive party's embedding defenses, from its operator's ``[defenses] embedding`` specs, in order.

    The configured chain is a template: each session gets its own instances (:meth:`for_session`: masquerade keyed
    by the party's long-term secret, fresh noise keys, m resolved for the party's rows). Masquerade replaces the
    linear layer, so it comes first and at most once; noise steps wrap whatever precedes them.
    """

    steps: tuple[Plugin, ...] = ()

    @classmethod
    def from_specs(cls, specs: Sequence[str]) -> EmbeddingChain:
        """Parse with the one plug-in convention; a bad spec raises PluginError naming the step and its keys."""
        steps = tuple(EMBEDDING_STEPS.parse(spec, family="splitnn") for spec in specs)
        masquerades = [i for i, step in enumerate(steps) if isinstance(step, Masquerade)]
        if masquerades not in ([], [0]):
            raise ValueError(
                "masquerade replaces the passive bottom layer: it may appear once, as the first embedding step"
            )
        return cls(steps)

    def __bool__(self) -> bool:
        return bool(self.steps)

    @classmethod
    def from_checkpoint(cls, specs: Sequence[str]) -> EmbeddingChain:
        """The chain a session checkpoint names: a masquerade spec written before ``drop`` existed ran ye's
        drop=random, and its Q (in the checkpointed layer) has that shape."""

        def dated(spec: str) -> str:
            name, params = parse_spec(spec)
            if name != "masquerade" or "drop" in params:
                return spec
            return spec + ("," if ":" in spec else ":") + "drop=random"

        return cls.from_specs([dated(spec) for spec in specs])

    def for_session(
        self,
        n_rows: int,
        keys: Sequence[bytes] = (),
        *,
        secret: bytes | None = None,
        basis: np.ndarray | None = None,
    ) -> EmbeddingChain:
        """Instances for one session: masquerade keyed by ``secret`` (the party's long-term masquerade secret; None:
        one of its own, this session's alone) with ``basis``, the party's kept K (drop=binary's), new OS-entropy
        noise keys. ``keys`` restores checkpointed ones, in order (a restored masquerade's Q is in the checkpointed
        layer; ``basis`` gives it its shape)."""
        if len(keys) > len(self.steps) or any(len(key) != KEY_BYTES for key in keys):
            raise ValueError(f"expected at most {len(self.steps)} keys of {KEY_BYTES} bytes, got {len(keys)}")
        fresh: list[Plugin] = []
        for i, step in enumerate(self.steps):
            if isinstance(step, Masquerade):
                step = step.with_secret(secret if secret is not None else new_key(), basis).resolve(n_rows)
            else:
                step = type(step)(**step.get_params())
            if i < len(keys):
                step._key = keys[i]  # type: ignore[attr-defined]
            fresh.append(step)
        return EmbeddingChain(tuple(fresh))

    @property
    def masquerade(self) -> Masquerade | None:
        return next((step for step in self.steps if isinstance(step, Masquerade)), None)

    @property
    def keys(self) -> tuple[bytes, ...]:
        """Every step's PRF key, in order, for the party's own checkpoint only (never announced): masquerade's bit
        key (derived from the long-term secret, which itself stays out of session checkpoints), the noise's own."""
        return tuple(step._key for step in self.steps)  # type: ignore[attr-defined]

    def announced(self) -> list[tuple[str, dict[str, str]]]:
        """(name, public parameters) per step: what the active party is told (Kerckhoffs)."""
        return [(step.name, step.public_params()) for step in self.steps]

    def specs(self) -> list[str]:
        """Specs that rebuild this (resolved) chain: m is a number once the session fixed it."""
        return [f"{name}:" + ",".join(f"{k}={v}" for k, v in params.items()) for name, params in self.announced()]

    @property
    def max_answers(self) -> int | None:
        """Answers per row and session the chain's noise allows (the tightest step's); None without noise."""
        bounds = [step.max_answers for step in self.steps if isinstance(step, EmbeddingNoise)]
        return min(bounds) if bounds else None

    def min_width(self, d_in: int) -> int | None:
        """The narrowest z_B this chain can be carried by (None: any width does)."""
        return next((step.min_width(d_in) for step in self.steps if isinstance(step, Masquerade)), None)

    def module(self, plain: nn.Module, d_in: int, width: int, *, bias: bool) -> nn.Module:
        """The defended bottom replacing ``plain`` (d_in -> width), its initial weights from OS entropy, never the
        session seed (``embedding_layers.os_initialised``). A masquerade layer takes ``plain``'s dtype (the family's,
        which this room does not import)."""
        from vflsec.services.defenses.embedding_layers import os_initialised

        module = os_initialised(plain) if self.steps else plain
        dtype = next(plain.parameters()).dtype
        for step in self.steps:
            if isinstance(step, Masquerade):
                module = step.build(d_in, width, bias=bias, dtype=dtype)
            elif isinstance(step, EmbeddingNoise):
                module = step.wrap(module)
        return module
