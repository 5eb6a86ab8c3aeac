"""A passive party's [defenses] embedding: parsed from its TOML, checked at start, fresh draws per session."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from vflsec.services.config import ConfigError, parse_config
from vflsec.services.defenses.embedding_layers import MasqueradeLinear, NoisyEmbedding
from vflsec.services.defenses.embeddings import EmbeddingChain, Masquerade
from vflsec.services.registry import PluginError


def _raw(role: str, embedding: object) -> dict:
    return {
        "role": role,
        "party_id": role if role != "passive" else "passive-1",
        "listen": "127.0.0.1:0",
        "tls": {"ca": "ca.pem", "cert": "cert.pem", "key": "key.pem"},
        "data": {"path": "data.csv"},
        "defenses": {"embedding": embedding},
    }


def test_a_passive_party_configures_its_embedding_chain_in_its_toml() -> None:
    config = parse_config(_raw("passive", ["masquerade:m=16"]), base=Path("."))
    assert config.embedding_release == ("masquerade:m=16",)
    with pytest.raises(ConfigError, match="passive party's own defense"):
        parse_config(_raw("active", ["masquerade:m=16"]), base=Path("."))
    with pytest.raises(ConfigError, match="list of specs"):
        parse_config(_raw("passive", "masquerade:m=16"), base=Path("."))


def test_a_bad_spec_names_the_step_and_its_parameters() -> None:
    with pytest.raises(PluginError, match=r"'masquerade' has no parameter.*accepted: m, rank, drop"):
        EmbeddingChain.from_specs(["masquerade:n=3"])
    with pytest.raises(ValueError, match="m must lie in"):
        EmbeddingChain.from_specs(["masquerade:m=0"])
    with pytest.raises(ValueError, match="first embedding step"):
        EmbeddingChain.from_specs(["embedding_noise:sigma=0.1", "masquerade:m=1"])


def test_each_session_draws_its_own_key_and_announces_no_secret() -> None:
    template = EmbeddingChain.from_specs(["masquerade", "embedding_noise:sigma=0.5"])
    kept = np.eye(5)  # K of a party without binary columns: drop=binary drops one keyed random direction
    first, second = template.for_session(1000, basis=kept), template.for_session(1000, basis=kept)
    noise = ("embedding_noise", {"sigma": "0.5", "max_answers": "128"})  # the default budget, announced
    assert first.announced() == [("masquerade", {"m": "10", "drop": "binary"}), noise]
    assert first.specs() == ["masquerade:m=10,drop=binary", "embedding_noise:sigma=0.5,max_answers=128"]
    assert first.max_answers == 128 and EmbeddingChain.from_specs(["masquerade"]).max_answers is None
    assert len(set(first.keys + second.keys)) == 4  # OS entropy per step and session
    x = np.random.default_rng(0).normal(size=(64, 5))
    assert not np.array_equal(first.steps[0].bits(x), second.steps[0].bits(x))
    restored = EmbeddingChain.from_specs(first.specs()).for_session(1, first.keys)
    assert np.array_equal(restored.steps[0].bits(x), first.steps[0].bits(x))
    assert np.array_equal(restored.steps[1].draw(x, 6), first.steps[1].draw(x, 6))
    assert not np.array_equal(second.steps[1].draw(x, 6), first.steps[1].draw(x, 6))
    announced = str(first.announced())
    assert all(key.hex() not in announced and str(key) not in announced for key in first.keys)
    with pytest.raises(ValueError, match="keys of 32 bytes"):
        template.for_session(1, [b"short"])
    module = first.module(torch.nn.Linear(5, 14), 5, 14, bias=False)  # rank 4 + 10 bits
    assert isinstance(module, NoisyEmbedding) and isinstance(module.inner, MasqueradeLinear)
    assert isinstance(module.inner.masquerade, Masquerade) and module.inner.masquerade.m == 10


def test_a_defense_wider_than_the_default_widens_the_layer_unless_the_session_fixed_the_width() -> None:
    from vflsec.services.models.splitnn.trainers import FAMILY

    chain = EmbeddingChain.from_specs(["masquerade"]).for_session(1000, basis=np.eye(5))  # m = ⌈log₂ 1000⌉ = 10
    assert chain.min_width(5) == 4 + 10 and EmbeddingChain().min_width(5) is None
    free = FAMILY.new_passive(2, 5, FAMILY.settings({"topology": "active-top", "party": 1}))
    assert free.share_width == 8  # max(d_B, 8)
    widened = free.defended(chain.module, chain.min_width(5))
    assert widened.share_width == 14 and widened.settings.passive_width == 14  # what JoinSession announces
    restored = FAMILY.restore_passive(widened.to_state(), chain.module)  # the checkpoint rebuilds the same layer
    assert restored.share_width == 14
    fixed = FAMILY.new_passive(2, 5, FAMILY.settings({"topology": "active-top", "party": 1, "passive_width": 8}))
    with pytest.raises(ValueError, match="raise passive_width to at least 14"):
        fixed.defended(chain.module, chain.min_width(5))


def test_the_active_party_builds_its_top_on_the_announced_widths() -> None:
    from vflsec.services.models.splitnn.trainers import FAMILY

    settings = FAMILY.settings({"topology": "active-top", "passive_widths": [14, 8]})
    trainer = FAMILY.new_active(2, 3, settings, [5, 4])
    assert trainer.output_widths() == [14, 8]
    assert FAMILY.restore_active(trainer.to_state()).output_widths() == [14, 8]
    with pytest.raises(ValueError, match="fixed passive_width = 8"):
        FAMILY.settings({"topology": "active-top", "passive_width": 8, "passive_widths": [14]})
    with pytest.raises(ValueError, match="active-top only"):
        FAMILY.settings({"passive_widths": [14]})


def test_an_announced_width_beyond_what_a_defense_can_need_is_refused() -> None:
    from vflsec.services.models.splitnn.trainers import FAMILY

    for width in (7, 8 + 128 + 1):  # below max(d_p, 8); wider than masquerade's largest m adds
        with pytest.raises(ValueError, match=f"announced a z_p width of {width}"):
            FAMILY.new_active(2, 3, FAMILY.settings({"topology": "active-top", "passive_widths": [width]}), [5])
    wide = FAMILY.settings({"topology": "active-top", "passive_widths": [300]})
    assert FAMILY.new_active(2, 3, wide, [300]).output_widths() == [300]  # d_p = 300: its own default width
