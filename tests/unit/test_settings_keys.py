"""Model settings are never dropped silently: the client converter (wire.model_choice, Operator.create_session) and
the servers' reading of a SplitNnModel (wire.model_settings) refuse an unknown or misplaced key, naming it."""

from __future__ import annotations

import pytest

from vflsec.client.federation.operator import Operator
from vflsec.services.errors import InvalidArgument
from vflsec.services.transport import wire
from vflsec.v1 import common_pb2


@pytest.mark.parametrize(
    ("family", "settings", "named"),
    [
        # the reviewer's case: a typo, and two optimiser keys at the top level
        ("splitnn", {"embeding": 4, "schedule": "cosine", "momentum": 0.3}, "embeding, momentum, schedule"),
        ("splitnn", {"passive_bias": True}, "passive_bias"),  # not carried by SplitNnModel
        ("splitnn", {"optimizer": {"schedul": "step"}}, "schedul"),
        ("tree", {"max_dept": 3}, "max_dept"),
        ("forest", {"trees": 10}, "trees"),
    ],
)
def test_model_choice_refuses_unknown_keys_naming_them_and_the_accepted(family, settings, named) -> None:
    with pytest.raises(InvalidArgument, match=rf"unknown or misplaced key\(s\) {named}; accepted: ") as refused:
        wire.model_choice(family, settings)
    accepted = str(refused.value).split("accepted: ")[1]
    assert ("topology" in accepted) == (family == "splitnn" and "optimizer" not in settings)
    assert ("schedule" in accepted) == (family == "splitnn")


def test_model_choice_carries_every_accepted_key_through_model_settings() -> None:
    """What the converter accepts it carries: the round trip through the messages keeps every value."""
    values = {
        "topology": "active-top",
        "embedding": 4,
        "bottom_hidden": [5],
        "top_hidden": [6, 3],
        "activation": "tanh",
        "dropout": 0.25,
        "bottom_bias": False,
        "top_bias": False,
        "passive_width": 9,
        "party": 2,
        "optimizer": {"momentum": 0.3, "schedule": "step", "step_epochs": 2, "gamma": 0.25},
    }
    training = common_pb2.TrainingConfig(optimizer="sgd", learning_rate=0.1, l2=0.01, seed=7)
    family, back = wire.model_settings(wire.model_choice("splitnn", values), training)
    assert family == "splitnn"
    optimizer = {"name": "sgd", "learning_rate": 0.1, "weight_decay": 0.01, **values["optimizer"]}
    assert back == {**values, "optimizer": optimizer, "seed": 7}


@pytest.mark.parametrize(
    ("fields", "optimizer", "named"),
    [
        ({"momentum": 0.3}, "adam", "SplitNnModel.momentum applies to the sgd optimizer only; this session has adam"),
        ({"gamma": 0.5}, "sgd", "SplitNnModel.gamma applies to the step schedule only; this session has constant"),
        ({"schedule": "step", "schedule_epochs": 4}, "adam", "schedule_epochs applies to the cosine schedule only"),
        ({"passive_width": 8}, "adam", "passive_width applies to the active-top topology only"),
    ],
)
def test_model_settings_refuses_a_field_the_session_would_not_use(fields, optimizer, named) -> None:
    model = common_pb2.ModelChoice(splitnn=common_pb2.SplitNnModel(**fields))
    with pytest.raises(InvalidArgument, match=named):
        wire.model_settings(model, common_pb2.TrainingConfig(optimizer=optimizer))


@pytest.mark.parametrize(
    ("family", "settings", "named"),
    [
        ("splitnn", {"optimizer": {"learning_rate": 0.1}}, r"learning_rate \(create_session's learning_rate=\)"),
        ("splitnn", {"seed": 3, "optimizer": {"weight_decay": 0.1}}, r"seed .*, weight_decay \(create_session's l2=\)"),
        ("lr", {"embedding": 4}, "LR settings .* unknown or misplaced key"),
    ],
)
def test_operator_refuses_settings_that_are_its_own_arguments_before_sending(family, settings, named) -> None:
    class Unreachable:  # nothing may be sent
        def CreateSession(self, request):
            raise AssertionError("sent")

    operator = Operator.__new__(Operator)
    operator.stub = Unreachable()
    with pytest.raises(InvalidArgument, match=named):
        operator.create_session("plain", family=family, settings=settings)


def test_an_empty_top_hidden_is_refused_not_built_as_the_default() -> None:
    """Review 10 F6: the wire reads an empty top_hidden as the default (32,), so a linear top was built as another
    network without a word; the converter refuses it naming the field."""
    with pytest.raises(InvalidArgument, match="top_hidden must name at least one hidden width"):
        wire.model_choice("splitnn", {"top_hidden": []})
    assert list(wire.model_choice("splitnn", {"top_hidden": [4]}).splitnn.top_hidden) == [4]
