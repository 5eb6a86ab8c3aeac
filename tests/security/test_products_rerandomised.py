"""Review 20, F3: a masked product's mask changes only its c0, so before products were re-randomised their c1 was
(rescaled) c1 of [[δ]] times the party's plaintext. In LR the key holder made [[p]], hence knows c1 of
[[δ]] = [[p]] - y (a plaintext subtraction keeps c1), and tested guesses of a passive party's plaintext exactly: a
sparse binary column's one row out of 512, whatever the masks. Each product now carries a fresh encryption of zero.

Review 24: the key holder's guesses are made as the party makes its products (since session 19 [[p]] in the lowered
form, he.LOWERED, and each plaintext encoded at 2^PRODUCT_PLAIN_SCALE_BITS, the product not rescaled); a product that
is not re-randomised is found by them, so the check can fail (before, guesses encoded at 2^40 matched no product,
re-randomised or not)."""

import numpy as np
import tenseal.sealapi as sealapi

from vflsec.services.crypto import entropy, he, masking


def _matches(seal, sent: sealapi.Ciphertext, guess: sealapi.Ciphertext) -> bool:
    """Whether the key holder's guessed product has the sent product's c1: their difference is transparent."""
    difference = sealapi.Ciphertext()
    try:
        seal.evaluator.sub(sent, guess, difference)
    except RuntimeError as exc:  # SEAL refuses a transparent result
        return "transparent" in str(exc)
    return difference.is_transparent()


def _product(seal, raw: sealapi.Ciphertext, values: np.ndarray, mask: np.ndarray | None = None):
    """raw x values as a party multiplies [[δ]] (+ mask): a masked product without re-randomisation, or a guess."""
    plain, product = sealapi.Plaintext(), sealapi.Ciphertext()
    seal.encoder.encode(values.tolist(), raw.parms_id(), 2.0**he.PRODUCT_PLAIN_SCALE_BITS, plain)
    seal.evaluator.multiply_plain(raw, plain, product)
    if mask is not None:
        masked = sealapi.Plaintext()
        seal.encoder.encode(mask.tolist(), product.parms_id(), product.scale, masked)
        seal.evaluator.add_plain_inplace(product, masked)
    return product


def test_a_key_holder_knowing_deltas_c1_cannot_test_guesses_of_the_plaintext() -> None:
    keys = he.CkksBackend.keyholder()
    party = he.CkksBackend.from_public_context(keys.public_context())
    rng, n = np.random.default_rng(7), 256
    p = he.encrypt_matrix(keys, rng.uniform(0, 1, (n, 1)), 1, form=he.LOWERED)  # the key holder's [[p]]
    y = rng.integers(0, 2, (n, 1)).astype(float)
    delta = he.matrix_from_wire(party, he.matrix_to_wire(party, he.add_plain_matrix(party, p, -y)))
    X = np.zeros((n, 1))
    secret = int(rng.integers(n))
    X[secret, 0] = 1.0  # a sparse binary column: which row holds the 1 is the party's secret
    parts = masking.product_parts(party)
    products, mask_sums = masking.masked_feature_products(party, delta, X, entropy.os_entropy(), parts=parts)
    sent = keys.deserialize(party.serialize(products[0])).ciphertext()[0]
    seal, raw_p = keys._seal(), p.ciphertexts[0].ciphertext()[0]
    guesses = [_product(seal, raw_p, np.eye(1, n, row)[0]) for row in range(n)]
    assert sent.coeff_modulus_size() == guesses[0].coeff_modulus_size() and sent.scale == guesses[0].scale
    # Control: the same product without re-randomisation is found, at the secret row only.
    raw_delta = delta.ciphertexts[0].ciphertext()[0]
    bare = _product(party._seal(), raw_delta, X[:, 0], rng.uniform(-(2.0**24), 2.0**24, n))
    assert [row for row, guess in enumerate(guesses) if _matches(seal, bare, guess)] == [secret]
    assert not any(_matches(seal, sent, guess) for guess in guesses)
    # The product still opens to δᵀx.
    opened = [keys.deserialize(party.serialize(ct)) for ct in products]
    sums = masking.block_sums(keys, opened, delta.layout, parts=parts)
    gradient = masking.gradient_from_block_sums(sums[:1], mask_sums, 1)
    expected = (he.decrypt_matrix(keys, delta).T @ X)[0, 0]
    assert abs(gradient[0, 0] - expected) < 1e-4
