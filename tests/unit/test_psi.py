"""ECDH PSI in ristretto255: RFC 9380 / RFC 9496 hashing, algebra, the full multi-party protocol and input
validation."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from pysodium import (
    crypto_core_ristretto255_from_hash,
    crypto_core_ristretto255_is_valid_point,
    crypto_scalarmult_ristretto255_base,
)

from vflsec.services.crypto.psi import (
    BAD_POSITIONS,
    Alignment,
    PsiKey,
    active_align,
    expand_message_xmd,
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


# RFC 9380 Appendix K.3, expand_message_xmd with SHA-512: (message, length) -> uniform bytes.
XMD_DST = b"QUUX-V01-CS02-with-expander-SHA512-256"
XMD_VECTORS = {
    (b"", 32): "6b9a7312411d92f921c6f68ca0b6380730a1a4d982c507211a90964c394179ba",
    (b"abc", 32): "0da749f12fbe5483eb066a5f595055679b976e93abe9be6f0f6318bce7aca8dc",
}
# RFC 9496 Appendix A.3: the one-way map (libsodium's from_hash, which hash_to_group applies to the 64-byte
# expansion) of SHA-512(label).
R255_MAP_VECTORS = {
    b"Ristretto is traditionally a short shot of espresso coffee": (
        "3066f82a1a747d45120d1740f14358531a8f04bbffe6a819f86dfe50f44a0a46"
    ),
    b"made with the normal amount of ground coffee but extracted with": (
        "f26e5b6f7d362d2d2a94c5d0e7602cb4773c95a2e5c31a64f133189fa76ed61b"
    ),
    b"about half the amount of water in the same amount of time": (
        "006ccd2a9e6867e6a2c5cea83d3302cc9de128dd2a9a57dd8ee7b9d7ffe02826"
    ),
}
# RFC 9496 Appendix A.1: the encoding of the generator.
GENERATOR = "e2f2ae0a6abc4e71a884a961c500515f58e30b6aa582dd8db6a65945e08d2d76"
P = 2**255 - 19
IDENTITY = bytes(32)


def test_hash_to_group_is_rfc9380_expansion_then_rfc9496_map() -> None:
    for (message, length), expected in XMD_VECTORS.items():
        assert expand_message_xmd(message, XMD_DST, length).hex() == expected
    for label, expected in R255_MAP_VECTORS.items():
        assert crypto_core_ristretto255_from_hash(hashlib.sha512(label).digest()).hex() == expected
    assert crypto_scalarmult_ristretto255_base((1).to_bytes(32, "little")).hex() == GENERATOR
    # hash_to_group is exactly the map of the 64-byte expansion.
    message = b"salted id"
    assert hash_to_group([message], XMD_DST) == [
        crypto_core_ristretto255_from_hash(expand_message_xmd(message, XMD_DST, 64))
    ]


def test_hashes_and_blinded_values_are_group_elements() -> None:
    ids = _ids(range(200))
    key = PsiKey()
    for value in (*hash_ids(ids, SALT), *key.blind_ids(ids, SALT)):
        assert crypto_core_ristretto255_is_valid_point(value) and value != IDENTITY


def test_invalid_or_non_canonical_encodings_are_refused_with_their_index() -> None:
    key = PsiKey()
    good = key.blind_ids(["x"], SALT)[0]
    with pytest.raises(ValueError, match="index 1 must be 32 bytes, got 31 bytes"):
        key.reblind([good, good[:31]])
    with pytest.raises(ValueError, match="index 0 must be 32 bytes, got str"):
        key.reblind(["a" * 32])  # type: ignore[list-item]
    s = int.from_bytes(good, "little")
    bad = {
        "identity": IDENTITY,
        "s = p (zero, non-canonically)": P.to_bytes(32, "little"),
        "s + p": (s + P).to_bytes(32, "little"),
        "bit 255 set (libsodium 1.0.18 decodes it)": (s | 1 << 255).to_bytes(32, "little"),
        "negative s (p - s is odd)": (P - s).to_bytes(32, "little"),
        "negative s = 1": (1).to_bytes(32, "little"),
        "s = -1 (y = 0)": (P - 1).to_bytes(32, "little"),
        # An edwards25519 encoding of a point of order 8: what the former group had to refuse by a subgroup check.
        "edwards25519 torsion point": bytes.fromhex(
            "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05"
        ),
    }
    for kind, value in bad.items():
        with pytest.raises(ValueError, match="index 2 is not a canonical point of ristretto255"):
            key.reblind([good, good, value])
        assert value != good, kind
    # The refused encodings are refused by the check, not by chance: the good value passes the same path.
    assert len(key.reblind([good, good, good])) == 3


@pytest.mark.parametrize("seed", [0, 1])
def test_two_parties_intersection_equals_the_plain_set_intersection(seed: int) -> None:
    rng = np.random.default_rng(seed)
    universe = [f"id-{n}-\u00e9" for n in rng.choice(10_000, size=600, replace=False)]
    active = [universe[i] for i in rng.choice(600, size=int(rng.integers(150, 400)), replace=False)]
    passive = [universe[i] for i in rng.choice(600, size=int(rng.integers(150, 400)), replace=False)]
    alignment, (passive_rows,) = _run_protocol(active, [passive])
    common = [active[row] for row in alignment.active_rows]
    assert set(common) == set(active) & set(passive) and len(common) == len(set(common))
    assert [passive[row] for row in passive_rows] == common


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
    # One refusal for every bad list, naming no position (review 15, F2): out of range, repeated, an OPRF list's
    # padding (-1), two values of one row.
    for positions, sent in (([3], permutation), ([1, 1], permutation), ([1], np.array([0, -1])), ([0, 2], [4, 1, 4])):
        with pytest.raises(ValueError) as err:
            rows_from_positions(positions, np.asarray(sent))
        assert str(err.value) == BAD_POSITIONS


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
