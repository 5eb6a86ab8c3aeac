"""Passive-side embedding defenses: masquerade's keyed per-sample bits and layer, Gaussian noise on z_B."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vflsec.services.attacks.binary import binary_match, enumerate_binary
from vflsec.services.defenses.embedding_layers import model_version
from vflsec.services.defenses.embeddings import (
    EMBEDDING_STEPS,
    EmbeddingChain,
    EmbeddingNoise,
    Masquerade,
    default_fabricated,
)
from vflsec.services.registry import PluginError


def rows(n: int, d: int = 5, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, d))


def test_default_m_is_ceil_log2_n() -> None:
    assert [default_fabricated(n) for n in (2, 3, 1024, 1025, 41188)] == [1, 2, 10, 11, 16]
    assert Masquerade().resolve(41188).m == 16
    assert Masquerade().public_params() == {"m": "log2n", "drop": "binary"}  # drop: public, announced
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
    # the key is no parameter: never announced
    assert Masquerade().get_params() == {"m": None, "rank": None, "drop": "binary"}


def test_embedding_steps_are_plug_ins_parsed_by_the_shared_parser() -> None:
    assert EMBEDDING_STEPS.parse("masquerade:m=4", family="splitnn").m == 4
    assert EMBEDDING_STEPS.parse("embedding_noise:sigma=0.5").sigma == 0.5
    assert EMBEDDING_STEPS.parse("embedding_noise:sigma=0.5,max_answers=40").max_answers == 40
    for bad in ("0", "65536", "1.5", "x"):  # the shared parser, then the range (counted in uint16)
        with pytest.raises(PluginError, match="max_answers"):
            EMBEDDING_STEPS.parse(f"embedding_noise:sigma=0.5,max_answers={bad}")
    with pytest.raises(PluginError, match="lr"):
        EMBEDDING_STEPS.parse("masquerade", family="lr")
    with pytest.raises(PluginError, match="sigma"):
        EMBEDDING_STEPS.parse("embedding_noise:sigma=-1")


def test_layer_puts_the_fabricated_bits_in_the_span_and_checks_its_width() -> None:
    masquerade = Masquerade(3, drop="random")  # ye's rank d_B − 1 (drop=binary: tests/unit/test_masquerade_drop.py)
    layer = masquerade.build(5, 10, bias=False)
    x = rows(800)
    with torch.no_grad():
        z = layer(torch.from_numpy(x)).numpy()
    assert z.shape == (800, 10)
    found = enumerate_binary(z, 5 + 3)
    assert found.rank == 4 + 3 + 1  # rank d_B − 1 true part, 3 bits, the ones vector
    assert np.all(binary_match(masquerade.bits(x), found.vectors, complements=True).max(axis=1) == 1.0)
    with pytest.raises(ValueError, match="passive width >= rank \\+ m = 7"):
        masquerade.build(5, 6, bias=False)


def test_layer_trains_through_its_parameters() -> None:
    layer = Masquerade(2, drop="random").build(4, 8, bias=True)
    x = torch.from_numpy(rows(64, 4))
    layer(x).pow(2).sum().backward()
    assert all(p.grad is not None and torch.any(p.grad != 0) for p in layer.parameters())
    assert [name for name, _ in layer.named_parameters()] == ["p.weight", "p.bias"]  # Q is fixed (M1)
    assert "q" in dict(layer.named_buffers()) and "q" in layer.state_dict()  # but checkpointed


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
    assert noise.public_params() == {"sigma": "0.5", "max_answers": "128"}
    assert noise.get_params() == {"sigma": 0.5, "max_answers": 128}  # no key
    wrapped = noise.wrap(torch.nn.Identity())
    inputs = torch.from_numpy(x[:10]).requires_grad_(True)
    out = wrapped(inputs)
    assert torch.equal(out, inputs + torch.from_numpy(noise.draw(x[:10], 5, model_version(torch.nn.Identity()))))
    out.sum().backward()
    assert torch.equal(inputs.grad, torch.ones_like(inputs))  # gradients pass unchanged
    for bad in ("0", "-1", "nan", "x", "true"):  # as specs: the shared parser, then the range check
        with pytest.raises(PluginError, match="sigma"):
            EMBEDDING_STEPS.parse(f"embedding_noise:sigma={bad}")


def _answers(module: torch.nn.Module, x: np.ndarray, steps: int) -> list[np.ndarray]:
    """z_B of ``x`` before and after each of ``steps`` SGD steps on every trainable parameter (model versions)."""
    optimizer = torch.optim.SGD(module.parameters(), lr=0.5)
    inputs = torch.from_numpy(x)
    out = []
    for _ in range(steps + 1):
        with torch.no_grad():
            out.append(module(inputs).numpy())
        target = torch.from_numpy(np.random.default_rng(5).normal(size=out[0].shape))  # a full-rank update
        optimizer.zero_grad()
        (module(inputs) - target).pow(2).mean().backward()
        optimizer.step()
    return out


def test_defended_bottoms_start_from_os_entropy_never_the_session_seed() -> None:
    """H2: the active party chose the session seed; with it, a seeded layer's P0, Q0, b0 read [Q0 x; a(x)] off the
    first batch. Two parties with the same settings (seed) now start from different weights, and so does an undefended
    bottom since issue 27's rule 1 (every module from its holder's OS entropy; parity tests pin weights in-process)."""
    from vflsec.services.models.splitnn.trainers import FAMILY

    settings = FAMILY.settings({"topology": "active-top", "party": 1})
    for specs in (["masquerade:m=3,drop=random"], ["embedding_noise:sigma=0.1"]):
        chains = [EmbeddingChain.from_specs(specs).for_session(1000) for _ in range(2)]  # two parties' own secrets
        first, second = (FAMILY.new_passive(2, 5, settings).defended(chain.module, 8) for chain in chains)
        a, b = first.bottom.module.state_dict(), second.bottom.module.state_dict()
        assert a.keys() == b.keys() and not any(torch.equal(a[k], b[k]) for k in a), specs
    plain = [FAMILY.new_passive(2, 5, settings).bottom.module.state_dict() for _ in range(2)]
    assert plain[0].keys() == plain[1].keys() and not any(torch.equal(plain[0][k], plain[1][k]) for k in plain[0])


def test_two_model_versions_stacked_do_not_bring_the_binary_column_back() -> None:
    """M1: with Q trained, z_B at two versions spans [Q1 x, Q2 x] ∋ the true binary column (0.517 -> 1.000 at m = 1)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 5))
    x[:, 0] = rng.random(600) < 0.3
    masquerade = Masquerade(1, drop="random").resolve(600)  # Q fixed in either mode; ye's here
    before, after = _answers(masquerade.build(5, 8, bias=True), x, steps=3)[::3]
    assert not np.allclose(before, after)  # P trained
    found = enumerate_binary(np.hstack([before, after]), 6)
    assert binary_match(x[:, :1], found.vectors, complements=True).max() <= 0.6
    assert binary_match(masquerade.bits(x), found.vectors, complements=True).max() == 1.0  # the bit it shows


def test_noise_is_fresh_per_model_version_so_differencing_two_answers_finds_nothing() -> None:
    """H1: noise keyed on the row alone cancels in z_1 − z_2 of one row at two versions (Algorithm 1 then reads
    every feature off the difference). Keyed on the version too, it does not; the same version repeats its noise."""
    x = (np.random.default_rng(0).random((500, 6)) < 0.4).astype(float)
    torch.manual_seed(1)
    module = EmbeddingNoise(1.0).wrap(torch.nn.Linear(6, 8).double())
    with torch.no_grad():
        again = [module(torch.from_numpy(x)).numpy() for _ in range(2)]
    assert np.array_equal(*again)  # same weights: the same answer, nothing to average
    first, second = _answers(module, x, steps=1)
    assert np.array_equal(first, again[0])
    found = enumerate_binary(first - second, 6)
    assert found.vectors.shape[1] == 0 or binary_match(x, found.vectors, complements=True).max() <= 0.6
