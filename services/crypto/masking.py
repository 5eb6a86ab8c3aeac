"""The masked-product step of the protocol (step 5, docs/protocol.md): a party's masked ct x pt products of an
encrypted δ (or a tree node's class indicators) with its own columns, and the key holder's block sums of them.

Masked gradients: a party multiplies each δ ciphertext by its packed feature values, adds a uniform mask in
[-B, B] per slot (CKKS: in both parts of the complex slot) and a fresh encryption of zero (CkksBackend.masked_sum),
and sends the products to the key holder, which decrypts and returns only per-block sums; the party subtracts its
mask sums. Mask bound trade-off (CKKS): the key holder sees ``v + m`` per slot, so
for |v| <= V the statistical distance between two inputs is <= V / B per slot (hiding improves with B),
while the decoded value carries an absolute error that stays at the ~1.2e-6 noise floor up to B ~ 2^30 and
then grows about linearly in B, because decoding works in double precision on coefficients of size
B * 2^40 (measured max error per slot: 2^32 -> 2.8e-6, 2^35 -> 2.4e-5, 2^40 -> 6e-4). The default
B = 2^24 keeps a 64x margin below that knee. Features are bounded by FEATURE_BOUND = 64 (a party refuses
larger ones) and |δ| <= 1, so |v| <= 64 is hidden to within 2^-18 per slot (LR's products adding two chunks,
gradient_fold, have masks twice as wide for |v| <= 128); the key holder clips slots outside [-(B + 65), B + 65]
(at fold f, f (B + 64) + 1), which keeps every decryption it answers in that low-error regime. The
plain backend defaults to B = 0: it hides nothing anyway, and float64 masks would only cost it exactness.

Block sums leave the key holder flooded (CKKS only): Gaussian noise of standard deviation 2^-6, then rounded
to a 2^-10 grid. The decoding error of a block sum of honest products stays orders of magnitude below that
(measured, see docs/protocol.md), so for those the released value hides it, while a gradient (sum / n) moves by
2^-6 / n, far below its own minibatch noise. Crafted ciphertexts are refused unless they have an honest form
(CkksBackend.check_form); one of honest form can still decrypt to functions of the secret key (IND-CPA^D,
docs/protocol.md "Block sums").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from vflsec.services.crypto.he import FEATURE_BOUND, Backend, Ct, EncryptedMatrix, MatrixLayout, RandomSource

__all__ = [
    "GRADIENT_MAX_FOLD",
    "block_sums",
    "gradient_fold",
    "gradient_from_block_sums",
    "masked_column_products",
    "masked_feature_products",
    "product_count",
    "product_parts",
]


def product_parts(backend: Backend) -> int:
    """Feature groups one masked product carries: two where slots are complex (CKKS: a slot's real and imaginary
    parts), else one. Public: every party and the key holder derive it from the session's backend."""
    return 2 if backend.complex_slots else 1


# LR's gradient products add up to this many chunks of δ before one mask (gradient_fold).
GRADIENT_MAX_FOLD = 2


def gradient_fold(layout: MatrixLayout) -> int:
    """Chunks of δ one of LR's gradient products adds before it is masked: every chunk, up to GRADIENT_MAX_FOLD.
    Public: every party and the key holder derive it from the step's layout. Its masks are drawn ``fold`` times as
    wide (``widening``, :func:`masked_column_products`), so each hides a sum of ``fold`` products as the default one
    hides one; at most 2 keeps a masked slot (<= sqrt(2) · 2 (2^24 + 64)) x 2^72 at 2^97.5 in every coefficient,
    inside the lowered form's q/2 = 2^99 (he.PRODUCT_PLAIN_SCALE_BITS)."""
    return min(layout.n_chunks, GRADIENT_MAX_FOLD)


def product_count(d: int, layout: MatrixLayout, *, fold: int = 1, parts: int = 1) -> int:
    """Ciphertexts :func:`masked_column_products` makes for ``d`` columns against a δ of ``layout``."""
    return math.ceil(math.ceil(d / layout.replicas) / parts) * math.ceil(layout.n_chunks / fold)


def masked_feature_products(
    backend: Backend,
    delta: EncryptedMatrix,
    X: np.ndarray,
    rng: RandomSource,
    mask_bound: float | None = None,
    *,
    fold: int = 1,
    parts: int = 1,
    serialized: bool = False,
    widening: int = 1,
) -> tuple[list[Ct] | list[bytes], np.ndarray]:
    """Masked [[δ ⊙ x]] blocks for the key holder, and the mask sums the party keeps.

    For feature group g (features g*R .. g*R+R-1, G = ceil(d/R)) and chunk i the product is
    ``δ_ct_i * v + m`` with ``v[r*C*k + row*k + col] = X[i*C + row, g*R + r]``. Ciphertexts are ordered
    (g, i); the mask sums have the shape :func:`block_sums` returns, (G*R, k). With ``fold`` > 1 the products of
    ``fold`` consecutive chunks are added before one mask is (masks ``widening`` default ones wide), and with
    ``parts`` = 2 two groups share a product (:func:`masked_column_products`).

    δ must still have one multiplicative level left (a fresh encryption, possibly plus/minus plaintexts, as
    in protocol steps 3-4): with moduli [60, 40, 40, 60] a second ct x pt would leave too little modulus for
    the mask. ``mask_bound`` defaults to the backend's ``default_mask_bound`` (see the module docstring).
    ``rng`` draws the masks; services pass a CSPRNG (services/crypto/entropy.py), tests may pass a numpy Generator.
    ``backend`` must hold the public key δ is encrypted under (the step's training-key epoch): an all-zero
    feature block's product is a fresh encryption of zero under it (:meth:`CkksBackend.masked_sum`).
    """
    X = np.asarray(X, dtype=np.float64)
    n = delta.layout.shape[0]
    if X.ndim != 2 or X.shape[0] != n or X.shape[1] < 1:
        raise ValueError(f"features must be ({n}, d>=1) to match δ, got shape {X.shape}")
    return masked_column_products(
        backend,
        delta,
        lambda lo, hi: X[:, lo:hi],
        X.shape[1],
        rng,
        mask_bound,
        fold=fold,
        parts=parts,
        serialized=serialized,
        widening=widening,
    )


def masked_column_products(
    backend: Backend,
    delta: EncryptedMatrix,
    columns: Callable[[int, int], np.ndarray],
    d: int,
    rng: RandomSource,
    mask_bound: float | None = None,
    *,
    fold: int = 1,
    parts: int = 1,
    serialized: bool = False,
    widening: int = 1,
) -> tuple[list[Ct] | list[bytes], np.ndarray]:
    """:func:`masked_feature_products` of the (n, d) matrix whose columns lo..hi-1 ``columns(lo, hi)`` returns,
    one feature group at a time (never the whole matrix, nor every product unfolded, in memory at once).

    ``fold``: the products of each ``fold`` consecutive chunks of a group are added (ct + ct) and masked once, so a
    group has ceil(chunks / fold) ciphertexts, not one per chunk; a slot then holds the sum of ``fold`` rows'
    values, so the caller keeps ``fold`` · max|δ| · max|x| <= ``widening`` · FEATURE_BOUND, the range the masks
    hide (checked here for the x side). ``widening``: the masks are that many default ones wide (the default
    mask bound times it; with ``mask_bound`` given, tests' probes, only 1 is accepted): trees fold one-hot columns
    under the default masks, LR folds |x| <= 64 under masks ``fold`` times as wide (:func:`gradient_fold`).
    :func:`block_sums` opens them with the same ``fold``.

    ``parts``: feature groups one product carries, 2 only where slots are complex (CKKS): group 2p in the slots'
    real parts, group 2p + 1 in their imaginary parts (δ is real, so (δ)(a + ib) = δa + iδb), half the products
    for the same sums; the mask sums stay one row block per group, (G*R, k). ``serialized``: the products as
    the bytes the key holder is sent (he.Backend.masked_sum).
    """
    layout = delta.layout
    n, k = layout.shape
    if d < 1:
        raise ValueError(f"need at least one feature column, got {d}")
    if len(delta.ciphertexts) != layout.n_chunks:
        raise ValueError(f"δ has {len(delta.ciphertexts)} ciphertexts, layout needs {layout.n_chunks}")
    if fold < 1:
        raise ValueError(f"fold must be >= 1, got {fold}")
    if parts not in (1, 2) or (parts == 2 and not backend.complex_slots):
        raise ValueError(f"parts must be 1, or 2 where slots are complex; got {parts} for {backend.name}")
    if widening < 1 or (widening > 1 and mask_bound is not None):
        raise ValueError(f"widening must be >= 1, and 1 with an explicit mask_bound; got {widening}")
    bound = backend.default_mask_bound * widening if mask_bound is None else float(mask_bound)
    if not (math.isfinite(bound) and bound >= 0):
        raise ValueError(f"mask_bound must be finite and >= 0, got {mask_bound}")
    hidden = FEATURE_BOUND * widening  # what masks ``widening`` default ones wide hide of a slot's sum

    R, C, chunks = layout.replicas, layout.rows_per_ct, layout.n_chunks
    folded = math.ceil(chunks / fold)
    products: list = []
    mask_sums = np.zeros((math.ceil(d / R), R, k))
    for first in range(0, mask_sums.shape[0], parts):
        carried = range(first, min(mask_sums.shape[0], first + parts))
        values = np.zeros((chunks, layout.ct_size), dtype=np.complex128 if parts == 2 else np.float64)
        for part, g in enumerate(carried):
            lo, hi = g * R, min(d, g * R + R)
            block = np.asarray(columns(lo, hi), dtype=np.float64)
            if block.shape != (n, hi - lo):
                raise ValueError(f"features must be ({n}, d) to match δ, got columns of shape {block.shape}")
            if not np.all(np.abs(block) * fold <= hidden):
                raise ValueError(f"features must satisfy fold · |x| <= {hidden:g} (the masks hide no more)")
            padded = np.zeros((chunks * C, R))
            padded[:n, : hi - lo] = block
            # (chunk, row, replica) -> (chunk, replica, row, col): each feature value spans k slots.
            per_slot = padded.reshape(chunks, C, R).transpose(0, 2, 1)[..., None]
            group = np.broadcast_to(per_slot, (chunks, R, C, k)).reshape(chunks, layout.ct_size)
            if part:
                values.imag = group
            else:
                values.real = group
        masks = rng.uniform(-bound, bound, size=(folded, layout.ct_size))
        if backend.complex_slots:
            # The key holder may decode a product's imaginary parts too, which carry δ's encryption noise times
            # the party's values (|Im| correlates ~0.45 with |x| unmasked): masked like the real ones, always.
            masks = masks + 1j * rng.uniform(-bound, bound, size=masks.shape)
        for j in range(folded):
            span = slice(j * fold, min(chunks, (j + 1) * fold))
            products.append(backend.masked_sum(delta.ciphertexts[span], values[span], masks[j], serialized=serialized))
        for part, g in enumerate(carried):
            mask_sums[g] = (masks.imag if part else masks.real).reshape(folded, R, C, k).sum(axis=(0, 2))
    return products, mask_sums.reshape(-1, k)


def block_sums(
    backend: Backend,
    cts: Sequence[Ct],
    layout: MatrixLayout,
    max_abs: float | None = None,
    *,
    clip: bool = False,
    fold: int = 1,
    parts: int = 1,
) -> np.ndarray:
    """Key holder: decrypt masked products and sum each (feature, class) block -> (G*R, k), G = products / chunks
    × ``parts`` (with two parts and an odd number of groups the last block is the empty imaginary part's: the
    caller keeps its own count of groups).

    With ``max_abs``, a product with a slot beyond it (in either part) is refused (ValueError): honest products lie
    within the mask bound plus the feature bound, and larger ones would decode with a larger error. With ``clip``
    such a slot is clipped to the bound instead, where the refusal would be an answer (trees: only the decision may
    depend on it). ``fold`` and ``parts``: the products' (:func:`masked_column_products`).
    """
    chunks, R, C = math.ceil(layout.n_chunks / fold), layout.replicas, layout.rows_per_ct
    k = layout.shape[1]
    if not cts or len(cts) % chunks:
        raise ValueError(f"{len(cts)} products is not a positive multiple of {chunks} chunks")
    if parts == 1:
        decrypted = np.stack([_first_slots(backend.decrypt(ct), layout.ct_size) for ct in cts])
    elif parts == 2:
        slots = np.stack([_first_slots(backend.decrypt_complex(ct), layout.ct_size) for ct in cts])
        # (pair, chunk, part, slot) -> (pair, part, chunk, slot): group 2p's products, then group 2p + 1's
        decrypted = np.stack([slots.real, slots.imag], axis=1).reshape(-1, chunks, 2, layout.ct_size)
        decrypted = decrypted.transpose(0, 2, 1, 3).reshape(-1, layout.ct_size)
    else:
        raise ValueError(f"parts must be 1 or 2, got {parts}")
    if max_abs is not None and clip:
        decrypted = np.clip(np.nan_to_num(decrypted), -max_abs, max_abs)
    elif max_abs is not None and not np.all(np.abs(decrypted) <= max_abs):
        raise ValueError(f"a product decrypts outside the masked range [-{max_abs:g}, {max_abs:g}]")
    return decrypted.reshape(-1, chunks, R, C, k).sum(axis=(1, 3)).reshape(-1, k)


def _first_slots(values: np.ndarray, count: int) -> np.ndarray:
    if values.size < count:
        raise ValueError(f"product carries {values.size} slots, layout needs {count}")
    return values[:count]


def gradient_from_block_sums(sums: np.ndarray, mask_sums: np.ndarray, d: int) -> np.ndarray:
    """Unmask the key holder's block sums: (k, d) = δᵀX for the party's d features."""
    sums, mask_sums = np.asarray(sums, dtype=np.float64), np.asarray(mask_sums, dtype=np.float64)
    if sums.shape != mask_sums.shape or sums.ndim != 2:
        raise ValueError(f"block sums {sums.shape} and mask sums {mask_sums.shape} must be equal 2-D shapes")
    if not 1 <= d <= sums.shape[0]:
        raise ValueError(f"d must be in 1..{sums.shape[0]}, got {d}")
    return (sums - mask_sums)[:d].T
