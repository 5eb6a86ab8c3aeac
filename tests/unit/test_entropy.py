"""services/crypto/entropy.py: the CSPRNG draws behind release noise and gradient masks."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

from vflsec.services.crypto import entropy


def test_draws_have_the_advertised_distributions() -> None:
    rng = entropy.os_entropy()
    u = rng.uniform(-2.0, 6.0, (200_000,))
    assert u.min() >= -2.0 and u.max() < 6.0
    assert abs(u.mean() - 2.0) < 0.05 and abs(u.var() - 64 / 12) < 0.1
    z = rng.normal(1.0, 3.0, size=(100_001,))  # odd size: Box-Muller pairs are cut
    assert z.shape == (100_001,) and abs(z.mean() - 1.0) < 0.05 and abs(z.std() - 3.0) < 0.05
    lap = rng.laplace(0.0, 2.0, 100_000)
    assert abs(np.mean(np.abs(lap)) - 2.0) < 0.05
    assert isinstance(rng.random(), float) and rng.standard_normal((3, 4)).shape == (3, 4)
    assert rng.normal(np.zeros(5), 1.0).shape == (5,)  # size from the parameters' shape, as numpy does
    assert sorted(rng.permutation(50).tolist()) == list(range(50))


def test_os_entropy_never_repeats_and_keyed_streams_repeat_only_under_the_same_key_and_context() -> None:
    assert not np.array_equal(entropy.os_entropy().random(8), entropy.os_entropy().random(8))
    key = entropy.new_key()
    same = [entropy.keyed_stream(key, "session", 3, b"delta").uniform(-1, 1, (4, 5)) for _ in range(2)]
    np.testing.assert_array_equal(*same)
    for other in (
        entropy.keyed_stream(key, "session", 4, b"delta"),
        entropy.keyed_stream(key, "session", 3, b"other"),
        entropy.keyed_stream(entropy.new_key(), "session", 3, b"delta"),
    ):
        assert not np.array_equal(other.uniform(-1, 1, (4, 5)), same[0])
    with pytest.raises(ValueError, match="32 bytes"):
        entropy.keyed_stream(b"short", 1)


def test_shuffled_orders_are_uniform_also_when_the_random_keys_tie() -> None:
    values = np.array([9, 2, 7])
    counts: dict[tuple, int] = {}
    for _ in range(3000):
        order = tuple(entropy.os_entropy().shuffled(values).tolist())
        counts[order] = counts.get(order, 0) + 1
    assert sorted(counts) == sorted(itertools.permutations([9, 2, 7]))
    assert all(400 < c < 600 for c in counts.values())  # 500 expected each; 4.5 sigma
    calls = iter(range(10**6))  # shuffled draws its keys, then the tie's order: all keys zero, the order random
    tied = entropy.CryptoRandom(lambda n: bytes(n) if next(calls) % 2 == 0 else os.urandom(n))
    counts = {}
    for _ in range(3000):
        order = tuple(tied.shuffled(values).tolist())
        counts[order] = counts.get(order, 0) + 1
    assert len(counts) == 6 and all(400 < c < 600 for c in counts.values())
    big = entropy.os_entropy().shuffled(np.arange(3_000_000, dtype=np.int64) * 7)
    assert big.dtype == np.int64 and np.array_equal(np.sort(big), np.arange(3_000_000) * 7)
    with pytest.raises(ValueError, match=r"\[0, 2\^31\)"):
        entropy.os_entropy().shuffled(np.array([2**31]))


def test_tag_is_a_keyed_digest_of_its_context() -> None:
    key, other = entropy.new_key(), entropy.new_key()
    tag = entropy.tag(key, "block-sums", "s", 3, b"digest")
    assert len(tag) == 32 and tag == entropy.tag(key, "block-sums", "s", 3, b"digest")
    assert tag != entropy.tag(other, "block-sums", "s", 3, b"digest")
    assert tag != entropy.tag(key, "block-sums", "s", 4, b"digest")
    assert entropy.tag(key, "ab", "c") != entropy.tag(key, "a", "bc")  # parts are length-prefixed
    with pytest.raises(ValueError, match="tag key must be 32 bytes"):
        entropy.tag(b"short", "x")
