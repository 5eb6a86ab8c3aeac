"""The operator's spec for trees and forests: grown once (epochs 1, every row in one step), family settings passed
on, and the wire form of the tree settings round-trips."""

import pytest

from vflsec.client.federation.launcher import FederationSpec, SpecError
from vflsec.services.models import family as families
from vflsec.services.transport import wire
from vflsec.v1 import common_pb2


def test_a_tree_is_grown_once() -> None:
    with pytest.raises(SpecError, match=r"epochs must be 1 .* smallest and only accepted value is 1"):
        FederationSpec("wine", model="tree", epochs=30)
    with pytest.raises(SpecError, match="leave the batch size at 0"):
        FederationSpec("wine", model="forest", epochs=1, batch_size=64)
    with pytest.raises(SpecError, match="one tree for a tree"):
        FederationSpec("wine", model="tree", epochs=1, trees=3)
    spec = FederationSpec("wine", model="forest", epochs=1, trees=7, max_depth=2)
    assert spec.batch_size_for([5, 4])[0] == families.get("forest").default_batch_size(())
    options = spec.session_options()
    assert options["family"] == "forest" and options["settings"] == {"max_depth": 2, "n_trees": 7}


@pytest.mark.parametrize("family", ["tree", "forest"])
def test_tree_settings_round_trip_the_wire(family: str) -> None:
    values = {"max_depth": 4, "n_trees": 1 if family == "tree" else 9, "n_bins": 8, "party": 2, "bootstrap": False,
              "partition_defense": ["complete_secure:trees=1", "passive_depth:depth=2"]}  # fmt: skip
    name, back = wire.model_settings(wire.model_choice(family, values), common_pb2.TrainingConfig(seed=11))
    assert name == family and back == {**values, "seed": 11}
    settings = families.get(family).settings(back)
    assert settings.party == 2 and settings.config.kind == family and settings.config.seed == 11
    assert settings.config.partition_defense == ("complete_secure:trees=1", "passive_depth:depth=2")
    defaults = families.get(family).settings({})
    assert (defaults.config.n_trees, defaults.config.max_depth) == ((1, 5) if family == "tree" else (100, 3))
