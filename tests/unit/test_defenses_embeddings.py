"""Passive-side embedding defenses: masquerade's keyed per-sample bits and layer, Gaussian noise on z_B."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vflsec.services.attacks.binary import binary_match, enumerate_binary
from vflsec.services.defenses.embeddings import EMBEDDING_STEPS, EmbeddingNoise, Masquerade, default_fabricated
from vflsec.services.registry import PluginError


def rows(n: int, d: int = 5, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, d))


def test_default_m_is_ceil_log2_n() -> None:
    assert [default_fabricated(n) for n in (2, 3, 1024, 1025, 41188)] == [1, 2, 10, 11, 16]
    assert Masquerade().resolve(41188).m == 16
    assert Masquerade().public_params() == {"m": "log2n"}
    with pytest.raises(ValueError, match="resolve"):
        Masquerade().bits(rows(3))


def test_bits_are_fixed_per_sample_whatever_the_batch() -> None:
    masquerade = Masquerade(12)
    x = rows(500)
    bits = masquerade.bits(x)
    assert bits.shape == (500, 12) and set(np.unique(bits)) <= {0.0, 1.0}
    order = np.random.default_rng(1).permutation(500)
    assert np.array_equal(masquerade.bits(x[order]), bits[order])  # another batch, another order
    assert np.array_equal(masquerade.bits(x[:7]), bits[:7])  # a repeated query of the same samples


def test_bits_are_unpredictable_across_keys() -> None:
    x = rows(4000)
    first, second = Masquerade(8).bits(x), Masquerade(8).bits(x)  # two fresh OS-entropy keys
    assert 0.47 < np.mean(first) < 0.53  # fair coins
    assert 0.47 < np.mean(first == second) < 0.53  # one key's pattern says nothing about another's
    same_key = Masquerade(8)
    assert np.array_equal(same_key.bits(x), same_key.resolve(len(x)).bits(x))  # a sample keeps its pattern
    assert Masquerade().get_params() == {"m": None, "rank": None}  # the key is no parameter: never announced


def test_embedding_steps_are_plug_ins_parsed_by_the_shared_parser() -> None:
    assert EMBEDDING_STEPS.parse("masquerade:m=4", family="splitnn").m == 4
    assert EMBEDDING_STEPS.parse("embedding_noise:sigma=0.5").sigma == 0.5
    with pytest.raises(PluginError, match="lr"):
        EMBEDDING_STEPS.parse("masquerade", family="lr")
    with pytest.raises(PluginError, match="sigma"):
        EMBEDDING_STEPS.parse("embedding_noise:sigma=-1")


def test_layer_puts_the_fabricated_bits_in_the_span_and_checks_its_width() -> None:
    masquerade = Masquerade(3)
    layer = masquerade.build(5, 10, bias=False, seed=0)
    x = rows(800)
    with torch.no_grad():
        z = layer(torch.from_numpy(x)).numpy()
    assert z.shape == (800, 10)
    found = enumerate_binary(z, 5 + 3)
    assert found.rank == 4 + 3 + 1  # rank d_B − 1 true part, 3 bits, the ones vector
    assert np.all(binary_match(masquerade.bits(x), found.vectors, complements=True).max(axis=1) == 1.0)
    with pytest.raises(ValueError, match="passive width >= rank \\+ m = 7"):
        masquerade.build(5, 6, bias=False, seed=0)


def test_layer_trains_through_its_parameters() -> None:
    layer = Masquerade(2).build(4, 8, bias=True, seed=0)
    x = torch.from_numpy(rows(64, 4))
    layer(x).pow(2).sum().backward()
    assert all(p.grad is not None and torch.any(p.grad != 0) for p in layer.parameters())


def test_gaussian_noise_has_the_stated_sigma_and_fresh_draws() -> None:
    noise = EmbeddingNoise(0.5)
    z = np.zeros((200, 50))
    first, second = noise(z), noise(z)
    assert abs(np.std(first) - 0.5) < 0.03
    assert not np.array_equal(first, second)
    assert noise.public_params() == {"sigma": "0.5"}
    wrapped = noise.wrap(torch.nn.Identity())
    out = wrapped(torch.zeros(10, 3, dtype=torch.float64, requires_grad=True))
    assert out.shape == (10, 3) and torch.any(out != 0)
    for bad in ("0", "-1", "nan", "x", "true"):  # as specs: the shared parser, then the range check
        with pytest.raises(PluginError, match="sigma"):
            EMBEDDING_STEPS.parse(f"embedding_noise:sigma={bad}")
