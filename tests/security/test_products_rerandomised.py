"""Review 20, F3: a masked product's mask changes only its c0, so before products were re-randomised their c1 was
(rescaled) c1 of [[δ]] times the party's plaintext. In LR the key holder made [[p]], hence knows c1 of
[[δ]] = [[p]] - y (a plaintext subtraction keeps c1), and tested guesses of a passive party's plaintext exactly: a
sparse binary column's one row out of 512, whatever the masks. Each product now carries a fresh encryption of zero."""

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


def test_a_key_holder_knowing_deltas_c1_cannot_test_guesses_of_the_plaintext() -> None:
    keys = he.CkksBackend.keyholder()
    party = he.CkksBackend.from_public_context(keys.public_context())
    rng, n = np.random.default_rng(7), 256
    p = he.encrypt_matrix(keys, rng.uniform(0, 1, (n, 1)), 1)  # the key holder's [[p]]
    y = rng.integers(0, 2, (n, 1)).astype(float)
    delta = he.matrix_from_wire(party, he.matrix_to_wire(party, he.add_plain_matrix(party, p, -y)))
    X = np.zeros((n, 1))
    secret = int(rng.integers(n))
    X[secret, 0] = 1.0  # a sparse binary column: which row holds the 1 is the party's secret
    products, mask_sums = masking.masked_feature_products(party, delta, X, entropy.os_entropy())
    sent = keys.deserialize(party.serialize(products[0])).ciphertext()[0]
    seal, raw_p = keys._seal(), p.ciphertexts[0].ciphertext()[0]
    hits = []
    for row in range(n):
        plain = sealapi.Plaintext()
        seal.encoder.encode(np.eye(1, n, row)[0].tolist(), raw_p.parms_id(), keys._ctx.global_scale, plain)
        guess = sealapi.Ciphertext()
        seal.evaluator.multiply_plain(raw_p, plain, guess)
        seal.evaluator.rescale_to_next_inplace(guess)
        guess.scale = keys._ctx.global_scale
        hits.append(_matches(seal, sent, guess))
    assert not any(hits)
    # The product still opens to δᵀx.
    sums = masking.block_sums(keys, [keys.deserialize(party.serialize(ct)) for ct in products], delta.layout)
    gradient = masking.gradient_from_block_sums(sums, mask_sums, 1)
    expected = (he.decrypt_matrix(keys, delta).T @ X)[0, 0]
    assert abs(gradient[0, 0] - expected) < 1e-4
