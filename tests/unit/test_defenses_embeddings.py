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


def test_gaussian_noise_has_the_stated_sigma_and_is_fixed_per_row() -> None:
    noise = EmbeddingNoise(0.5)
    x = rows(400)
    first = noise.draw(x, 51)
    assert first.shape == (400, 51)
    assert abs(np.std(first) - 0.5) < 0.02 and abs(np.mean(first)) < 0.02
    assert abs(np.mean(first**4) / np.mean(first**2) ** 2 - 3) < 0.3  # Gaussian kurtosis
    assert np.array_equal(noise.draw(x, 51), first)  # the same rows asked again: the same noise
    order = np.random.default_rng(1).permutation(400)
    assert np.array_equal(noise.draw(x[order][:9], 51), first[order][:9])  # whatever the batch and its order
    # averaging k answers of the same rows does not shrink the error (fresh draws would leave σ/√k)
    averaged = np.mean([noise(x, np.zeros((400, 51))) for _ in range(16)], axis=0)
    assert abs(np.std(averaged) - 0.5) < 0.02
    # different rows, entries and keys: independent noise
    assert abs(np.corrcoef(first[:-1].ravel(), first[1:].ravel())[0, 1]) < 0.03
    assert abs(np.corrcoef(first[:, :-1].ravel(), first[:, 1:].ravel())[0, 1]) < 0.03
    other = EmbeddingNoise(0.5).draw(x, 51)
    assert abs(np.corrcoef(first.ravel(), other.ravel())[0, 1]) < 0.03
    assert noise.public_params() == {"sigma": "0.5"} and noise.get_params() == {"sigma": 0.5}  # no key
    wrapped = noise.wrap(torch.nn.Identity())
    inputs = torch.from_numpy(x[:10]).requires_grad_(True)
    out = wrapped(inputs)
    assert torch.equal(out, inputs + torch.from_numpy(first[:10, :5]))
    out.sum().backward()
    assert torch.equal(inputs.grad, torch.ones_like(inputs))  # gradients pass unchanged
    for bad in ("0", "-1", "nan", "x", "true"):  # as specs: the shared parser, then the range check
        with pytest.raises(PluginError, match="sigma"):
            EMBEDDING_STEPS.parse(f"embedding_noise:sigma={bad}")
