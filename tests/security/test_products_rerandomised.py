"""Review 20, F3: a masked product's mask changes only its c0, so before products were re-randomised their c1 was
(rescaled) c1 of [[δ]] times the party's plaintext. In LR the key holder made [[p]], hence knows c1 of
[[δ]] = [[p]] - y (a plaintext subtraction keeps c1), and tested guesses of a passive party's plaintext exactly: a
sparse binary column's one row out of 512, whatever the masks. Each product now carries a fresh encryption of zero.

Review 24: the key holder's guesses are made as the party makes its products (plaintext encoded at the scale of the
prime the rescale drops, [[p]] as the key holder makes it); a product that is not re-randomised is found by them, so the
check can fail (before, guesses encoded at 2^40 matched no product, re-randomised or not)."""

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


def _product(seal, raw: sealapi.Ciphertext, values: np.ndarray, scale: float, mask: np.ndarray | None = None):
    """raw x values, rescaled to raw's scale (+ mask): a masked product without re-randomisation, or a guess."""
    plain, product = sealapi.Plaintext(), sealapi.Ciphertext()
    seal.encoder.encode(values.tolist(), raw.parms_id(), scale, plain)
    seal.evaluator.multiply_plain(raw, plain, product)
    seal.evaluator.rescale_to_next_inplace(product)
    product.scale = raw.scale
    if mask is not None:
        masked = sealapi.Plaintext()
        seal.encoder.encode(mask.tolist(), product.parms_id(), product.scale, masked)
        seal.evaluator.add_plain_inplace(product, masked)
    return product


def test_a_key_holder_knowing_deltas_c1_cannot_test_guesses_of_the_plaintext() -> None:
    keys = he.CkksBackend.keyholder()
    party = he.CkksBackend.from_public_context(keys.public_context())
    rng, n = np.random.default_rng(7), 256
    p = he.encrypt_matrix(keys, rng.uniform(0, 1, (n, 1)), 1, ahead=True)  # the key holder's [[p]]
    y = rng.integers(0, 2, (n, 1)).astype(float)
    delta = he.matrix_from_wire(party, he.matrix_to_wire(party, he.add_plain_matrix(party, p, -y)))
    X = np.zeros((n, 1))
    secret = int(rng.integers(n))
    X[secret, 0] = 1.0  # a sparse binary column: which row holds the 1 is the party's secret
    parts = masking.product_parts(party)
    products, mask_sums = masking.masked_feature_products(party, delta, X, entropy.os_entropy(), parts=parts)
    sent = keys.deserialize(party.serialize(products[0])).ciphertext()[0]
    seal, raw_p = keys._seal(), p.ciphertexts[0].ciphertext()[0]
    scale = keys._last_prime(raw_p)  # the party encodes its plaintext at the scale of the prime its rescale drops
    guesses = [_product(seal, raw_p, np.eye(1, n, row)[0], scale) for row in range(n)]
    assert sent.coeff_modulus_size() == guesses[0].coeff_modulus_size() and sent.scale == guesses[0].scale
    # Control: the same product without re-randomisation is found, at the secret row only.
    raw_delta = delta.ciphertexts[0].ciphertext()[0]
    bare = _product(party._seal(), raw_delta, X[:, 0], scale, rng.uniform(-(2.0**24), 2.0**24, n))
    assert [row for row, guess in enumerate(guesses) if _matches(seal, bare, guess)] == [secret]
    assert not any(_matches(seal, sent, guess) for guess in guesses)
    # The product still opens to δᵀx.
    opened = [keys.deserialize(party.serialize(ct)) for ct in products]
    sums = masking.block_sums(keys, opened, delta.layout, parts=parts)
    gradient = masking.gradient_from_block_sums(sums[:1], mask_sums, 1)
    expected = (he.decrypt_matrix(keys, delta).T @ X)[0, 0]
    assert abs(gradient[0, 0] - expected) < 1e-4
