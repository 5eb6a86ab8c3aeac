"""Split-NN configuration: every invalid architecture or optimiser setting is refused with a message naming it."""

from __future__ import annotations

import json
import math

import pytest
import torch

from vflsec.services.models import splitnn as sn
from vflsec.services.models.splitnn.modules import ActiveTopHead, build_bottom, build_top


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"topology": "server-top"}, "topology must be one of"),
        ({"features": (4,)}, "at least one passive party"),
        ({"features": (4, 0)}, "positive integer"),
        ({"features": (4, 2.5)}, "positive integer"),
        ({"n_classes": 1}, "n_classes must be an integer >= 2"),
        ({"embedding": 0}, "embedding width"),
        ({"bottom_hidden": ((8,),)}, "1 entries for 2 parties"),
        ({"bottom_hidden": ((8,), (0,))}, "hidden layer widths"),
        ({"top_hidden": (16, -1)}, "hidden layer widths"),
        ({"topology": "active-top", "bottom_hidden": ((), (8,))}, "one linear layer"),
        ({"passive_width": 4}, "active-top only"),
        ({"topology": "active-top", "passive_width": 0}, "passive_width must be a positive integer"),
        ({"activation": "gelu"}, "activation must be one of relu, tanh, sigmoid"),
        ({"dropout": 1.0}, r"dropout must lie in \[0, 1\)"),
        ({"dropout": math.nan}, "dropout"),
        ({"top_bias": 1}, "top_bias must be a bool"),
    ],
)
def test_config_errors(kwargs: dict, message: str) -> None:
    base = {"topology": "coordinator-top", "features": (4, 3), "n_classes": 2}
    with pytest.raises(ValueError, match=f"split-NN config: .*{message}"):
        sn.SplitNNConfig(**{**base, **kwargs})


def test_widths_and_defaults() -> None:
    ctop = sn.SplitNNConfig("coordinator-top", [4, 3, 12], 3, embedding=10)
    assert ctop.bottom_hidden == ((), (), ()) and ctop.top_input == 10
    assert [ctop.output_width(p) for p in range(3)] == [10, 10, 10]
    atop = sn.SplitNNConfig("active-top", (4, 3, 12), 3, embedding=10, bottom_hidden=((16,), (), ()))
    assert [atop.output_width(p) for p in range(3)] == [10, 8, 12]  # passive: max(d_B, 8)
    assert atop.top_input == 30
    assert sn.SplitNNConfig("active-top", (4, 3), 2, passive_width=5).output_width(1) == 5
    assert ctop == sn.SplitNNConfig("coordinator-top", (4, 3, 12), 3, embedding=10)


def test_modules_have_the_configured_shape() -> None:
    config = sn.SplitNNConfig("active-top", (4, 3), 3, bottom_hidden=((6,), ()), top_hidden=(7,), dropout=0.1)
    passive = build_bottom(config, 1, seed=0)
    assert [tuple(p.shape) for p in passive.parameters()] == [(8, 3)]  # one linear layer, no bias by default
    top = build_top(config, seed=0)
    assert isinstance(top[0], torch.nn.ReLU) and isinstance(top[1], torch.nn.Dropout)  # starts on z = [h_a, z_B]
    head = ActiveTopHead(config, seed=0)
    x, z = torch.zeros(5, 4, dtype=torch.float64), torch.zeros(5, 8, dtype=torch.float64)
    assert head(x, z).shape == (5, 3)
    with pytest.raises(ValueError, match="party index"):
        build_bottom(config, 2, seed=0)


def test_active_top_refuses_ckks() -> None:
    sn.check_backend("coordinator-top", "ckks")
    sn.check_backend("active-top", "plain")
    with pytest.raises(ValueError, match="--backend ckks does not apply to --topology active-top"):
        sn.check_backend("active-top", "ckks")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "rmsprop"}, "name must be one of"),
        ({"learning_rate": 0.0}, "learning_rate must be positive"),
        ({"learning_rate": math.inf}, "learning_rate must be positive"),
        ({"momentum": 1.0}, "momentum"),
        ({"weight_decay": -1e-3}, "weight_decay"),
        ({"schedule": "linear"}, "schedule must be one of"),
        ({"schedule": "cosine"}, "the cosine schedule needs epochs"),
        ({"step_epochs": 0}, "step_epochs"),
        ({"gamma": 0.0}, "gamma"),
        ({"epochs": 0}, "epochs must be a positive integer"),
    ],
)
def test_optimizer_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=f"split-NN optimizer: {message}"):
        sn.OptimizerConfig(**kwargs)


def test_schedules() -> None:
    step = sn.OptimizerConfig(schedule="step", step_epochs=2, gamma=0.5)
    assert [step.rate_factor(e) for e in range(5)] == [1, 1, 0.5, 0.5, 0.25]
    cosine = sn.OptimizerConfig(schedule="cosine", epochs=4)
    assert [cosine.rate_factor(e) for e in (0, 2, 4, 9)] == pytest.approx([1.0, 0.5, 0.0, 0.0])
    params = [torch.nn.Parameter(torch.zeros(2))]
    opt, schedule = sn.build_optimizer(params, sn.OptimizerConfig("sgd", learning_rate=0.2, schedule="step",
                                                                  step_epochs=1, gamma=0.5, weight_decay=0.1))
    assert isinstance(opt, torch.optim.SGD) and opt.param_groups[0]["momentum"] == 0.9
    opt.step()  # (no gradients: a no-op) the scheduler expects a step before it
    schedule.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)
    adam, _ = sn.build_optimizer(params, sn.OptimizerConfig())
    assert isinstance(adam, torch.optim.Adam)


def test_dict_round_trip() -> None:
    config = sn.SplitNNConfig("active-top", (4, 3), 3, bottom_hidden=((6,), ()), passive_width=5, dropout=0.1)
    assert sn.SplitNNConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    optim = sn.OptimizerConfig("sgd", schedule="cosine", epochs=7)
    assert sn.OptimizerConfig.from_dict(json.loads(json.dumps(optim.to_dict()))) == optim
    with pytest.raises(ValueError, match="unknown field"):
        sn.OptimizerConfig.from_dict({"name": "sgd", "nesterov": True})
    with pytest.raises(ValueError, match="sequences of integers"):
        sn.SplitNNConfig.from_dict({**config.to_dict(), "features": 7})
