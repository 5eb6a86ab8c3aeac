"""The link layer's conversions (services/transport/wire.py): the engines' plain values survive the wire both ways,
and a malformed message is an INVALID_ARGUMENT naming its field."""

from __future__ import annotations

import numpy as np
import pytest

from vflsec.services.defenses.release import ReleasedParams
from vflsec.services.errors import InvalidArgument
from vflsec.services.models.family import TrainingConfig
from vflsec.services.transport import wire
from vflsec.services.transport.tensors import to_tensor
from vflsec.v1 import common_pb2, coordinator_pb2


def test_training_config_round_trip() -> None:
    config = TrainingConfig("sgd", 0.25, 1e-3, 64, 7)
    assert wire.training_config(wire.training_message(config)) == config
    assert wire.training_config(common_pb2.TrainingConfig()) == TrainingConfig()  # unset: the family's defaults
    assert wire.training_settings(wire.training_message(config)) == {"optimizer": "sgd", "learning_rate": 0.25,
                                                                     "l2": 1e-3}  # fmt: skip


def test_release_steps_round_trip() -> None:
    steps = [("rounding", {"decimals": "2"}), ("withhold", {})]
    assert wire.steps_of(wire.steps_message(steps)) == steps


def test_released_model_round_trip_keeps_order_withheld_blocks_and_offset() -> None:
    rng = np.random.default_rng(0)
    released = ReleasedParams(
        passive={"passive-2": rng.normal(size=(1, 3)), "passive-1": None},
        bias_offset=rng.normal(size=1),
        tensors={"w_active": rng.normal(size=(1, 4)), "bias": rng.normal(size=1)},
        chain=[("noise", {"sigma": "0.1"})],
    )
    back = wire.released_model_of(wire.released_model_message(released))
    assert list(back.passive) == ["passive-2", "passive-1"] and back.passive["passive-1"] is None
    np.testing.assert_array_equal(back.passive["passive-2"], released.passive["passive-2"])
    np.testing.assert_array_equal(back.bias_offset, released.bias_offset)
    assert back.tensors.keys() == released.tensors.keys() and back.chain == released.chain
    for name, value in released.tensors.items():
        np.testing.assert_array_equal(back.tensors[name], value)
    unset = wire.released_model_of(coordinator_pb2.ReleasedModel())
    assert unset.bias_offset is None and unset.passive == {} and unset.tensors == {}


def test_a_malformed_released_block_is_refused_by_name() -> None:
    vector = coordinator_pb2.PassiveBlock(party_id="passive-1", weights=to_tensor(np.zeros(3)))
    with pytest.raises(InvalidArgument, match="weights of passive-1: expected 2 dimensions"):
        wire.released_model_of(coordinator_pb2.ReleasedModel(passive=[vector]))
    nan = coordinator_pb2.ReleasedModel(tensors={"bias": to_tensor(np.array([np.nan]))})
    with pytest.raises(InvalidArgument, match="released bias: contains NaN"):
        wire.released_model_of(nan)
