"""HE backends and encrypted-matrix packing against real TenSEAL (and the plain baseline)."""

from __future__ import annotations

import math
import tempfile

import numpy as np
import pytest
import tenseal as ts

from vflsec.services.crypto import he, masking

Pair = tuple[he.Backend, he.Backend]  # (key holder, party)

BACKEND_NAMES = ["ckks", "plain"]
# Absolute per-slot tolerance after decryption: CKKS noise at scale 2^40 is ~1e-6 after one ct*pt product.
SLOT_ATOL = {"ckks": 1e-5, "plain": 0.0}
GRAD_RTOL = {"ckks": 1e-4, "plain": 1e-12}


@pytest.fixture(scope="module", params=BACKEND_NAMES)
def pair(request: pytest.FixtureRequest) -> Pair:
    """(key holder, party) for one backend; the party is opened from serialized public bytes."""
    keyholder = he.make_keyholder(request.param)
    return keyholder, he.open_public(request.param, keyholder.public_context())


@pytest.fixture(scope="module")
def ckks_pair() -> Pair:
    keyholder = he.make_keyholder("ckks")
    return keyholder, he.open_public("ckks", keyholder.public_context())


def _seal_bytes(key: object) -> bytes:
    with tempfile.NamedTemporaryFile() as fh:
        key.data.save(fh.name)  # type: ignore[attr-defined]
        return fh.read()


# ---------------------------------------------------------------------------------------------- backends


def test_vector_round_trip_through_the_wire(pair: Pair) -> None:
    keyholder, party = pair
    values = np.random.default_rng(0).uniform(-3, 3, party.slots)
    ct = keyholder.deserialize(party.serialize(party.encrypt(values)))
    assert keyholder.size(ct) == party.slots
    np.testing.assert_allclose(keyholder.decrypt(ct), values, rtol=0, atol=SLOT_ATOL[party.name])


def test_arithmetic_matches_numpy(pair: Pair) -> None:
    keyholder, party = pair
    rng = np.random.default_rng(1)
    a, b, v = rng.uniform(-1, 1, (3, 100))
    ca, cb = party.encrypt(a), party.encrypt(b)
    atol = SLOT_ATOL[party.name]
    np.testing.assert_allclose(keyholder.decrypt(party.add(ca, cb)), a + b, atol=atol)
    np.testing.assert_allclose(keyholder.decrypt(party.add_plain(ca, v)), a + v, atol=atol)
    np.testing.assert_allclose(keyholder.decrypt(party.mul_plain(ca, v)), a * v, atol=atol)
    # Out-of-place ops leave their inputs intact; the in-place add accumulates into its first operand.
    np.testing.assert_allclose(keyholder.decrypt(ca), a, atol=atol)
    total = party.add(ca, cb, inplace=True)
    np.testing.assert_allclose(keyholder.decrypt(total), a + b, atol=atol)


def test_operand_size_mismatch_is_rejected(pair: Pair) -> None:
    _, party = pair
    ct = party.encrypt(np.ones(10))
    with pytest.raises(ValueError, match="entries"):
        party.mul_plain(ct, np.ones(11))
    with pytest.raises(ValueError, match="sizes differ"):
        party.add(ct, party.encrypt(np.ones(9)))
    with pytest.raises(ValueError, match=r"1\.\.4096"):
        party.encrypt(np.ones(party.slots + 1))
    with pytest.raises(ValueError, match="non-finite"):
        party.encrypt(np.array([1.0, np.nan]))


def test_public_backend_cannot_decrypt(pair: Pair) -> None:
    keyholder, party = pair
    assert keyholder.can_decrypt and not party.can_decrypt
    with pytest.raises(PermissionError):
        party.decrypt(party.encrypt(np.ones(4)))


def test_key_substring_check_detects_an_embedded_secret_key() -> None:
    """Control for the next test: a TenSEAL serialization that does carry the key contains its SEAL bytes."""
    ctx = ts.context(ts.SCHEME_TYPE.CKKS, poly_modulus_degree=8192, coeff_mod_bit_sizes=[60, 40, 40, 60])
    secret = _seal_bytes(ctx.secret_key())
    assert secret in ctx.serialize(save_secret_key=True)
    assert secret not in ctx.serialize(save_secret_key=False)


def test_ckks_public_context_omits_secret_and_unneeded_keys(ckks_pair: Pair) -> None:
    keyholder, _ = ckks_pair
    assert isinstance(keyholder, he.CkksBackend)
    public = keyholder.public_context()
    assert keyholder.secret_key_bytes() not in public
    loaded = ts.context_from(public)
    assert loaded.has_public_key() and not loaded.has_secret_key()
    assert not loaded.has_relin_keys() and not loaded.has_galois_keys()
    with pytest.raises(PermissionError):
        he.CkksBackend.from_public_context(public).secret_key_bytes()  # type: ignore[attr-defined]


def test_ckks_refuses_a_context_carrying_the_secret_key() -> None:
    ctx = ts.context(ts.SCHEME_TYPE.CKKS, poly_modulus_degree=8192, coeff_mod_bit_sizes=[60, 40, 40, 60])
    ctx.global_scale = 2.0**40
    with pytest.raises(ValueError, match="secret key"):
        he.open_public("ckks", ctx.serialize(save_secret_key=True))


@pytest.mark.parametrize("name", BACKEND_NAMES)
@pytest.mark.parametrize("data", [b"", b"garbage" * 20, b"\x00" * 12])
def test_bad_public_context_raises_value_error(name: str, data: bytes) -> None:
    with pytest.raises(ValueError):
        he.open_public(name, data)


def test_unknown_backend_name() -> None:
    with pytest.raises(ValueError, match="unknown HE backend"):
        he.make_keyholder("paillier")


def test_malformed_ciphertexts_raise_value_error(pair: Pair) -> None:
    keyholder, party = pair
    good = party.serialize(party.encrypt(np.arange(8.0)))
    other = "plain" if party.name == "ckks" else "ckks"
    foreign_backend = he.open_public(other, he.make_keyholder(other).public_context())
    foreign = foreign_backend.serialize(foreign_backend.encrypt(np.ones(8)))
    bad_inputs = [b"", b"garbage" * 50, good[: len(good) // 2], good[:-1], good + b"\x00", foreign]
    # No bit-flip case: a CKKS ciphertext carries no MAC, and a flipped coefficient that stays below its
    # modulus is a valid ciphertext of garbage (integrity in transit is mTLS's job).
    for data in bad_inputs:
        with pytest.raises(ValueError):
            keyholder.deserialize(data)


def test_plain_ciphertexts_reject_non_finite_values() -> None:
    data = he.PlainBackend.keyholder().serialize(he.PlainCiphertext(np.array([1.0, 2.0])))
    corrupted = data[:-8] + np.array([np.inf]).tobytes()
    with pytest.raises(ValueError, match="non-finite"):
        he.PlainBackend.keyholder().deserialize(corrupted)


def test_ckks_zero_feature_block_still_yields_a_rescaled_product(
    ckks_pair: Pair,
) -> None:
    """TenSEAL skips the rescale for a zero plaintext; the backend must hide that the block was zero."""
    keyholder, party = ckks_pair
    ct = party.encrypt(np.linspace(-1, 1, 64))
    zero = party.mul_plain(ct, np.zeros(64))
    nonzero = party.mul_plain(ct, np.ones(64))
    assert zero.ciphertext()[0].coeff_modulus_size() == nonzero.ciphertext()[0].coeff_modulus_size()
    np.testing.assert_allclose(keyholder.decrypt(zero), 0.0, atol=1e-6)
    # Values so small that they encode to zero at scale 2^40 take the same short-cut, and get the same answer.
    tiny = party.mul_plain(ct, np.full(64, 1e-13))
    assert tiny.ciphertext()[0].coeff_modulus_size() == nonzero.ciphertext()[0].coeff_modulus_size()
    keyholder.check_form([zero, tiny, nonzero], product=True)


# ----------------------------------------------------------------------------------------------- packing


def test_pack_places_every_entry_at_its_documented_slot() -> None:
    n, k, R, slots = 23, 3, 2, 40  # C = 6 rows per ct, 4 chunks, last chunk 5 rows (short)
    layout = he.MatrixLayout.for_matrix((n, k), R, slots)
    assert (layout.rows_per_ct, layout.n_chunks, layout.ct_size) == (6, 4, 36)
    M = np.arange(n * k, dtype=float).reshape(n, k) + 1.0
    packed = layout.pack(M)
    C = layout.rows_per_ct
    for i in range(layout.n_chunks):
        for r in range(R):
            for row in range(C):
                for col in range(k):
                    expected = M[i * C + row, col] if i * C + row < n else 0.0
                    assert packed[i, r * C * k + row * k + col] == expected
    np.testing.assert_array_equal(layout.unpack(list(packed)), M)


@pytest.mark.parametrize(("n", "k", "replicas"), [(5000, 1, 1), (1000, 3, 4), (700, 10, 2), (3, 2, 1)])
def test_matrix_round_trip(pair: Pair, n: int, k: int, replicas: int) -> None:
    keyholder, party = pair
    M = np.random.default_rng(n).normal(size=(n, k))
    em = he.encrypt_matrix(party, M, replicas)
    assert em.rows_per_ct == min(n, party.slots // (k * replicas))
    assert len(em.ciphertexts) == math.ceil(n / em.rows_per_ct)
    wire = he.matrix_to_wire(party, em)
    received = he.matrix_from_wire(keyholder, wire)
    assert received.layout == em.layout
    np.testing.assert_allclose(he.decrypt_matrix(keyholder, received), M, atol=SLOT_ATOL[party.name])
    # Every replica carries the same block, so a masked product with any replica sees the same δ.
    first = keyholder.decrypt(received.ciphertexts[0])
    block = em.layout.block_size
    for r in range(1, replicas):
        replica = first[r * block : (r + 1) * block]
        np.testing.assert_allclose(replica, first[:block], atol=2 * SLOT_ATOL[party.name])


def test_matrix_addition(pair: Pair) -> None:
    keyholder, party = pair
    rng = np.random.default_rng(3)
    A, B, P = rng.normal(size=(3, 900, 5))
    ea, eb = he.encrypt_matrix(party, A, 2), he.encrypt_matrix(party, B, 2)
    total = he.add_plain_matrix(party, he.add_matrices(party, ea, eb), P)
    np.testing.assert_allclose(he.decrypt_matrix(keyholder, total), A + B + P, atol=SLOT_ATOL[party.name])
    with pytest.raises(ValueError, match="layouts differ"):
        he.add_matrices(party, ea, he.encrypt_matrix(party, B, 1))
    with pytest.raises(ValueError, match="does not match layout"):
        he.add_plain_matrix(party, ea, P[:-1])


@pytest.mark.parametrize(
    ("shape", "replicas", "rows_per_ct", "count", "message"),
    [
        ((10,), 1, 5, 2, "2 dimensions"),
        ((0, 3), 1, 1, 0, "positive"),
        ((10, 3), 0, 5, 2, "replicas"),
        ((10, 3), 1, 0, 2, "rows_per_ct"),
        ((10, 3), 1, 11, 1, "rows_per_ct"),
        ((4000, 2), 2, 1025, 4, "exceeds 4096 slots"),
        ((10, 3), 1, 4, 2, "need 3 ciphertexts, got 2"),
    ],
)
def test_layout_errors(shape: tuple[int, ...], replicas: int, rows_per_ct: int, count: int, message: str) -> None:
    error = he.layout_error(shape, replicas, rows_per_ct, count, 4096)
    assert error is not None and message in error
    wire = he.WireMatrix(shape, replicas, rows_per_ct, [b""] * count)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        he.matrix_from_wire(he.PlainBackend.keyholder(), wire)


def test_valid_layout_has_no_error() -> None:
    assert he.layout_error((10, 3), 2, 4, 3, 4096) is None


def test_wire_matrix_rejects_ciphertexts_of_the_wrong_size(pair: Pair) -> None:
    keyholder, party = pair
    em = he.encrypt_matrix(party, np.ones((10, 2)))
    wire = he.matrix_to_wire(party, em)
    short = party.serialize(party.encrypt(np.ones(19)))
    with pytest.raises(ValueError, match="ciphertext 0 has 19 slots, layout needs 20"):
        he.matrix_from_wire(keyholder, he.WireMatrix(wire.shape, 1, 10, [short]))


def test_choose_replicas_minimises_product_ciphertexts() -> None:
    # n=1024, k=1, d=12: R=4 -> 1 chunk x 3 groups = 3 products; R=1 -> 12, R=12 -> 4 chunks x 1 = 4.
    assert he.choose_replicas(1024, 1, 12, 4096) == 4
    # Small batch: every feature fits next to the others in one ciphertext.
    assert he.choose_replicas(100, 2, 20, 4096) == 20


# ------------------------------------------------------------------------------------- masked gradients


@pytest.mark.parametrize(("n", "k", "d"), [(1500, 1, 7), (600, 10, 5), (9000, 1, 2)])
def test_masked_products_give_delta_transpose_x(pair: Pair, n: int, k: int, d: int) -> None:
    keyholder, party = pair
    rng = np.random.default_rng(n + k)
    delta = rng.uniform(-1, 1, (n, k))
    X = rng.normal(0, 2, (n, d))
    replicas = he.choose_replicas(n, k, d, party.slots)
    em = he.encrypt_matrix(party, delta, replicas)
    assert em.layout.n_chunks > 1 or replicas > 1  # every case exercises chunks or replicas

    products, mask_sums = masking.masked_feature_products(party, em, X, np.random.default_rng(7))
    groups = math.ceil(d / replicas)
    assert len(products) == groups * em.layout.n_chunks
    assert mask_sums.shape == (groups * replicas, k)
    received = he.deserialize_all(keyholder, [party.serialize(ct) for ct in products], em.layout.ct_size)
    sums = masking.block_sums(keyholder, received, em.layout)
    gradient = masking.gradient_from_block_sums(sums, mask_sums, d)

    expected = delta.T @ X
    assert gradient.shape == (k, d)
    np.testing.assert_allclose(
        gradient, expected, rtol=GRAD_RTOL[party.name], atol=GRAD_RTOL[party.name] * np.abs(expected).max()
    )


def test_ckks_products_are_masked_before_the_keyholder_sees_them(
    ckks_pair: Pair,
) -> None:
    keyholder, party = ckks_pair
    rng = np.random.default_rng(11)
    delta, X = rng.uniform(-1, 1, (500, 1)), rng.normal(size=(500, 3))
    em = he.encrypt_matrix(party, delta)
    products, _ = masking.masked_feature_products(party, em, X, rng)
    seen = keyholder.decrypt(products[0])[:500]
    # Uniform masks on [-B, B] have std B/sqrt(3); what the key holder sees must look like them, not δ·x.
    assert np.std(seen - delta[:, 0] * X[:, 0]) > 0.5 * he.CKKS_MASK_BOUND
    assert abs(np.corrcoef(seen, delta[:, 0] * X[:, 0])[0, 1]) < 0.2


def test_explicit_mask_bound_still_unmasks(pair: Pair) -> None:
    keyholder, party = pair
    rng = np.random.default_rng(5)
    delta, X = rng.uniform(-1, 1, (300, 2)), rng.normal(size=(300, 4))
    em = he.encrypt_matrix(party, delta, 2)
    products, mask_sums = masking.masked_feature_products(party, em, X, rng, mask_bound=2.0**20)
    assert np.abs(mask_sums).max() > 1.0  # masks were really drawn
    gradient = masking.gradient_from_block_sums(masking.block_sums(keyholder, products, em.layout), mask_sums, 4)
    np.testing.assert_allclose(gradient, delta.T @ X, rtol=1e-4, atol=1e-4 * np.abs(delta.T @ X).max())


def test_zero_feature_group_is_handled(ckks_pair: Pair) -> None:
    keyholder, party = ckks_pair
    rng = np.random.default_rng(2)
    delta, X = rng.uniform(-1, 1, (200, 1)), rng.normal(size=(200, 4))
    X[:, :2] = 0.0  # the whole first group (R=2) is zero
    em = he.encrypt_matrix(party, delta, 2)
    products, mask_sums = masking.masked_feature_products(party, em, X, rng)
    levels = {ct.ciphertext()[0].coeff_modulus_size() for ct in products}
    assert len(levels) == 1
    gradient = masking.gradient_from_block_sums(masking.block_sums(keyholder, products, em.layout), mask_sums, 4)
    np.testing.assert_allclose(gradient, delta.T @ X, atol=1e-4 * np.abs(delta.T @ X).max())


def test_masked_product_input_validation(pair: Pair) -> None:
    keyholder, party = pair
    em = he.encrypt_matrix(party, np.ones((50, 2)))
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="match δ"):
        masking.masked_feature_products(party, em, np.ones((49, 3)), rng)
    with pytest.raises(ValueError, match="mask_bound"):
        masking.masked_feature_products(party, em, np.ones((50, 3)), rng, mask_bound=-1.0)
    products, mask_sums = masking.masked_feature_products(party, em, np.ones((50, 3)), rng)
    with pytest.raises(ValueError, match="multiple"):
        masking.block_sums(keyholder, [], em.layout)
    with pytest.raises(PermissionError):
        masking.block_sums(party, products, em.layout)
    with pytest.raises(ValueError, match="equal 2-D shapes"):
        masking.gradient_from_block_sums(mask_sums[:-1], mask_sums, 3)
    with pytest.raises(ValueError, match="d must be"):
        masking.gradient_from_block_sums(mask_sums, mask_sums, 4)


def test_ckks_masked_sum_is_the_per_product_sum_with_one_rescale(ckks_pair: Pair) -> None:
    """CkksBackend.masked_sum (SEAL's evaluator: products summed, one rescale) gives what the generic path (TenSEAL's
    product, rescaled each) gives, in a product's form; zero plaintexts among the operands, or only zero ones, too."""
    keyholder, party = ckks_pair
    rng = np.random.default_rng(21)
    ys = rng.integers(0, 2, (5, 700)).astype(float)
    cts = [party.encrypt(y) for y in ys]
    plains = (rng.random((5, 700)) < 0.3).astype(float)
    plains[2] = 0.0  # encodes to zero: SEAL would refuse its product as transparent
    mask = rng.uniform(-he.CKKS_MASK_BOUND, he.CKKS_MASK_BOUND, 700)
    fast = party.masked_sum(cts, plains, mask)
    generic = he.Backend.masked_sum(party, cts, plains, mask)
    expected = (ys * plains).sum(axis=0) + mask
    keyholder.check_form([fast, generic], product=True)
    received = keyholder.deserialize(party.serialize(fast))
    assert received.size() == 700
    np.testing.assert_allclose(keyholder.decrypt(received), expected, atol=1e-5)
    np.testing.assert_allclose(keyholder.decrypt(generic), expected, atol=1e-5)
    zeros = party.masked_sum(cts[:2], np.zeros((2, 700)), mask)
    keyholder.check_form([zeros], product=True)
    np.testing.assert_allclose(keyholder.decrypt(zeros), mask, atol=1e-5)
    with pytest.raises(ValueError, match="entries"):
        party.masked_sum(cts, plains[:, :600], mask)
    with pytest.raises(ValueError, match="as many plaintexts"):
        party.masked_sum(cts, plains[:4], mask)


def test_a_product_made_for_the_wire_is_the_product_serialized(pair: Pair) -> None:
    """``serialized=True`` gives the bytes a party sends (CKKS: SEAL's ciphertext saved once, in TenSEAL's message),
    which the key holder parses into a product of the same form and value."""
    keyholder, party = pair
    rng = np.random.default_rng(22)
    ys, plains = rng.uniform(-1, 1, (2, 300)), rng.uniform(-4, 4, (2, 300))
    cts = [party.encrypt(y) for y in ys]
    mask = rng.uniform(-1e3, 1e3, 300)
    blob = party.masked_sum(cts, plains, mask, serialized=True)
    assert isinstance(blob, bytes)
    received = keyholder.deserialize(blob)
    keyholder.check_form([received], product=True)
    np.testing.assert_allclose(keyholder.decrypt(received), (ys * plains).sum(axis=0) + mask, atol=1e-4)
    delta = he.encrypt_matrix(party, ys[:1].T)  # masked_feature_products's blobs open to δᵀX as its products do
    blobs, mask_sums = masking.masked_feature_products(party, delta, plains.T, rng, serialized=True)
    opened = masking.block_sums(keyholder, he.deserialize_all(keyholder, blobs, delta.layout.ct_size), delta.layout)
    gradient = masking.gradient_from_block_sums(opened, mask_sums, 2)
    np.testing.assert_allclose(gradient, ys[:1] @ plains.T, rtol=1e-4, atol=1e-3)


def test_ckks_products_imaginary_parts_are_masked_too(ckks_pair: Pair) -> None:
    """CKKS slots are complex: a key holder decoding a product's imaginary parts would read δ's encryption noise
    times the party's values (|Im| correlated ~0.45 with |x| before they were masked). Now they are uniform masks,
    and the real parts still open to δᵀx."""
    keyholder, party = ckks_pair
    rng = np.random.default_rng(1)
    delta, X = rng.uniform(-1, 1, (4096, 1)), rng.normal(0, 8, (4096, 1)).clip(-64, 64)
    em = he.encrypt_matrix(party, delta)
    products, mask_sums = masking.masked_feature_products(party, em, X, rng)
    context = keyholder._ctx.data.seal_context()  # type: ignore[attr-defined]
    decryptor = he.sealapi.Decryptor(context, keyholder._ctx.secret_key().data)  # type: ignore[attr-defined]
    plain = he.sealapi.Plaintext()
    decryptor.decrypt(products[0].ciphertext()[0], plain)
    imaginary = np.array(he.sealapi.CKKSEncoder(context).decode_complex(plain)).imag
    assert imaginary.std() > 0.5 * he.CKKS_MASK_BOUND  # uniform on [-B, B]: std B / sqrt(3)
    assert abs(np.corrcoef(np.abs(imaginary), np.abs(X[:, 0]))[0, 1]) < 0.05
    gradient = masking.gradient_from_block_sums(masking.block_sums(keyholder, products, em.layout), mask_sums, 1)
    np.testing.assert_allclose(gradient, delta.T @ X, rtol=1e-4)


@pytest.mark.parametrize("d", [6, 5])
def test_two_parts_carry_two_groups_a_product_and_open_to_the_same_sums(ckks_pair: Pair, d: int) -> None:
    """parts=2 (trees under CKKS): group 2p in the slots' real parts, 2p + 1 in their imaginary parts, half the
    products; an odd last group leaves an imaginary part of masks only, which the caller drops."""
    keyholder, party = ckks_pair
    rng = np.random.default_rng(d)
    delta, X = rng.uniform(-1, 1, (3000, 1)), rng.normal(size=(3000, d))
    em = he.encrypt_matrix(party, delta, 1)
    one, one_sums = masking.masked_feature_products(party, em, X, rng)
    two, two_sums = masking.masked_feature_products(party, em, X, rng, parts=2)
    assert len(one) == d * em.layout.n_chunks and len(two) == math.ceil(d / 2) * em.layout.n_chunks
    assert two_sums.shape == one_sums.shape == (d, 1)
    sums = masking.block_sums(keyholder, two, em.layout, max_abs=he.CKKS_MASK_BOUND + 65, parts=2)
    assert sums.shape == (2 * math.ceil(d / 2), 1)
    gradient = masking.gradient_from_block_sums(sums[:d], two_sums, d)
    np.testing.assert_allclose(gradient, delta.T @ X, rtol=1e-4, atol=1e-4 * np.abs(delta.T @ X).max())
    plain = he.make_keyholder("plain")
    with pytest.raises(ValueError, match="parts must be 1, or 2 where slots are complex"):
        masking.masked_feature_products(plain, he.encrypt_matrix(plain, delta), X, rng, parts=2)


def test_operands_are_one_prime_lower_at_2_30_and_their_products_open_the_same(ckks_pair: Pair) -> None:
    """encrypt(form=he.OPERAND) (trees' [[Y]]): scale 2^30, one prime lower; its masked products (two parts, an
    all-zero fold among them) one more prime lower at 2^30, and within 1e-4 of the sums a slot's values give."""
    keyholder, party = ckks_pair
    rng = np.random.default_rng(4)
    ys = rng.integers(0, 3, (4, 2048)).astype(float)
    cts = [party.encrypt(y, form=he.OPERAND) for y in ys]
    party.check_form(cts, product=False, form=he.OPERAND)
    with pytest.raises(ValueError, match=r"2 primes and scale 2\^30\.00; an honest ciphertext has 2, 3"):
        party.check_form(cts[:1], product=False)
    plains = (rng.random((4, 2048)) < 0.3) + 1j * (rng.random((4, 2048)) < 0.3)
    mask = rng.uniform(-he.CKKS_MASK_BOUND, he.CKKS_MASK_BOUND, 2048) * (1 + 1j)
    products = [party.masked_sum(cts, plains, mask), party.masked_sum(cts[:2], np.zeros((2, 2048)), mask)]
    keyholder.check_form(products, product=True, form=he.OPERAND)
    with pytest.raises(ValueError, match=r"an honest product has 2, 2"):
        keyholder.check_form(products, product=True)
    opened = [keyholder.decrypt_complex(keyholder.deserialize(party.serialize(p))) - mask for p in products]
    np.testing.assert_allclose(opened[0], (ys * plains).sum(axis=0), atol=1e-4)
    np.testing.assert_allclose(opened[1], 0.0, atol=1e-4)


def test_operand_products_open_at_their_scale_exactly(ckks_pair: Pair) -> None:
    """Review 21: a product rescaled by the prime q under an operand and labelled 2^30 decoded x 2^40 / q
    (1 + 6.7e-7), a bias every slot shares: a fold of 64 all-one chunks opened 0.18 high over 4096 slots, so a
    count of ~750k rows (one class, one bin) rounded one off. The plaintexts are encoded at q: no bias, the noise
    left."""
    keyholder, party = ckks_pair
    slots = party.slots
    cts = [party.encrypt(np.ones(slots), form=he.OPERAND)] * 64  # one operand 64 times: the bias adds, not the noise
    mask = np.random.default_rng(5).uniform(-he.CKKS_MASK_BOUND, he.CKKS_MASK_BOUND, slots) * (1 + 1j)
    product = party.masked_sum(cts, np.ones((64, slots)), mask)
    keyholder.check_form([product], product=True, form=he.OPERAND)
    opened = keyholder.decrypt_complex(keyholder.deserialize(party.serialize(product))) - mask
    assert abs(opened.real.sum() - 64 * slots) < 0.05  # the bias alone was 64 x 4096 x 6.7e-7 = 0.18


def test_a_transparent_sum_raises_nothing_whatever_the_plaintexts() -> None:
    """Review 20: crafted chunks c and -c in one fold cancel (a transparent sum, which SEAL raises on) exactly where
    the party's two plaintexts are equal; masked_sum must answer alike either way, and check_form refuses a
    transparent ciphertext outright (before any product, at the party; before any decryption, at the key holder)."""
    import tenseal.sealapi as sealapi

    keys = he.CkksBackend.keyholder()
    public = he.CkksBackend.from_public_context(keys.public_context())
    a = public.encrypt(np.ones(16))
    raw = a.ciphertext()[0]
    negated = sealapi.Ciphertext()
    sealapi.Evaluator(public._ctx.data.seal_context()).negate(raw, negated)
    minus_a = public.deserialize(he._vector_message(he._seal_bytes(negated), 16, raw.scale))
    public.check_form([minus_a], product=False)  # an honest form: only the sum is transparent
    one, other = np.eye(1, 16, 2)[0], np.eye(1, 16, 5)[0]
    for second in (one, other):
        product = public.masked_sum([a, minus_a], [one, second], np.full(16, 5.0))
        keys.check_form([keys.deserialize(public.serialize(product))], product=True)
    transparent = sealapi.Ciphertext(public._ctx.data.seal_context(), raw.parms_id())
    transparent.resize(2)
    transparent.scale = raw.scale
    crafted = public.deserialize(he._vector_message(he._seal_bytes(transparent), 16, raw.scale))
    with pytest.raises(ValueError, match="zero second polynomial"):
        public.check_form([crafted], product=False)
