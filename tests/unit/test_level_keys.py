"""Encryptions of zero made at a level's primes under the public key restricted to them (services/crypto/level_keys)."""

from __future__ import annotations

import numpy as np
import pytest
import tenseal.sealapi as sealapi

from vflsec.services.crypto import he
from vflsec.services.crypto.level_keys import LevelEncryptors, ZeroReserve, load_bytes, save_bytes


@pytest.fixture(scope="module")
def keys() -> he.CkksBackend:
    return he.CkksBackend.keyholder()


def _levels(context: sealapi.SEALContext) -> list:
    level, found = context.first_context_data(), []
    while level is not None:
        found.append(level)
        level = level.next_context_data()
    return found


def _slots(keys: he.CkksBackend, zero: sealapi.Ciphertext) -> np.ndarray:
    seal = keys._seal()
    plain = sealapi.Plaintext()
    seal.decryptor.decrypt(zero, plain)
    return np.asarray(seal.encoder.decode_complex(plain))


def test_a_zero_made_at_each_level_decrypts_to_zero_under_the_key_holders_secret(keys: he.CkksBackend) -> None:
    """At every data level (3, 2, 1 primes): the level's parameters and NTT form, and under the one secret key the
    slot noise of an encryption (std ~2^14 at scale 1; below 2^19 in every slot), not a value."""
    context = keys._ctx.data.seal_context()
    zeros = LevelEncryptors(context, keys._ctx.public_key().data)
    for level in _levels(context):
        zero = sealapi.Ciphertext()
        zeros.encrypt_zero(level.parms_id(), zero)
        assert zero.parms_id() == level.parms_id() and zero.size() == 2 and zero.is_ntt_form()
        assert zero.coeff_modulus_size() == len(level.parms().coeff_modulus())
        zero.scale = 1.0
        noise = np.abs(_slots(keys, zero))
        assert 2.0**10 < noise.std() < 2.0**16 and noise.max() < 2.0**19


def test_zeros_are_fresh_draws_of_the_process_entropy(keys: he.CkksBackend) -> None:
    """Rule 1: no seed crosses into the restricted key's context. Two zeros of one encryptor, and the first zeros
    of two encryptors made from the same public key, all differ in both polynomials."""
    context = keys._ctx.data.seal_context()
    level = context.first_context_data().next_context_data()
    made = []
    for _ in range(2):
        zeros = LevelEncryptors(context, keys._ctx.public_key().data)
        for _ in range(2):
            zero = sealapi.Ciphertext()
            zeros.encrypt_zero(level.parms_id(), zero)
            made.append(save_bytes(zero))
    assert len(set(made)) == 4
    c1 = []
    for blob in made:
        ct = sealapi.Ciphertext()
        load_bytes(ct, context, blob)
        c1.append(ct.data(1))  # the first coefficient of the second polynomial
    assert len(set(c1)) == 4


def test_lowered_products_are_re_randomised_by_a_direct_zero_and_open_exactly(keys: he.CkksBackend) -> None:
    """LR's products (LOWERED, kept at 2^72 over two primes) take their re-randomiser from the restricted key: the
    product opens to within 1e-6 of δ·x + mask, and two products of the same operands and plaintexts differ in c1."""
    party = he.CkksBackend.from_public_context(keys.public_context())
    rng = np.random.default_rng(1)
    delta = rng.uniform(-1, 1, 4096)
    x = rng.uniform(-64, 64, 4096)
    mask = rng.uniform(-he.CKKS_MASK_BOUND, he.CKKS_MASK_BOUND, 4096) * (1 + 1j)
    ct = party.deserialize(keys.serialize(keys.encrypt(delta, form=he.LOWERED)))
    products = [party.masked_sum([ct], [x], mask) for _ in range(2)]
    raws = [p.ciphertext()[0] for p in products]
    assert raws[0].coeff_modulus_size() == 2 and raws[0].scale == 2.0**72
    assert raws[0].data(1) != raws[1].data(1)
    for p in products:
        opened = keys.decrypt_complex(keys.deserialize(party.serialize(p))) - mask
        np.testing.assert_allclose(opened.real, delta * x, atol=1e-6)


def test_a_reserve_hands_each_zero_out_once_and_holds_at_most_its_cap(keys: he.CkksBackend) -> None:
    """ZeroReserve: fill makes up to count (capped at HELD) per kind and level; take pops each once, then None."""
    context = keys._ctx.data.seal_context()
    level = context.first_context_data().next_context_data()
    zeros, made = LevelEncryptors(context, keys._ctx.public_key().data), []

    def make(zero: sealapi.Ciphertext) -> None:
        zeros.encrypt_zero(level.parms_id(), zero)
        made.append(zero)

    reserve = ZeroReserve()
    reserve.fill("public", level.parms_id(), 2, make)
    reserve.fill("public", level.parms_id(), 2, make)  # already held: nothing made
    assert len(made) == 2 and reserve.take("secret", level.parms_id()) is None
    taken = [reserve.take("public", level.parms_id()) for _ in range(3)]
    assert taken[2] is None and {id(z) for z in taken[:2]} == {id(z) for z in made}
    reserve.fill("public", level.parms_id(), ZeroReserve.HELD + 5, make)
    assert len(made) == 2 + ZeroReserve.HELD


def test_encryptions_from_zeros_made_ahead_open_as_those_made_at_once(keys: he.CkksBackend) -> None:
    """he.CkksBackend.make_ahead: the key holder's [[p]] (LOWERED) from a symmetric zero made ahead decrypts to its
    values (to 1e-9), a party's product from a public-key zero made ahead opens to δ·x + mask (to 1e-6); each zero
    made ahead is used once (two encryptions from two zeros differ in c1), and the third encryption, with none
    left, is made at once."""
    party = he.CkksBackend.from_public_context(keys.public_context())
    rng = np.random.default_rng(2)
    delta, x = rng.uniform(-1, 1, 4096), rng.uniform(-64, 64, 4096)
    mask = rng.uniform(-he.CKKS_MASK_BOUND, he.CKKS_MASK_BOUND, 4096) * (1 - 1j)
    keys.make_ahead(he.LOWERED, 2, product=False)
    party.make_ahead(he.LOWERED, 2, product=True)
    level = tuple(keys._level_data(he.LOWERED).parms_id())
    assert len(keys._ahead._held["secret", level]) == len(party._ahead._held["public", level]) == 2
    scores = [keys.encrypt(delta, form=he.LOWERED) for _ in range(3)]
    c1 = {ct.ciphertext()[0].data(1) for ct in scores}
    assert len(c1) == 3
    for ct in scores:
        assert ct.ciphertext()[0].coeff_modulus_size() == 2 and ct.ciphertext()[0].scale == 2.0**40
        np.testing.assert_allclose(keys.decrypt(ct), delta, atol=1e-9)
    operand = party.deserialize(keys.serialize(scores[0]))
    products = [party.masked_sum([operand], [x], mask) for _ in range(3)]
    assert len({p.ciphertext()[0].data(1) for p in products}) == 3
    for p in products:
        opened = keys.decrypt_complex(keys.deserialize(party.serialize(p))) - mask
        np.testing.assert_allclose(opened.real, delta * x, atol=1e-6)
    assert not keys._ahead._held["secret", level] and not party._ahead._held["public", level]


def test_a_public_party_makes_no_symmetric_zeros() -> None:
    """Only the key holder encrypts under the secret key: a party asked for them makes none (and has no key)."""
    keys = he.CkksBackend.keyholder()
    party = he.CkksBackend.from_public_context(keys.public_context())
    party.make_ahead(he.LOWERED, 2, product=False)
    level = party._level_data(he.LOWERED)
    assert party._ahead.take("secret", level.parms_id()) is None
