"""Split-NN's options through the real services (loopback gRPC, mTLS; plain backend, small data): a learning-rate
schedule steps at the same epochs at every party that owns an optimiser, and the architecture and optimiser options
reach every party's modules."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import torch
from torch import nn

from tests.integration.conftest import federation
from tests.integration.test_splitnn_services import TRAINING, _run
from vflsec.services.data import datasets
from vflsec.services.errors import PeerFailed
from vflsec.services.transport import wire
from vflsec.services.transport.links import CoordinatorClient, PassiveClient
from vflsec.v1 import active_pb2, common_pb2

EPOCHS = 4


def _optimisers(fed) -> dict[str, list]:
    """Every party's torch optimisers of its (only) session: the active party's, the passive party's, the key
    holder's (none in active-top)."""
    found = {}
    for party in ("active", "passive-1", "coordinator"):
        sessions = fed.parties[party].engine.sessions
        trainer = sessions[next(iter(sessions))].trainer
        roles = [getattr(trainer, name, None) for name in ("bottom", "head")]
        found[party] = [role for role in roles if role is not None]
    return found


@pytest.mark.parametrize("topology", ["coordinator-top", "active-top"])
def test_a_step_schedule_matches_central_and_steps_at_every_party(tmp_path, topology: str) -> None:
    """Halving the rate every epoch: the federated run matches the central torch model with the same schedule (on
    the same batches), and after the last epoch every party's optimiser runs at lr·γ^(epochs-1)."""
    ds = datasets.load_dataset("breast_cancer")
    model = {"embedding": 8, "top_hidden": [16], "optimizer": {"schedule": "step", "step_epochs": 1, "gamma": 0.5}}
    training = {**TRAINING, "learning_rate": 0.05}
    with federation(tmp_path, dataset="breast_cancer", n_passive=1, backend="plain") as fed:
        federated, central, _ = _run(fed, "plain", ds, topology, EPOCHS, training, model)
        roles = _optimisers(fed)
    assert central >= 0.85
    assert abs(federated - central) <= 0.01, (federated, central)
    expected = training["learning_rate"] * 0.5 ** (EPOCHS - 1)
    owners = {party for party, held in roles.items() if held}
    assert owners == {"active", "passive-1", *(["coordinator"] if topology == "coordinator-top" else [])}
    for party, held in roles.items():
        for role in held:
            assert [g["lr"] for g in role.optimizer.param_groups] == pytest.approx([expected]), party


@pytest.mark.parametrize("topology", ["coordinator-top", "active-top"])
def test_architecture_and_optimiser_options_reach_every_party(tmp_path, topology: str) -> None:
    """tanh, hidden layers in the bottoms and the top, SGD with momentum and weight decay: parity with the central
    model of those options (the same batches); then a dropout session builds its dropout layers at every party."""
    ds = datasets.load_dataset("breast_cancer")
    model = {
        "embedding": 6,
        "bottom_hidden": [10],
        "top_hidden": [12, 8],
        "activation": "tanh",
        "optimizer": {"momentum": 0.9},
    }
    training = {**TRAINING, "optimizer": "sgd", "learning_rate": 0.05, "l2": 0.001}
    spec = {"dataset": "breast_cancer", "n_passive": 1, "backend": "plain"}
    with federation(tmp_path / "plain", **spec) as fed:
        federated, central, released = _run(fed, "plain", ds, topology, 12, training, model)
        roles = _optimisers(fed)
    assert central >= 0.85, (federated, central)
    assert abs(federated - central) <= 0.01, (federated, central)
    shapes = {name: t.shape for name, t in released["tensors"].items()}
    # The passive bottom's first layer: 10 hidden units in coordinator-top; one linear layer in active-top.
    first = next(shape for name, shape in sorted(shapes.items()) if name.startswith("bottom/1/") and len(shape) == 2)
    assert first[0] == (10 if topology == "coordinator-top" else max(first[1], 8)), shapes
    for party, held in roles.items():
        for role in held:
            (group,) = role.optimizer.param_groups
            assert isinstance(role.optimizer, torch.optim.SGD), party
            assert (group["momentum"], group["weight_decay"]) == (0.9, 0.001), party
            if party != "passive-1" or topology == "coordinator-top":  # active-top's passive bottom: one layer
                assert any(isinstance(m, nn.Tanh) for m in role.module.modules()), party

    with federation(tmp_path / "dropout", **spec) as fed:
        settings = {"topology": topology, "embedding": 6, "bottom_hidden": [8], "top_hidden": [12], "dropout": 0.3}
        info = fed.operator.create_session("plain", family="splitnn", settings=settings, **TRAINING)
        list(fed.operator.train(info.session_id, fed.operator.align(info.session_id)[:128], 1))
        roles = _optimisers(fed)
    for party, held in roles.items():
        for role in held:
            if party != "passive-1" or topology == "coordinator-top":
                dropouts = [m.p for m in role.module.modules() if isinstance(m, nn.Dropout)]
                assert dropouts and set(dropouts) == {0.3}, party


def test_a_misplaced_setting_is_refused_at_session_creation_and_the_party_keeps_serving(tmp_path) -> None:
    """SplitNnModel.momentum on an adam session (a raw request, past the client's checks): INVALID_ARGUMENT naming
    the field, where the settings arrive; the active party then opens a correct session."""
    model = common_pb2.ModelChoice(splitnn=common_pb2.SplitNnModel(momentum=0.3))
    request = active_pb2.CreateSessionRequest(
        backend=wire.BACKEND_ENUM["plain"], training=common_pb2.TrainingConfig(optimizer="adam"), model=model
    )
    with federation(tmp_path, dataset="breast_cancer", n_passive=1, backend="plain") as fed:
        with pytest.raises(grpc.RpcError) as refused:
            fed.operator.stub.CreateSession(request)
        info = fed.operator.create_session("plain", family="splitnn", settings={"embedding": 4})
        assert fed.operator.align(info.session_id)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "SplitNnModel.momentum applies to the sgd optimizer only" in refused.value.details()


def test_a_negative_epoch_is_refused_and_the_session_trains_on(tmp_path) -> None:
    """SendEmbedding and TopStep with epoch -1: INVALID_ARGUMENT naming the epoch, nothing admitted (the session's
    next step still trains)."""
    with federation(tmp_path, dataset="breast_cancer", n_passive=1, backend="plain") as fed:
        op = fed.operator
        sid = op.create_session("plain", family="splitnn", settings={"embedding": 4}, **TRAINING).session_id
        common = op.align(sid)
        rows = np.arange(8, dtype=np.int64)
        with fed.channel("active", "coordinator") as owner, fed.channel("active", "passive-1") as active:
            key_holder, passive = CoordinatorClient(owner), PassiveClient("passive-1", active)
            zeros = np.zeros((8, 4), np.uint64)
            calls = {
                "SendEmbedding": lambda: passive.splitnn.send_embedding(sid, 1, rows, epoch=-1),
                "TopStep": lambda: key_holder.splitnn.top_step(sid, 1, rows, zeros, np.zeros(8), {}, epoch=-1),
            }
            for what, call in calls.items():
                with pytest.raises(PeerFailed) as refused:
                    call()
                assert refused.value.code == "INVALID_ARGUMENT", (what, str(refused.value))
                assert "epoch must be >= 0, got -1" in str(refused.value), what
        assert list(op.train(sid, common[:128], 1))[-1].done
