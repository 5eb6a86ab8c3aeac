"""LR's gradient products over up to two chunks of δ a product (masking.gradient_fold, session 22)."""

from __future__ import annotations

import numpy as np
import pytest
import tenseal.sealapi as sealapi

from vflsec.services.crypto import entropy, he, masking
from vflsec.services.models.lr.trainers import LrKeyHolder, gradient_replicas, masked_gradient


@pytest.fixture(scope="module")
def keys() -> tuple[he.CkksBackend, he.CkksBackend]:
    keyholder = he.CkksBackend.keyholder()
    return keyholder, he.CkksBackend.from_public_context(keyholder.public_context())


def _replicas(n: int, widest: int) -> int:
    return gradient_replicas(he.make_keyholder("ckks"), n, 1, widest)


def test_the_fold_is_every_chunk_up_to_two() -> None:
    for n, chunks, fold in [(500, 1, 1), (1024, 2, 2), (30_000, 8, 2)]:
        layout = he.MatrixLayout.for_matrix((n, 1), 1 if n > 1024 else 8, he.SLOTS)
        assert layout.n_chunks == chunks and masking.gradient_fold(layout) == fold


def test_at_batch_1024_each_party_sends_one_product_where_it_sent_two() -> None:
    """Credit's widths (13 with the bias, 11): R = 7 over two chunks, one product a party; unfolded, R = 4 over one
    chunk and two products a party."""
    replicas = _replicas(1024, 13)
    layout = he.MatrixLayout.for_matrix((1024, 1), replicas, he.SLOTS)
    assert (replicas, layout.n_chunks) == (7, 2)
    fold = masking.gradient_fold(layout)
    assert [masking.product_count(w, layout, fold=fold, parts=2) for w in (13, 11)] == [1, 1]
    before = he.MatrixLayout.for_matrix((1024, 1), he.choose_replicas(1024, 1, 13, he.SLOTS, parts=2), he.SLOTS)
    assert (before.replicas, before.n_chunks) == (4, 1)
    assert [masking.product_count(w, before, parts=2) for w in (13, 11)] == [2, 2]


@pytest.mark.parametrize("n", [1024, 30_000])
def test_folded_products_open_to_the_gradient_at_the_feature_bound(keys, n: int) -> None:
    """|x| = 64 (the parties' bound) under masks twice as wide: the key holder's slots stay inside its clip bound
    fold · (2^24 + 64) + 1 (block_sums refuses any outside it here), and the opened δᵀX's error stays 2^10 below
    the flooding, as unfolded products' does (test_he_forms)."""
    keyholder, party = keys
    rng = np.random.default_rng(n)
    delta, X = rng.uniform(-1.0, 1.0, (n, 1)), rng.choice([-64.0, 64.0], (n, 13))
    made = he.encrypt_matrix(keyholder, delta, _replicas(n, 13), form=he.LOWERED)
    sent = he.matrix_from_wire(party, he.matrix_to_wire(keyholder, made))
    fold = masking.gradient_fold(sent.layout)
    bound = fold * he.CKKS_MASK_BOUND
    products, mask_sums = masking.masked_feature_products(
        party, sent, X, entropy.os_entropy(), fold=fold, widening=fold, parts=2
    )
    assert fold == 2 and len(products) == masking.product_count(13, sent.layout, fold=fold, parts=2)
    opened = [keyholder.deserialize(party.serialize(ct)) for ct in products]
    keyholder.check_form(opened, product=True, form=he.LOWERED)
    clip = bound + fold * he.FEATURE_BOUND + 1.0
    slots = np.concatenate([keyholder.decrypt_complex(ct) for ct in opened])
    assert np.abs(slots.real).max() <= clip and np.abs(slots.imag).max() <= clip
    assert np.abs(slots.real).max() > he.CKKS_MASK_BOUND  # the masks are as wide as the fold
    sums = masking.block_sums(keyholder, opened, sent.layout, max_abs=clip, fold=fold, parts=2)
    gradient = masking.gradient_from_block_sums(sums[:13], mask_sums[:13], 13)
    assert np.abs(gradient - delta.T @ X).max() < he.BLOCK_SUM_FLOODING / 2**10


def test_a_fold_the_masks_do_not_cover_is_refused(keys) -> None:
    """The default masks hide one product of |δ·x| <= 64 a slot: two chunks at |x| = 64 need masks twice as wide."""
    keyholder, party = keys
    delta, X = np.full((1024, 1), 0.5), np.full((1024, 2), 64.0)
    sent = he.matrix_from_wire(
        party, he.matrix_to_wire(keyholder, he.encrypt_matrix(keyholder, delta, 7, form=he.LOWERED))
    )
    with pytest.raises(ValueError, match=r"fold · \|x\| <= 64 \(the masks hide no more\)"):
        masking.masked_feature_products(party, sent, X, entropy.os_entropy(), fold=2, parts=2)
    products, _ = masking.masked_feature_products(party, sent, X, entropy.os_entropy(), fold=2, widening=2, parts=2)
    assert len(products) == 1
    # in the clear (no masks, nothing hidden) the same features and fold pass the same check: the plain baseline
    # sends what CKKS sends (review 27, F1: it refused |x| > 32)
    plain = he.make_keyholder("plain")
    em = he.encrypt_matrix(plain, delta, 7, form=he.LOWERED)
    products, _ = masking.masked_feature_products(plain, em, X, entropy.os_entropy(), fold=2, widening=2)
    assert len(products) == 1  # the count CKKS sends: its two columns are one group at R = 7, both chunks folded


@pytest.mark.parametrize("backend", ["ckks", "plain"])
def test_the_trainers_round_trip_folds_under_masks_as_wide(keys, backend: str) -> None:
    """lr.trainers.masked_gradient at batch 1,024 and |x| = 64: one product a party over two chunks, its CKKS slots past
    one mask's width (the masks are two wide), and the gradient the key holder's block sums give (review 27)."""
    keyholder = keys[0] if backend == "ckks" else he.make_keyholder("plain")
    party = keys[1] if backend == "ckks" else keyholder
    rng = np.random.default_rng(5)
    delta, x = rng.uniform(-1.0, 1.0, (1024, 1)), rng.choice([-64.0, 64.0], (1024, 13))
    made = he.encrypt_matrix(keyholder, delta, _replicas(1024, 13), form=he.LOWERED)
    sent = he.matrix_from_wire(party, he.matrix_to_wire(keyholder, made))
    seen: list[int] = []

    def block_sums(blobs: list[bytes], width: int, tag: bytes) -> np.ndarray:
        cts = [keyholder.deserialize(b) for b in blobs]
        seen.append(len(cts))
        if backend == "ckks":
            assert max(np.abs(keyholder.decrypt_complex(ct)).max() for ct in cts) > he.CKKS_MASK_BOUND
        return LrKeyHolder.block_sums(keyholder, cts, sent.layout, width)

    gradient = masked_gradient(party, sent, x, bytes(32), "s", 1, b"digest", block_sums)
    assert seen == [1 if backend == "ckks" else 2]  # two groups: one product under CKKS, a product each in the clear
    atol = he.BLOCK_SUM_FLOODING if backend == "ckks" else 1e-9
    np.testing.assert_allclose(gradient * len(x), delta.T @ x, atol=atol)


@pytest.mark.parametrize("form", [he.LOWERED, he.OPERAND])
def test_a_crafted_transparent_pair_of_chunks_is_kept_whatever_the_values(keys, form: he.Form) -> None:
    """Review 27 and 28, F3: chunks crafted with c1_b = −c1_a cancel in c1 where a party's values agree across them;
    such a partial sum was dropped (a value-dependent zero). Every sum (LR's kept products, trees' rescaled ones)
    starts from its re-randomising zero: both kept."""
    keyholder, _ = keys
    seal = keyholder._seal()
    a = he.encrypt_matrix(keyholder, np.full((he.SLOTS, 1), 0.5), 1, form=form).ciphertexts[0]
    raw = a.ciphertext()[0]
    negated = sealapi.Ciphertext()
    seal.evaluator.negate(raw, negated)  # (−c0_a, −c1_a)
    one = sealapi.Plaintext()
    seal.encoder.encode([1.0] * he.SLOTS, negated.parms_id(), negated.scale, one)
    seal.evaluator.add_plain_inplace(negated, one)  # decrypts to 1 − 0.5, c1 = −c1_a
    b = keyholder._vector(negated, he.SLOTS)
    for other in (3.0, 5.0):
        out = keyholder.masked_sum([a, b], [np.full(he.SLOTS, 3.0), np.full(he.SLOTS, other)], np.zeros(he.SLOTS))
        np.testing.assert_allclose(np.real(keyholder.decrypt(out))[:8], 0.5 * 3.0 + 0.5 * other, atol=1e-4)
