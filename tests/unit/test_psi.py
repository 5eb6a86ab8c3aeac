"""ECDH PSI in edwards25519's prime-order group: RFC 9380 hashing, algebra, the full multi-party protocol and
input validation."""

from __future__ import annotations

import numpy as np
import pytest
from nacl.bindings import crypto_core_ed25519_add, crypto_core_ed25519_is_valid_point

from vflsec.services.crypto.psi import (
    Alignment,
    PsiKey,
    active_align,
    hash_ids,
    hash_to_group,
    intersect,
    new_salt,
    passive_reply,
    rows_from_positions,
)

SALT = b"session-0001-salt"


def _ids(numbers: range | list[int]) -> list[str]:
    return [f"customer-{n:06d}" for n in numbers]


def _shuffled(ids: list[str], seed: int) -> list[str]:
    # Parties store their rows in unrelated orders; the protocol must not depend on it.
    return [ids[i] for i in np.random.default_rng(seed).permutation(len(ids))]


def _run_protocol(active_ids: list[str], passive_ids: list[list[str]]) -> tuple[Alignment, list[np.ndarray]]:
    """Both sides of the protocol; only the values that would cross the network pass between them."""
    salt = new_salt()
    active_key = PsiKey()
    sent = active_key.blind_ids(active_ids, salt)
    replies = [passive_reply(PsiKey(), ids, sent, salt) for ids in passive_ids]
    alignment = active_align(
        active_key, [r.reblinded_active for r in replies], [r.blinded_own for r in replies]
    )
    passive_rows = [
        rows_from_positions(positions, reply.permutation)
        for positions, reply in zip(alignment.passive_positions, replies, strict=True)
    ]
    return alignment, passive_rows


def test_blinding_commutes() -> None:
    a, b = PsiKey(), PsiKey()
    ids = _ids(range(50))
    assert a.reblind(b.blind_ids(ids, SALT)) == b.reblind(a.blind_ids(ids, SALT))


def test_single_blinded_values_differ_from_hashes_and_are_deterministic_per_key() -> None:
    key = PsiKey()
    ids = _ids(range(20))
    blinded = key.blind_ids(ids, SALT)
    assert blinded == key.blind_ids(ids, SALT)
    assert not set(blinded) & set(hash_ids(ids, SALT))
    assert all(len(value) == 32 for value in blinded)


@pytest.mark.parametrize("n_passive", [1, 3])
def test_protocol_finds_exact_intersection_with_consistent_rows(n_passive: int) -> None:
    active_ids = _shuffled(_ids(range(0, 400)), seed=1)
    # Passive sets overlap the active set and each other only partly, and hold ids the active lacks.
    passive_ids = [_shuffled(_ids(range(60 * p, 500 + 40 * p)), seed=10 + p) for p in range(n_passive)]

    alignment, passive_rows = _run_protocol(active_ids, passive_ids)

    expected = set(active_ids).intersection(*map(set, passive_ids))
    common = [active_ids[row] for row in alignment.active_rows]
    assert alignment.size == len(expected) > 0
    assert set(common) == expected
    assert len(set(common)) == len(common)
    for ids, rows in zip(passive_ids, passive_rows, strict=True):
        assert [ids[row] for row in rows] == common


def test_disjoint_sets_give_empty_alignment() -> None:
    alignment, passive_rows = _run_protocol(_ids(range(0, 50)), [_ids(range(50, 90)), _ids(range(0, 90))])
    assert alignment.size == 0
    assert [len(rows) for rows in passive_rows] == [0, 0]


def test_positions_reveal_nothing_of_row_order() -> None:
    # Passive sends in a secret shuffle and the common order is random, so positions are not row indices.
    ids = _ids(range(300))
    alignment, (rows,) = _run_protocol(ids, [ids])
    assert not np.array_equal(alignment.passive_positions[0], rows)
    assert not np.array_equal(alignment.active_rows, np.arange(300))
    assert sorted(alignment.active_rows) == list(range(300))


def test_different_salts_or_keys_give_unrelated_values() -> None:
    ids = _ids(range(100))
    a, b = PsiKey(), PsiKey()
    by_a = set(a.blind_ids(ids, SALT))
    assert not by_a & set(a.blind_ids(ids, SALT + b"x"))
    assert not by_a & set(b.blind_ids(ids, SALT))
    assert not set(hash_ids(ids, SALT)) & set(hash_ids(ids, b"another-salt"))
    # Double blinding across mismatched salts matches nothing.
    assert not set(a.reblind(b.blind_ids(ids, SALT))) & set(b.reblind(a.blind_ids(ids, b"other")))


# RFC 9380 Appendix J.5.1, edwards25519_XMD:SHA-512_ELL2_RO_: message -> (P.x, P.y), big-endian hex. Their ten
# Elligator 2 maps take both branches (g(x1) a square six times, not four), so both sign rules are checked.
RFC9380_DST = b"QUUX-V01-CS02-with-edwards25519_XMD:SHA-512_ELL2_RO_"
RFC9380_VECTORS = {
    b"": (
        "3c3da6925a3c3c268448dcabb47ccde5439559d9599646a8260e47b1e4822fc6",
        "09a6c8561a0b22bef63124c588ce4c62ea83a3c899763af26d795302e115dc21",
    ),
    b"abc": (
        "608040b42285cc0d72cbb3985c6b04c935370c7361f4b7fbdb1ae7f8c1a8ecad",
        "1a8395b88338f22e435bbd301183e7f20a5f9de643f11882fb237f88268a5531",
    ),
    b"abcdef0123456789": (
        "6d7fabf47a2dc03fe7d47f7dddd21082c5fb8f86743cd020f3fb147d57161472",
        "53060a3d140e7fbcda641ed3cf42c88a75411e648a1add71217f70ea8ec561a6",
    ),
    b"q128_" + b"q" * 128: (
        "5fb0b92acedd16f3bcb0ef83f5c7b7a9466b5f1e0d8d217421878ea3686f8524",
        "2eca15e355fcfa39d2982f67ddb0eea138e2994f5956ed37b7f72eea5e89d2f7",
    ),
    b"a512_" + b"a" * 512: (
        "0efcfde5898a839b00997fbe40d2ebe950bc81181afbd5cd6b9618aa336c1e8c",
        "6dc2fc04f266c5c27f236a80b14f92ccd051ef1ff027f26a07f8c0f327d8f995",
    ),
}
# edwards25519 points of order 2, 4 and 8 (the cofactor subgroup), RFC 8032 encodings.
P = 2**255 - 19
ORDER_2 = (P - 1).to_bytes(32, "little")
ORDER_4 = bytes(32)
ORDER_8 = bytes.fromhex("26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05")
IDENTITY = (1).to_bytes(32, "little")


def test_hash_to_group_matches_rfc9380_vectors() -> None:
    messages = list(RFC9380_VECTORS)
    for message, encoded in zip(messages, hash_to_group(messages, RFC9380_DST), strict=True):
        x, y = (int(h, 16) for h in RFC9380_VECTORS[message])
        assert encoded == (y | (x & 1) << 255).to_bytes(32, "little"), message


def test_hashes_and_blinded_values_are_prime_order_points() -> None:
    ids = _ids(range(200))
    key = PsiKey()
    for value in (*hash_ids(ids, SALT), *key.blind_ids(ids, SALT)):
        assert crypto_core_ed25519_is_valid_point(value)


def test_small_order_constants_are_what_they_claim() -> None:
    # Guards the constants the rejection tests below rely on: 2^k·T is the identity exactly at the order.
    for point, order in ((ORDER_2, 2), (ORDER_4, 4), (ORDER_8, 8)):
        multiples = [point]
        while len(multiples) < order:
            multiples.append(crypto_core_ed25519_add(multiples[-1], point))
        assert multiples[-1] == IDENTITY and IDENTITY not in multiples[:-1]


def test_bad_points_are_rejected_with_their_index() -> None:
    key = PsiKey()
    good = key.blind_ids(["x"], SALT)[0]
    with pytest.raises(ValueError, match="index 1 must be 32 bytes, got 31 bytes"):
        key.reblind([good, good[:31]])
    with pytest.raises(ValueError, match="index 0 must be 32 bytes, got str"):
        key.reblind(["a" * 32])  # type: ignore[list-item]
    non_canonical = [
        (P + 1).to_bytes(32, "little"),  # y = p + 1 ≡ 1: the identity, non-canonically
        bytes([1, *bytes(30), 0x80]),  # x = 0 with the sign bit set
    ]
    off_subgroup = [crypto_core_ed25519_add(good, t) for t in (ORDER_2, ORDER_4, ORDER_8)]
    for bad in (IDENTITY, ORDER_2, ORDER_4, ORDER_8, *non_canonical, *off_subgroup):
        with pytest.raises(ValueError, match="index 2 is not a canonical point of the prime-order subgroup"):
            key.reblind([good, good, bad])


def test_duplicates_are_rejected() -> None:
    with pytest.raises(ValueError, match="duplicate ids at rows 1 and 3"):
        PsiKey().blind_ids(["a", "b", "c", "b"], SALT)
    values = [bytes([i]) * 32 for i in range(3)]
    with pytest.raises(ValueError, match="passive party 0"):
        intersect([values], [[values[0], values[1], values[0]]])


def test_intersect_validates_list_shapes() -> None:
    values = [bytes([i]) * 32 for i in range(3)]
    with pytest.raises(ValueError, match="one passive list per passive party"):
        intersect([values], [values, values])
    with pytest.raises(ValueError, match="one per active row"):
        intersect([values, values[:2]], [values, values])


def test_rows_from_positions_validates_positions() -> None:
    permutation = np.array([2, 0, 1])
    assert rows_from_positions([1, 2], permutation).tolist() == [0, 1]
    with pytest.raises(ValueError, match="lie in"):
        rows_from_positions([3], permutation)
    with pytest.raises(ValueError, match="repeat"):
        rows_from_positions([1, 1], permutation)


def test_empty_salt_is_rejected() -> None:
    with pytest.raises(ValueError, match="salt"):
        hash_ids(["a"], b"")


def test_active_party_learns_each_passive_partys_intersection_not_only_the_common_set() -> None:
    # docs/protocol.md, "Alignment": the active party holds every party's double-blinded lists, so it can tell,
    # per passive party, which of its IDs that party holds. This pins the documented residual leak.
    active_ids = _ids(range(0, 100))
    passive_ids = [_ids(range(0, 60)), _ids(range(40, 120))]
    salt, key = new_salt(), PsiKey()
    sent = key.blind_ids(active_ids, salt)
    replies = [passive_reply(PsiKey(), ids, sent, salt) for ids in passive_ids]
    for ids, reply in zip(passive_ids, replies, strict=True):
        theirs = set(key.reblind(reply.blinded_own))
        learned = {sample for sample, value in zip(active_ids, reply.reblinded_active, strict=True) if value in theirs}
        assert learned == set(active_ids) & set(ids)
    common = active_align(key, [r.reblinded_active for r in replies], [r.blinded_own for r in replies])
    assert common.size == 20  # ids 40..59: strictly less than what it learned about each party
