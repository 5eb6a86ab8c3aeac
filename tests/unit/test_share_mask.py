"""Share masks (services/crypto/share_mask.py): one stream per (key, session, step, query, rows), cancelling in a CKKS
sum to the CKKS noise floor."""

from __future__ import annotations

import numpy as np

from vflsec.services.crypto import entropy, he
from vflsec.services.crypto.share_mask import share_mask


def test_masks_are_bound_to_their_nonce_and_uniform_in_the_bound() -> None:
    key, rows = entropy.new_key(), np.arange(100, 400)
    mask = share_mask(key, 2.0**24, "s", 7, "q", rows, 3)
    assert mask.shape == (300, 3) and np.abs(mask).max() <= 2.0**24
    assert np.median(np.abs(mask)) > 2.0**22  # uniform in ±2^24: median 2^23
    np.testing.assert_array_equal(share_mask(key, 2.0**24, "s", 7, "q", rows.copy(), 3), mask)  # both ends agree
    for other in (
        share_mask(entropy.new_key(), 2.0**24, "s", 7, "q", rows, 3),
        share_mask(key, 2.0**24, "t", 7, "q", rows, 3),
        share_mask(key, 2.0**24, "s", 8, "q", rows, 3),  # the same query id after retraining: a new mask
        share_mask(key, 2.0**24, "s", 7, "r", rows, 3),
        share_mask(key, 2.0**24, "s", 7, "q", rows[::-1], 3),
    ):
        assert np.abs(other - mask).min() > 0


def test_masks_cancel_in_a_ckks_sum_to_the_noise_floor() -> None:
    keys = he.make_keyholder("ckks")
    rng = np.random.default_rng(1)
    own, share_1, share_2 = (rng.normal(0.0, 3.0, (2000, 3)) for _ in range(3))
    z, rows = own + share_1 + share_2, np.arange(2000)

    def decrypted_sum(bound: float) -> np.ndarray:
        r_1, r_2 = (share_mask(entropy.new_key(), bound, "s", 1, "q", rows, 3) for _ in range(2))
        total = he.encrypt_matrix(keys, own - r_1 - r_2)
        for share in (share_1 + r_1, share_2 + r_2):
            total = he.add_matrices(keys, total, he.encrypt_matrix(keys, share))
        return he.decrypt_matrix(keys, total)

    plain_error = np.abs(decrypted_sum(0.0) - z).max()
    masked_error = np.abs(decrypted_sum(keys.default_mask_bound) - z).max()
    assert keys.default_mask_bound == 2.0**24
    assert masked_error < 1e-7 and masked_error < 10 * plain_error, (masked_error, plain_error)
