"""Zero-sum masks in Z_2^64 (services/crypto/ring_mask.py): one stream per key and context, bound to the rows; they
cancel exactly in a sum, and a share alone decodes to values unrelated to what it carries."""

from __future__ import annotations

import numpy as np
import pytest

from vflsec.services.crypto import entropy, ring_mask


def test_masks_are_bound_to_their_key_context_and_rows() -> None:
    key, rows = entropy.new_key(), np.arange(100, 400)
    mask = ring_mask.share_mask(key, "s", 7, "q", rows, 3)
    assert mask.shape == (300, 3) and mask.dtype == np.uint64
    np.testing.assert_array_equal(ring_mask.share_mask(key, "s", 7, "q", rows.copy(), 3), mask)  # both ends agree
    for other in (
        ring_mask.share_mask(entropy.new_key(), "s", 7, "q", rows, 3),
        ring_mask.share_mask(key, "t", 7, "q", rows, 3),
        ring_mask.share_mask(key, "s", 8, "q", rows, 3),  # the same query id after retraining: a new mask
        ring_mask.share_mask(key, "s", 7, "r", rows, 3),
        ring_mask.share_mask(key, "s", 7, "q", rows[::-1], 3),
        ring_mask.embedding_mask(key, "s", 7, bytes(16), rows, 3),  # a training embedding's mask is another stream
        ring_mask.embedding_mask(key, "s", 7, bytes(15) + b"\1", rows, 3),  # another forward's nonce, another pad
    ):
        assert (other != mask).mean() > 0.99
    # Uniform words: each of the 64 bits is set about half the time.
    bits = np.unpackbits(mask.view(np.uint8))
    assert abs(bits.mean() - 0.5) < 0.01


def test_masks_cancel_exactly_and_a_share_alone_says_nothing() -> None:
    rng = np.random.default_rng(1)
    own, z_1, z_2 = (rng.normal(0.0, 3.0, (2000, 3)) for _ in range(3))
    rows = np.arange(2000)
    r_1, r_2 = (ring_mask.share_mask(entropy.new_key(), "s", 1, "q", rows, 3) for _ in range(2))
    shares = [ring_mask.encode(own) - r_1 - r_2, ring_mask.encode(z_1) + r_1, ring_mask.encode(z_2) + r_2]
    total = shares[0] + shares[1] + shares[2]
    assert np.abs(ring_mask.decode(total) - (own + z_1 + z_2)).max() <= 1.5 * 2.0**-24  # the fixed point only
    for share, z in zip(shares[1:], (z_1, z_2), strict=True):
        seen = ring_mask.decode(share)
        assert abs(np.corrcoef(seen.ravel(), z.ravel())[0, 1]) < 0.1
    with pytest.raises(ValueError, match="words are"):
        ring_mask.from_bytes(b"\0" * 7, (1, 1), "share")
