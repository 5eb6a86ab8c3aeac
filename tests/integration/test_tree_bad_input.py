"""The tree services refuse bad and out-of-order messages with a precise status, and keep serving: a deviating active
party drives TreeCoordinator / TreePassive by hand over real mTLS (plain backend: the same validation path)."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from tests.integration.conftest import federation
from vflsec.services.crypto import he
from vflsec.services.models.tree import trainers
from vflsec.services.models.tree.steps import Task, product_count, product_parts
from vflsec.services.transport import wire
from vflsec.services.transport.tensors import to_tensor
from vflsec.services.transport.tree_links import task_of
from vflsec.v1 import common_pb2, tree_pb2, tree_pb2_grpc

CODE = grpc.StatusCode


def _code(call, request) -> grpc.StatusCode:
    try:
        call(request, timeout=30)
    except grpc.RpcError as exc:
        return exc.code()
    return CODE.OK


def _refusal(call, request) -> tuple[grpc.StatusCode, str]:
    """The status, and the phrase of its message this test looks for (else the whole message)."""
    try:
        call(request, timeout=30)
    except grpc.RpcError as exc:
        for phrase in ("bins are not fitted", "distinct training rows"):
            if phrase in exc.details():
                return exc.code(), phrase
        return exc.code(), exc.details()
    return CODE.OK, ""


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    with federation(tmp_path_factory.mktemp("tree-bad"), dataset="wine", n_passive=1, backend="plain") as fed:
        yield fed


def test_tree_rpcs_refuse_bad_input_and_keep_serving(fed) -> None:
    sid = fed.operator.create_session("plain", family="tree", settings={"max_depth": 2}).session_id
    lr = fed.operator.create_session("plain").session_id
    fed.operator.align(sid)
    coordinator = tree_pb2_grpc.TreeCoordinatorStub(fed.channel("active", "coordinator"))
    as_passive = tree_pb2_grpc.TreeCoordinatorStub(fed.channel("passive-1", "coordinator"))
    passive = tree_pb2_grpc.TreePassiveStub(fed.channel("active", "passive-1"))
    ref = common_pb2.SessionRef(session_id=sid)
    d_active = fed.parties["active"].engine.data.X.shape[1]
    d_passive = fed.parties["passive-1"].engine.data.X.shape[1]

    def begin(index, sizes, session=sid):
        bins = [tree_pb2.BinSizes(sizes=s) for s in sizes]
        return tree_pb2.TreeBegin(session_id=session, sample_index=index, bins=bins)

    public = he.open_public("plain", fed.parties["passive-1"].engine.session(sid).public_context)

    def indicators(task):
        matrix = wire.to_message(public, he.encrypt_matrix(public, np.ones((len(task.rows), 3))))
        return tree_pb2.NodeIndicators(session_id=sid, task=task, indicators=matrix)

    early = tree_pb2.NodeTask(rows=[0, 1], weights=[1, 1], features=[tree_pb2.PartyFeatures(party=1, features=[0])])
    assert _refusal(passive.NodeCounts, indicators(early)) == (CODE.FAILED_PRECONDITION, "bins are not fitted")

    rows = list(range(40))  # >= [policy] min_training_rows (32)
    sizes = [[2] * d_active]  # the active party's own; the passive party's come from itself
    assert _code(coordinator.NextNode, ref) == CODE.FAILED_PRECONDITION  # growing has not begun
    assert _code(coordinator.Begin, begin(rows, sizes)) == CODE.FAILED_PRECONDITION  # passive-1 has not begun
    assert _code(passive.Begin, tree_pb2.TreeRows(session_id=sid, sample_index=rows[:20])) == CODE.INVALID_ARGUMENT
    sizes_p = list(passive.Begin(tree_pb2.TreeRows(session_id=sid, sample_index=rows)).sizes)
    assert _code(coordinator.Begin, begin([], sizes)) == CODE.INVALID_ARGUMENT
    assert _code(coordinator.Begin, begin([1, 1, 2], sizes)) == CODE.INVALID_ARGUMENT
    assert _code(coordinator.Begin, begin(rows, [])) == CODE.INVALID_ARGUMENT
    assert _code(coordinator.Begin, begin(rows[:20], sizes)) == CODE.INVALID_ARGUMENT  # below min_training_rows
    assert _code(coordinator.Begin, begin(rows, sizes, session=lr)) == CODE.FAILED_PRECONDITION
    assert _code(coordinator.Begin, begin(rows, [*sizes, [2**31 - 1] * d_passive])) == CODE.FAILED_PRECONDITION
    assert _code(coordinator.Begin, begin(rows, [[65] * d_active])) == CODE.INVALID_ARGUMENT  # above n_bins
    assert _code(coordinator.Begin, begin(rows, [*sizes, sizes_p])) == CODE.OK
    assert _code(coordinator.Begin, begin(rows, sizes)) == CODE.FAILED_PRECONDITION  # once per session

    root = coordinator.NextNode(ref)
    key = tree_pb2.NodeKey(tree=root.tree, node_id=root.node_id)
    other = tree_pb2.NodeKey(tree=0, node_id=5)

    def totals(values, node=key):
        return tree_pb2.NodeTotals(session_id=sid, node=node, totals=to_tensor(np.asarray(values, float)))

    assert _code(coordinator.Decide, tree_pb2.NodeDecide(session_id=sid, node=key)) == CODE.FAILED_PRECONDITION
    assert _code(coordinator.OpenNode, totals([20, 20, 0], other)) == CODE.FAILED_PRECONDITION
    assert _code(coordinator.OpenNode, totals([20, 20])) == CODE.INVALID_ARGUMENT
    assert _code(coordinator.OpenNode, totals([20, 19, 0])) == CODE.INVALID_ARGUMENT  # 40 rows of weight 1
    assert _code(coordinator.OpenNode, totals([50, -10, 0])) == CODE.INVALID_ARGUMENT  # negative counts
    opened = coordinator.OpenNode(totals([20, 20, 0]))
    assert opened.search

    def submit(products, mask_rows):
        mask_sums = to_tensor(np.zeros((mask_rows, 2)))  # K − 1 = 2 of wine's 3 classes are encrypted
        digest = Task.from_json(task_of(root)).digest(sid, opened.key_epoch)  # the node as the coordinator holds it
        return _code(as_passive.SubmitCounts, tree_pb2.NodeCounts(session_id=sid, node=key, products=products,
                                                                   mask_sums=mask_sums, task_digest=digest,
                                                                   bin_weights=to_tensor(np.zeros(width))))  # fmt: skip

    # The coordinator's own layout of the node's indicators fixes how many products it takes.
    keys = fed.parties["coordinator"].engine.session(sid).epochs[0]
    width = sum(sizes_p)
    task, parts = Task.from_json(task_of(root)), product_parts(keys)
    layout = trainers.indicator_layout(task, 3, width, keys.slots, parts)
    blocks, count = -(-width // layout.replicas), product_count(task, width, layout, parts)

    def part(products, index, parts) -> tuple[grpc.StatusCode, str]:
        request = tree_pb2.NodeCounts(session_id=sid, node=key, products=products, part=index, parts=parts)
        try:
            as_passive.SubmitCounts(request, timeout=30)
        except grpc.RpcError as exc:
            return exc.code(), exc.details()
        return CODE.OK, ""

    # Products in parts: in order, never more than the node's ciphertexts; a part before the last spends nothing.
    for refused, phrase in ((part([b"garbage"], 1, 2), "part 0 is due"), (part([b"garbage"], 2, 2), "part 0 is due"),
                            (part([b"garbage"] * (count + 1), 0, 3), "more products than")):
        assert refused[0] == CODE.INVALID_ARGUMENT and phrase in refused[1], refused
    assert part([b"garbage"], 0, 3) == (CODE.OK, "")
    refused = part([b"garbage"], 2, 3)
    assert refused[0] == CODE.INVALID_ARGUMENT and "part 1 is due" in refused[1], refused
    assert submit([b"garbage"] * (count + 1), blocks * layout.replicas) == CODE.INVALID_ARGUMENT
    unweighted = tree_pb2.NodeCounts(session_id=sid, node=key, products=[b"garbage"] * count,
                                     mask_sums=to_tensor(np.zeros((blocks * layout.replicas, 2))))  # fmt: skip
    refused = _refusal(as_passive.SubmitCounts, unweighted)
    assert refused[0] == CODE.INVALID_ARGUMENT and "bin weights" in refused[1], refused  # before anything is spent
    assert submit([b"garbage"] * count, blocks * layout.replicas) == CODE.INVALID_ARGUMENT
    # That request was parsed, so the party's one answer for the node is spent: no second try.
    assert submit([b"garbage"] * count, blocks * layout.replicas) == CODE.FAILED_PRECONDITION
    no_counts = tree_pb2.NodeDecide(session_id=sid, node=key, counts=to_tensor(np.zeros((3, 2 * d_active))))
    assert _code(coordinator.Decide, no_counts) == CODE.FAILED_PRECONDITION
    bits = tree_pb2.NodePartition(session_id=sid, node=key, goes_left=to_tensor(np.ones(40, np.int64)))
    assert _code(coordinator.Partition, bits) == CODE.FAILED_PRECONDITION  # no split of the active party is due

    for rows in ([0, 45], [-1, 3], [2, 2]):
        bad = tree_pb2.NodeTask()
        bad.CopyFrom(root)
        del bad.rows[:], bad.weights[:]
        bad.rows.extend(rows), bad.weights.extend([1.0] * len(rows))
        assert _refusal(passive.NodeCounts, indicators(bad)) == (CODE.INVALID_ARGUMENT, "distinct training rows")
    choice = tree_pb2.SplitChoice(session_id=sid, task=root, feature=0, bin=0)
    assert _code(passive.ApplySplit, choice) == CODE.PERMISSION_DENIED  # the coordinator's to call

    # Still serving, and the node in flight is as it was.
    again = coordinator.NextNode(ref)
    assert (again.tree, again.node_id, list(again.rows)) == (root.tree, root.node_id, list(root.rows))
