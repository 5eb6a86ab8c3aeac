"""ECDH PSI over X25519: algebra, the full multi-party protocol and input validation."""

from __future__ import annotations

import numpy as np
import pytest

from vflsec.services.psi import (
    Alignment,
    PsiKey,
    active_align,
    hash_ids,
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


def test_bad_points_are_rejected_with_their_index() -> None:
    key = PsiKey()
    good = key.blind_ids(["x"], SALT)[0]
    with pytest.raises(ValueError, match="index 1 must be 32 bytes, got 31 bytes"):
        key.reblind([good, good[:31]])
    with pytest.raises(ValueError, match="index 0 must be 32 bytes, got str"):
        key.reblind(["a" * 32])  # type: ignore[list-item]
    # u = 0 and u = 1 generate the small subgroup: the shared secret would be all zeros.
    for low_order in (bytes(32), (1).to_bytes(32, "little")):
        with pytest.raises(ValueError, match="index 2 is a low-order"):
            key.reblind([good, good, low_order])


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
