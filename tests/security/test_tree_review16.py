"""Review 16 (folded products and histogram subtraction), its findings as live tests.

A real federation (in-process parties, gRPC over loopback, mTLS, PSI; the plain backend: the partitions and refusals
are the protocol's, the same under CKKS) on wine, passive-1 holding 10 of 13 columns (it wins splits) with the
curious store; a deviating coordinator is played by patching only its code (its Builder, TreeKeyHolder or STEPS
entry). min_samples_leaf is 6 and the trees depth 4, on 120 rows: the honest growth derives passive-1's counts at
the right child (0, 2) and leaves (0, 3), (0, 5) and (0, 6) leaves (/tmp/rev16/probe_small_split.out).
"""

from __future__ import annotations

import dataclasses

import grpc
import numpy as np
import pytest

from tests.integration.conftest import curious_wine
from vflsec.services import plugins
from vflsec.services.errors import PeerFailed
from vflsec.services.models.tree import steps, trainers
from vflsec.services.plugins.curious import ObservationStore
from vflsec.services.transport import tree_links
from vflsec.v1 import tree_pb2, tree_pb2_grpc

CODE = grpc.StatusCode
MSL = 6


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    with curious_wine(tmp_path_factory.mktemp("review16"), backend="plain") as (fed, store):
        yield fed, store


def _train(fed) -> str:
    sid = fed.operator.create_session(
        "plain", family="tree", settings={"max_depth": 4, "min_samples_leaf": MSL}, seed=0
    ).session_id
    list(fed.operator.train(sid, sorted(fed.operator.align(sid))[:120], 1))
    return sid


def _one_row_bin(self, task) -> steps.Split | None:
    """The coordinator's pick: a bin of passive-1 below which exactly one of the node's rows lies (it holds the
    party's bin weights)."""
    offset = 0
    for feature in task.features.get(1, ()):
        size = self.builder.bin_sizes[1][feature]
        below = np.cumsum(np.asarray(self.weights[1])[offset : offset + size])
        offset += size
        for b in range(size - 1):
            if below[b] == 1 and below[-1] > 1:
                return steps.Split(1, int(feature), b, 0.0)
    return None


def _refused(fed, monkeypatch, sid_box: list) -> grpc.RpcError:
    honest_create = fed.operator.create_session

    def create(*args, **kwargs):
        session = honest_create(*args, **kwargs)
        sid_box.append(session.session_id)
        return session

    monkeypatch.setattr(fed.operator, "create_session", create)
    with pytest.raises(grpc.RpcError) as refused:
        _train(fed)
    return refused.value


def _records(store, sid: str, kind: str) -> dict[tuple[int, int], list]:
    out: dict[tuple[int, int], list] = {}
    for r in ObservationStore(store).read(sid, kind):
        out.setdefault((r.meta["tree"], r.meta["node_id"]), []).append(r)
    return out


def test_a_passive_party_sends_no_partition_with_a_side_below_min_samples_leaf(fed, monkeypatch) -> None:
    """F1: the coordinator picks passive-1's one-row bin at the root; passive-1 refuses before anything is sent
    (FAILED_PRECONDITION naming the bound, which the coordinator knows: it holds the bin weights)."""
    fed, store = fed
    honest = trainers.TreeKeyHolder.decide

    def one_row(self, key, own):
        task = self._searched(key)
        if task.node_id == 0 and self.pending is None and (split := _one_row_bin(self, task)) is not None:
            self.pending = split
            return split
        return honest(self, key, own)

    monkeypatch.setattr(trainers.TreeKeyHolder, "decide", one_row)
    sid: list[str] = []
    refused = _refused(fed, monkeypatch, sid)
    assert refused.code() == CODE.FAILED_PRECONDITION, refused.details()
    assert f"below min_samples_leaf {MSL}" in refused.details()
    assert _records(store, sid[0], plugins.OWN_SPLIT) == {}  # no partition left passive-1


def test_the_active_party_opens_no_node_the_growth_leaves_a_leaf(fed, monkeypatch) -> None:
    """F2: a coordinator whose Builder ignores the purity and weight rules says (0, 3) (6 rows < 2 x 6) is searched;
    the active party refuses before any [[Y]] or word leaves: passive-1 is asked about no node the honest growth
    leaves a leaf."""
    fed, store = fed

    def open_all(self, task, totals):
        self._current(task)
        node = steps.Node(task.node_id, np.asarray(totals, dtype=np.float64))
        self._nodes[task.key] = node
        if task.node_id == 0:
            self.roots[task.tree] = node
        else:
            setattr(self._nodes[(task.tree, (task.node_id - 1) // 2)], "left" if task.node_id % 2 else "right", node)
        if task.depth >= self.config.max_depth:
            self._close()
            return False
        return True

    monkeypatch.setattr(steps.Builder, "open", open_all)
    sid: list[str] = []
    refused = _refused(fed, monkeypatch, sid)
    assert refused.code() == CODE.FAILED_PRECONDITION, refused.details()
    assert "node (0, 3)" in refused.details() and "the growth leaves it a leaf" in refused.details()
    assert set(_records(store, sid[0], plugins.NODE_ROWS)) <= {(0, 0), (0, 1), (0, 2)}


def test_a_derived_right_child_live(fed, monkeypatch) -> None:
    """F4: at (0, 2) the coordinator derives passive-1's counts: it opens no products of passive-1 there, passive-1
    gets no [[Y]] (its record of the node is the implied one: its parent's rows less its left sibling's), its
    SubmitCounts there gets the one "no products due" refusal, and an ApplySplit there before the active party's word
    is refused; after it, passive-1 splits the node."""
    fed, store = fed
    to_coordinator = tree_pb2_grpc.TreeCoordinatorStub(fed.channel("passive-1", "coordinator"))
    submitted: dict[tuple[int, int], str] = {}
    honest_word = tree_links.TreePassiveClient.node_counts

    def submit_first(self, session_id, node, indicators, key_epoch):  # the active party's link, just before the word
        if not indicators.ciphertexts:
            key = tree_pb2.NodeKey(tree=node["tree"], node_id=node["node_id"])
            try:
                to_coordinator.SubmitCounts(tree_pb2.NodeCounts(session_id=session_id, node=key, products=[b"x"]))
            except grpc.RpcError as exc:
                submitted[(node["tree"], node["node_id"])] = f"{exc.code().name}: {exc.details()}"
        return honest_word(self, session_id, node, indicators, key_epoch)

    monkeypatch.setattr(tree_links.TreePassiveClient, "node_counts", submit_first)
    opened: list[tuple[int, int, int]] = []
    honest_open = steps.KeyHolder.open_counts

    def recording(self, party, task, *args):
        opened.append((party, *task.key))
        return honest_open(self, party, task, *args)

    early: dict[tuple[int, int], str] = {}
    role = next(r for r in trainers.STEPS if "open_node" in trainers.STEPS[r])
    honest_step = trainers.STEPS[role]["open_node"]

    def apply_first(trainer, ctx, key, totals):
        out = honest_step.run(trainer, ctx, key, totals)
        if 1 in out[2]:
            task = trainer.current(key)
            try:
                trainers._tree_link(ctx.peer(1)).apply_split(ctx.session_id, task, task["features"]["1"][0], 0)
                early[tuple(key)] = "answered"
            except PeerFailed as exc:  # the link's error for a refusal by the peer
                early[tuple(key)] = str(exc)
        return out

    monkeypatch.setattr(steps.KeyHolder, "open_counts", recording)
    monkeypatch.setitem(trainers.STEPS[role], "open_node", dataclasses.replace(honest_step, run=apply_first))
    sid = _train(fed)
    assert (1, 0, 0) in opened and (1, 0, 1) in opened and (1, 0, 2) not in opened
    assert list(early) == [(0, 2)] and "FAILED_PRECONDITION" in early[(0, 2)]
    assert "a known complement, not opened (no word from the active party)" in early[(0, 2)]
    assert submitted == {(0, 2): "FAILED_PRECONDITION: party 1 has no products due at node (0, 2)"}
    rows = _records(store, sid, plugins.NODE_ROWS)
    (implied,) = rows[(0, 2)]
    assert implied.meta.get("implied") is True
    parent, left = (set(np.asarray(rows[k][0].arrays["rows"]).tolist()) for k in ((0, 0), (0, 1)))
    assert set(np.asarray(implied.arrays["rows"]).tolist()) == parent - left
    (split,) = _records(store, sid, plugins.OWN_SPLIT)[(0, 2)]
    assert min(split.arrays["goes_left"].sum(), (1 - split.arrays["goes_left"]).sum()) >= MSL
