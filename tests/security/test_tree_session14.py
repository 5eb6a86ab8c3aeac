"""Session 14's tree protocol changes (issue 32), live: K − 1 encrypted class columns, the task digest bound to its
session and key epoch (review 16 F6), and a node recorded at the passive party only once the coordinator took its
products (review 16 F3c).

A real federation (in-process parties, gRPC over loopback, mTLS, PSI) on wine, passive-1 holding 10 of 13 columns;
under CKKS where the ciphertexts matter (the replay), else plain (the refusals are the protocol's, the same under
CKKS). A deviating party is played by patching only its own code.
"""

from __future__ import annotations

import dataclasses

import grpc
import pytest

from tests.integration.conftest import curious_wine
from vflsec.services.engines import checkpoint
from vflsec.services.errors import FailedPrecondition
from vflsec.services.models.tree import steps, trainers
from vflsec.services.transport import tree_links
from vflsec.v1 import common_pb2, passive_pb2_grpc


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    with curious_wine(tmp_path_factory.mktemp("session14"), backend="ckks", allow_plain=True) as (fed, _store):
        yield fed


def _train(fed, backend: str = "plain", seed: int = 0) -> str:
    sid = fed.operator.create_session(backend, family="tree", settings={"max_depth": 3}, seed=seed).session_id
    assert list(fed.operator.train(sid, sorted(fed.operator.align(sid))[:120], 1))[-1].done
    return sid


def _trainer(fed, party: str, sid: str):
    return fed.parties[party].engine.sessions[sid].trainer


def test_indicators_of_every_class_are_refused_by_the_passive_party(fed, monkeypatch) -> None:
    """An active party that sends [[Y]] of all K classes (the form before K − 1 columns) gets INVALID_ARGUMENT
    naming the indicators, before any product is made; the honest K − 1 columns grow the tree."""
    honest = steps.LabelHolder.indicators

    def every_class(self, backend, task, widest, pool=None):
        layout = steps.indicator_layout(task, self.n_classes, widest, backend.slots)
        return trainers.he.encrypt_to_wire(backend, honest(self, task), layout.replicas)

    made: list = []
    honest_products = steps.FeatureOwner.masked_products
    monkeypatch.setattr(steps.FeatureOwner, "masked_products", lambda *a: made.append(1) or honest_products(*a))
    monkeypatch.setattr(steps.LabelHolder, "encrypt", every_class)
    with pytest.raises(grpc.RpcError) as refused:
        _train(fed)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "indicators must be" in refused.value.details() and "every class but the last" in refused.value.details()
    assert not made
    monkeypatch.undo()
    _train(fed)  # the honest K − 1 columns


def test_products_of_another_session_are_refused_unopened(fed, monkeypatch) -> None:
    """Review 16 F6: two sessions with the same seed and rows name the same nodes; a passive party that replays its
    first session's products (CKKS, under that session's keys) into the second is refused at the root, naming the
    node's version, before anything is opened."""
    recorded: dict = {}
    honest_submit = tree_links.TreeCoordinatorClient.submit_counts
    opened: list = []
    honest_open = steps.KeyHolder.open_counts

    def recording(self, session_id, key, *made):
        recorded.setdefault((session_id, tuple(key)), made)
        return honest_submit(self, session_id, key, *made)

    monkeypatch.setattr(tree_links.TreeCoordinatorClient, "submit_counts", recording)
    first = _train(fed, "ckks", seed=7)
    root = recorded[(first, (0, 0))]

    def replaying(self, session_id, key, *made):
        return honest_submit(self, session_id, key, *(root if tuple(key) == (0, 0) else made))

    def counting(self, party, task, *args):
        opened.append(task.key)
        return honest_open(self, party, task, *args)

    monkeypatch.setattr(tree_links.TreeCoordinatorClient, "submit_counts", replaying)
    monkeypatch.setattr(steps.KeyHolder, "open_counts", counting)
    with pytest.raises(grpc.RpcError) as refused:
        _train(fed, "ckks", seed=7)
    assert "another version of node (0, 0)" in refused.value.details()
    assert "session or key epoch" in refused.value.details()
    assert not opened


def test_a_node_is_recorded_only_once_its_products_were_taken(fed, monkeypatch) -> None:
    """Review 16 F3c: the coordinator refuses passive-1's products at the left child (0, 1); passive-1 has recorded
    the root (taken) but not (0, 1), so the right sibling it would imply is not known to it either."""
    role = next(r for r in trainers.STEPS if "submit_counts" in trainers.STEPS[r])
    honest_step = trainers.STEPS[role]["submit_counts"]
    sids: list = []

    def refuse_left(trainer, ctx, key, *args, **kwargs):
        sids.append(ctx.session_id)
        if tuple(key) == (0, 1):
            raise FailedPrecondition("not now")
        return honest_step.run(trainer, ctx, key, *args, **kwargs)

    monkeypatch.setitem(trainers.STEPS[role], "submit_counts", dataclasses.replace(honest_step, run=refuse_left))
    with pytest.raises(grpc.RpcError) as refused:
        _train(fed)
    assert "not now" in refused.value.details()
    known = _trainer(fed, "passive-1", sids[-1]).known
    assert (0, 0) in known.nodes and (0, 1) not in known.nodes and (0, 2) not in known.nodes


def test_a_session_closed_while_its_products_are_in_flight_leaves_no_checkpoint(fed, monkeypatch) -> None:
    """Review 18: the session's owner closes it at passive-1 after the coordinator took passive-1's root products
    and before passive-1 recorded them (PassiveContext.locked): the record is dropped, not checkpointed, so the
    closed session's files stay gone and a restart does not restore it."""
    state = fed.layout.configs["passive-1"].parent / "state"
    honest_submit = tree_links.TreeCoordinatorClient.submit_counts
    closed: list = []

    def submit_then_closed(self, session_id, key, *made):
        honest_submit(self, session_id, key, *made)
        if tuple(key) == (0, 0):
            stub = passive_pb2_grpc.PassiveStub(fed.channel("active", "passive-1"))
            stub.CloseSession(common_pb2.SessionRef(session_id=session_id))
            closed.append(sorted(p.name for p in state.glob(f"{session_id}*")))

    monkeypatch.setattr(tree_links.TreeCoordinatorClient, "submit_counts", submit_then_closed)
    sid = fed.operator.create_session("plain", family="tree", settings={"max_depth": 3}, seed=0).session_id
    with pytest.raises(grpc.RpcError) as refused:
        list(fed.operator.train(sid, sorted(fed.operator.align(sid))[:120], 1))
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert closed == [[]]  # closed, its files removed, while the products were in flight
    assert sid not in fed.parties["passive-1"].engine.sessions
    assert not list(state.glob(f"{sid}*"))  # and nothing wrote them back
    assert sid not in checkpoint.StateDir(state).load_all(skip_unreadable=True)
