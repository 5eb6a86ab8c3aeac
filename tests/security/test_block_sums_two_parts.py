"""Issue 32: LR's masked products carry two feature groups each under CKKS (real and imaginary parts), as trees' do.

The key holder admits exactly ceil(ceil(width / R) / 2) x n_chunks products under CKKS (one group a product under
the plain backend): the former count, one group a product, is refused before anything is decrypted, naming the
count it expects. Both parts are range-checked, and the gradient the party unmasks matches the plain backend's
within the flooding. Engine-level, over real TenSEAL keys: the coordinator's admission is what is under test.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.security.test_restart_policy import TAG, WIDTHS, _coordinator, _open, _scores, _zeros
from vflsec.services.crypto import he, masking
from vflsec.services.errors import InvalidArgument
from vflsec.services.models.lr.trainers import LrKeyHolder

X = {
    party: np.random.default_rng(i).uniform(0.0, 1.0, (8, width)) for i, (party, width) in enumerate(WIDTHS.items())
}


def _request(keys: he.Backend, probs: he.EncryptedMatrix, x: np.ndarray, parts: int) -> tuple[list[bytes], np.ndarray]:
    cts, mask_sums = masking.masked_feature_products(keys, probs, x, np.random.default_rng(), parts=parts)
    return [keys.serialize(ct) for ct in cts], mask_sums


def _gradients(tmp_path, backend: str) -> dict[str, np.ndarray]:
    """Every party's δᵀX through the coordinator (δ = p = 0.5, R = 1: a group is a column)."""
    c = _coordinator(tmp_path / backend, allowed_backends=("ckks", "plain"))
    _open(c, backend)
    keys, probs = c.sessions["s"].backend, _scores(c)
    parts = masking.product_parts(keys)
    assert probs.layout.replicas == 1 and parts == (2 if backend == "ckks" else 1)
    gradients = {}
    for party, x in X.items():
        width = x.shape[1]
        if parts == 2:
            # The former count, one group a product: refused before anything is decrypted (the step's one answer
            # stays unspent: the party's right request below is answered), naming the count expected.
            old, _ = _request(keys, probs, x, parts=1)
            assert len(old) == width
            expected = -(-width // 2)
            with pytest.raises(InvalidArgument, match=f"2 feature group.* is {expected} ciphertexts, got {width}"):
                c.block_sums("s", 1, party, old, width, TAG)
        blobs, mask_sums = _request(keys, probs, x, parts)
        assert len(blobs) == masking.product_count(width, probs.layout, parts=parts)
        sums = c.block_sums("s", 1, party, blobs, width, TAG)
        gradients[party] = masking.gradient_from_block_sums(sums, mask_sums[:width], width)
    return gradients


def test_two_groups_a_product_give_the_plain_gradient_and_the_old_count_is_refused(tmp_path) -> None:
    # The active party's 3 columns are an odd number of groups: its last product's imaginary part is an empty group.
    ckks, plain = _gradients(tmp_path, "ckks"), _gradients(tmp_path, "plain")
    for party, x in X.items():
        exact = np.full((8, 1), 0.5).T @ x
        np.testing.assert_allclose(plain[party], exact, atol=1e-9)
        np.testing.assert_allclose(ckks[party], plain[party], atol=8 * he.BLOCK_SUM_FLOODING)
        assert not np.array_equal(ckks[party], plain[party])  # flooded: the CKKS sums did go through the key holder


def test_a_product_out_of_range_in_its_imaginary_part_alone_is_clipped(tmp_path) -> None:
    # Clipped in either part, never refused: a refusal told an owner with a crafted δ whether x was nonzero (review
    # 24, F3); a clipped slot releases nothing beyond the bound.
    c = _coordinator(tmp_path)
    _open(c)
    keys, probs = c.sessions["s"].backend, _scores(c)
    size, rows = probs.layout.ct_size, probs.layout.shape[0]
    # passive-1's 2 columns at R = 1: one product, real part in range, imaginary part masked by 2^30 > 2^24 + 65.
    loud = keys.masked_sum(probs.ciphertexts, [np.full(size, 1 + 1j)], np.full(size, 1j * 2.0**30))
    assert np.abs(keys.decrypt(loud)).max() < 2.0  # the real parts alone are in range
    sums = c.block_sums("s", 1, "passive-1", [keys.serialize(loud)], 2, TAG)
    bound = keys.default_mask_bound + he.FEATURE_BOUND + 1.0
    assert abs(sums[0, 0] - 0.5 * rows) < 1.0  # the real group, in range: its sums as sent (p = 0.5, x = 1)
    assert abs(sums[1, 0] - bound * rows) < 1.0  # the imaginary group: every slot clipped to the bound
    # The key holder's step alone clips it too, whatever called it.
    assert abs(LrKeyHolder.block_sums(keys, [loud], probs.layout, 2)[1, 0] - bound * rows) < 1e-3


def test_two_chunks_a_product_are_admitted_as_one_and_the_unfolded_count_is_refused(tmp_path) -> None:
    """Session 22 (masking.gradient_fold): at 1,024 rows and R = 7, δ spans two chunks and a party's two columns make
    one product adding both, under masks twice as wide; its former count (a product a chunk) is refused before
    anything is decrypted, naming the count expected, and the folded product opens to the gradient (p = 0.5)."""
    c = _coordinator(tmp_path)
    _open(c)
    n, rows = 1024, np.arange(1024)
    c.family_call("s", "passive-1", "submit_training_share", step=1, sample_index=rows, share=_zeros(n))
    keys = c.sessions["s"].backend
    probs = he.matrix_from_wire(keys, c.training_scores("s", 1, _zeros(n), 7, rows, WIDTHS))
    assert probs.layout.n_chunks == 2 and masking.gradient_fold(probs.layout) == 2
    rng = np.random.default_rng(3)
    x = rng.uniform(-64.0, 64.0, (n, 2))
    unfolded, _ = masking.masked_feature_products(keys, probs, x, rng, parts=2)
    assert len(unfolded) == 2
    with pytest.raises(InvalidArgument, match="over 2 chunks added 2 a product, is 1 ciphertexts, got 2"):
        c.block_sums("s", 1, "passive-1", [keys.serialize(ct) for ct in unfolded], 2, TAG)
    folded, mask_sums = masking.masked_feature_products(keys, probs, x, rng, fold=2, widening=2, parts=2)
    sums = c.block_sums("s", 1, "passive-1", [keys.serialize(ct) for ct in folded], 2, TAG)
    gradient = masking.gradient_from_block_sums(sums, mask_sums[:2], 2)
    np.testing.assert_allclose(gradient, 0.5 * x.sum(axis=0, keepdims=True), atol=8 * he.BLOCK_SUM_FLOODING)
