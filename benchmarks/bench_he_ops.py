"""Micro-benchmarks of the HE primitives behind LR training step 5 (masked ct x pt gradients).

Prints one JSON document: per-ciphertext CKKS costs, the ``CKKSVector.mm`` trap next to the element-wise
fast path, and one full masked-gradient round (products, wire, block sums) for ckks versus plain.
Run with ``.venv/bin/python benchmarks/bench_he_ops.py``.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import tenseal as ts

from vflsec.services.crypto import entropy, he


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn`` in milliseconds, after one warm-up call."""
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return 1e3 * statistics.median(samples)


def _once_ms(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return 1e3 * (time.perf_counter() - start)


def _ckks_primitives(rng: np.random.Generator, repeats: int) -> dict[str, Any]:
    keyholder = he.make_keyholder("ckks")
    party = he.open_public("ckks", keyholder.public_context())
    values = rng.uniform(-1, 1, party.slots)
    factor = rng.normal(size=party.slots)
    mask = rng.uniform(-he.CKKS_MASK_BOUND, he.CKKS_MASK_BOUND, party.slots)
    fresh = party.encrypt(values)
    blob = party.serialize(fresh)
    received = keyholder.deserialize(blob)

    def masked_product() -> object:
        return party.add_plain(party.mul_plain(fresh, factor), mask, inplace=True)

    product_blob = party.serialize(masked_product())
    return {
        "slots": party.slots,
        "public_context_bytes": len(keyholder.public_context()),
        "fresh_ciphertext_bytes": len(blob),
        "product_ciphertext_bytes": len(product_blob),
        "encrypt_ms": _median_ms(lambda: party.encrypt(values), repeats),
        "decrypt_ms": _median_ms(lambda: keyholder.decrypt(received), repeats),
        "serialize_ms": _median_ms(lambda: party.serialize(fresh), repeats),
        "deserialize_ms": _median_ms(lambda: keyholder.deserialize(blob), repeats),
        "ct_times_pt_plus_mask_ms": _median_ms(masked_product, repeats),
        "deserialize_and_decrypt_product_ms": _median_ms(
            lambda: keyholder.decrypt(keyholder.deserialize(product_blob)), repeats
        ),
    }


def _mm_trap(rng: np.random.Generator) -> dict[str, Any]:
    """One ``CKKSVector.mm`` call (256 x 10) and one rotate-and-sum, on a context with Galois keys.

    The services' contexts deliberately carry no Galois keys; this throwaway context exists only to put a
    number on the path the protocol avoids.
    """
    ctx = ts.context(
        ts.SCHEME_TYPE.CKKS,
        poly_modulus_degree=he.CKKS_POLY_MODULUS_DEGREE,
        coeff_mod_bit_sizes=list(he.CKKS_COEFF_MOD_BIT_SIZES),
    )
    ctx.global_scale = 2.0**he.CKKS_SCALE_BITS
    galois_ms = _once_ms(ctx.generate_galois_keys)
    x, matrix = rng.normal(size=256), rng.normal(size=(256, 10))
    vector = ts.ckks_vector(ctx, x)
    start = time.perf_counter()
    result = vector.mm(matrix)
    mm_ms = 1e3 * (time.perf_counter() - start)
    full = ts.ckks_vector(ctx, rng.normal(size=he.SLOTS))
    return {
        "galois_keygen_ms": galois_ms,
        "mm_256x10_ms": mm_ms,
        "mm_256x10_max_abs_error": float(np.abs(np.asarray(result.decrypt()) - x @ matrix).max()),
        "rotate_and_sum_4096_ms": _once_ms(full.sum),
    }


def _gradient_round(name: str, n: int, d: int, k: int, seed: int, repeats: int) -> dict[str, Any]:
    """Masked δᵀX for one batch: party products -> wire -> key-holder block sums -> party unmasking."""
    keyholder = he.make_keyholder(name)
    party = he.open_public(name, keyholder.public_context())
    data_rng = np.random.default_rng(seed)
    delta, features = data_rng.uniform(-1, 1, (n, k)), data_rng.normal(size=(n, d))
    replicas = he.choose_replicas(n, k, d, party.slots)
    encrypted_delta = he.encrypt_matrix(party, delta, replicas)
    layout = encrypted_delta.layout
    mask_rng = entropy.keyed_stream(entropy.new_key(), "bench", seed)  # the services' mask source

    products, mask_sums = he.masked_feature_products(party, encrypted_delta, features, mask_rng)
    blobs = [party.serialize(ct) for ct in products]
    received = he.deserialize_all(keyholder, blobs, layout.ct_size)
    sums = he.block_sums(keyholder, received, layout)
    gradient = he.gradient_from_block_sums(sums, mask_sums, d)
    expected = delta.T @ features

    def wire() -> list[he.Ct]:
        return he.deserialize_all(keyholder, [party.serialize(ct) for ct in products], layout.ct_size)

    products_ms = _median_ms(lambda: he.masked_feature_products(party, encrypted_delta, features, mask_rng), repeats)
    wire_ms = _median_ms(wire, repeats)
    block_sums_ms = _median_ms(lambda: he.block_sums(keyholder, received, layout), repeats)
    return {
        "replicas": replicas,
        "rows_per_ct": layout.rows_per_ct,
        "n_products": len(products),
        "bytes_to_keyholder": sum(len(b) for b in blobs),
        "masked_products_ms": products_ms,
        "wire_roundtrip_ms": wire_ms,
        "block_sums_ms": block_sums_ms,
        "total_ms": products_ms + wire_ms + block_sums_ms,
        # One step's mask draw: the services' AES-CTR stream and OS entropy next to numpy's PCG64.
        "mask_draw_ms": {
            "aes_ctr": _median_ms(lambda: mask_rng.uniform(-1.0, 1.0, (len(products), layout.ct_size)), repeats),
            "os_urandom": _median_ms(
                lambda: entropy.os_entropy().uniform(-1.0, 1.0, (len(products), layout.ct_size)), repeats
            ),
            "pcg64": _median_ms(
                lambda: data_rng.uniform(-1.0, 1.0, (len(products), layout.ct_size)), repeats
            ),
        },
        "max_relative_error": float(np.abs(gradient - expected).max() / np.abs(expected).max()),
    }


def run(repeats: int = 5, seed: int = 0) -> dict[str, Any]:
    """All measurements in one process so the numbers are comparable side by side."""
    rng = np.random.default_rng(seed)
    batch = {"n": 1024, "d": 12, "k": 1}
    rounds = {name: _gradient_round(name, **batch, seed=seed, repeats=repeats) for name in ("ckks", "plain")}
    return {
        "ckks_per_ciphertext": _ckks_primitives(rng, repeats),
        "ckks_mm_trap": _mm_trap(rng),
        "gradient_round": {"batch": batch, **rounds},
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
