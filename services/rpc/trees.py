"""Thin servicers of the tree family's own services (proto/vflsec/v1/tree.proto): request -> the engine's
``family_call`` of the family step the RPC names (the engine checks the caller against the family's declaration,
takes the session lock, runs the step and checkpoints) -> reply. The same convention as split-NN's servicers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc
import numpy as np

from vflsec.services.common import ACTIVE, COORDINATOR, PASSIVE
from vflsec.services.engines.coordinator import Coordinator
from vflsec.services.errors import InvalidArgument
from vflsec.services.transport import wire
from vflsec.services.transport.server import rpc
from vflsec.services.transport.tensors import from_tensor, to_tensor
from vflsec.services.transport.tls import current_caller
from vflsec.services.transport.tree_links import key_message, key_of, task_message, task_of
from vflsec.v1 import common_pb2, tree_pb2, tree_pb2_grpc

if TYPE_CHECKING:  # a coordinator process never imports the passive engine (nor torch through its defenses)
    from vflsec.services.engines.passive import PassiveParty

OWN = 0  # the active party's position in a tree session (passive parties are 1..P, in session order)


def _index(values: Any) -> np.ndarray:
    index = np.asarray(values, dtype=np.int64)
    if index.size == 0:
        raise InvalidArgument("sample_index is empty")
    wire.require_distinct_rows(index)
    return index


def _bits(tensor: common_pb2.Tensor, name: str) -> np.ndarray:
    bits = from_tensor(tensor, name, ndim=1)
    if not np.isin(bits, (0, 1)).all():
        raise InvalidArgument(f"{name} must be 0/1 per row")
    return bits.astype(bool)


class TreeCoordinatorServicer(tree_pb2_grpc.TreeCoordinatorServicer):
    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator

    def _call(self, session_id: str, step: str, **payload: Any) -> Any:
        return self.coordinator.family_call(session_id, current_caller().party_id, step, **payload)

    @rpc
    def Begin(self, request: tree_pb2.TreeBegin, context: grpc.ServicerContext):
        index, bins = _index(request.sample_index), [list(b.sizes) for b in request.bins]
        self._call(request.session_id, "begin", sample_index=index, bins=bins)
        return common_pb2.Empty()

    @rpc
    def NextNode(self, request: common_pb2.SessionRef, context: grpc.ServicerContext):
        node = self._call(request.session_id, "next_node")
        return tree_pb2.NodeTask(done=True) if node is None else task_message(node)

    @rpc
    def OpenNode(self, request: tree_pb2.NodeTotals, context: grpc.ServicerContext):
        totals = from_tensor(request.totals, "class totals", ndim=1)
        search, key_epoch, derived = self._call(
            request.session_id, "open_node", key=key_of(request.node), totals=totals
        )
        return tree_pb2.NodeOpened(search=search, key_epoch=key_epoch, derived=derived)

    @rpc
    def NodeKeys(self, request: tree_pb2.NodeKeysRequest, context: grpc.ServicerContext):
        data = self._call(request.session_id, "node_keys", key_epoch=request.key_epoch)
        return tree_pb2.NodeKeysReply(public_context=data)

    @rpc
    def SubmitCounts(self, request: tree_pb2.NodeCounts, context: grpc.ServicerContext):
        mask_sums = from_tensor(request.mask_sums, "mask sums", ndim=2) if request.HasField("mask_sums") else None
        weights = from_tensor(request.bin_weights, "bin weights", ndim=1) if request.HasField("bin_weights") else None
        self._call(
            request.session_id,
            "submit_counts",
            key=key_of(request.node),
            products=list(request.products),
            part=request.part,
            parts=request.parts,
            mask_sums=mask_sums,
            bin_weights=weights,
            task_digest=request.task_digest,
        )
        return common_pb2.Empty()

    @rpc
    def Decide(self, request: tree_pb2.NodeDecide, context: grpc.ServicerContext):
        own = from_tensor(request.counts, "per-bin counts", ndim=2) if request.HasField("counts") else None
        split = self._call(request.session_id, "decide", key=key_of(request.node), own=own)
        if split is None:
            return tree_pb2.Decision(split=False)
        if split.owner == OWN:
            return tree_pb2.Decision(split=True, own=True, feature=split.feature, bin=split.bin)
        return tree_pb2.Decision(split=True)  # the split's owner keeps its threshold

    @rpc
    def Partition(self, request: tree_pb2.NodePartition, context: grpc.ServicerContext):
        left = _bits(request.goes_left, "partition")
        self._call(request.session_id, "partition", key=key_of(request.node), goes_left=left)
        return common_pb2.Empty()


class TreePassiveServicer(tree_pb2_grpc.TreePassiveServicer):
    def __init__(self, party: PassiveParty) -> None:
        self.party = party

    def _call(self, session_id: str, step: str, **payload: Any) -> Any:
        return self.party.family_call(session_id, current_caller().party_id, step, **payload)

    @rpc
    def Begin(self, request: tree_pb2.TreeRows, context: grpc.ServicerContext):
        sizes = self._call(request.session_id, "begin", sample_index=_index(request.sample_index))
        return tree_pb2.BinSizes(sizes=sizes)

    @rpc
    def Shard(self, request: common_pb2.SessionRef, context: grpc.ServicerContext):
        sizes, aligned, training = self._call(request.session_id, "shard")
        return tree_pb2.ShardInfo(bins=tree_pb2.BinSizes(sizes=sizes), aligned_rows=aligned, training_rows=training)

    @rpc
    def NodeCounts(self, request: tree_pb2.NodeIndicators, context: grpc.ServicerContext):
        self._call(  # parsed by the family under the node's keys, which this party fetches itself
            request.session_id,
            "node_counts",
            node=task_of(request.task),
            indicators=wire.unparsed(request.indicators),
            key_epoch=request.key_epoch,
        )
        return common_pb2.Empty()

    @rpc
    def ApplySplit(self, request: tree_pb2.SplitChoice, context: grpc.ServicerContext):
        node = task_of(request.task)
        left = self._call(request.session_id, "apply_split", node=node, feature=request.feature, bin_index=request.bin)
        return to_tensor(left)

    @rpc
    def DiscloseThresholds(self, request: tree_pb2.ThresholdRequest, context: grpc.ServicerContext):
        thresholds = self._call(request.session_id, "thresholds", specs=list(request.steps))
        if thresholds is None:  # withheld: the thresholds stay at the party
            return tree_pb2.Thresholds(withheld=True)
        return tree_pb2.Thresholds(nodes=[key_message(k) for k in thresholds], thresholds=list(thresholds.values()))


# RPC -> the family step it runs. The policies are the family's declaration of its callers (ModelFamily.steps),
# written out so that a party starts without loading the family; tests/unit/test_authz.py keeps them equal.
COORDINATOR_STEPS = {
    "Begin": "begin",
    "NextNode": "next_node",
    "OpenNode": "open_node",
    "NodeKeys": "node_keys",
    "SubmitCounts": "submit_counts",
    "Decide": "decide",
    "Partition": "partition",
}
PASSIVE_STEPS = {
    "Begin": "begin",
    "Shard": "shard",
    "NodeCounts": "node_counts",
    "ApplySplit": "apply_split",
    "DiscloseThresholds": "thresholds",
}
COORDINATOR_POLICY: dict[str, frozenset[str]] = {
    **{method: frozenset({ACTIVE}) for method in ("Begin", "NextNode", "OpenNode", "Decide", "Partition")},
    "NodeKeys": frozenset({ACTIVE, PASSIVE}),
    "SubmitCounts": frozenset({PASSIVE}),
}
PASSIVE_POLICY: dict[str, frozenset[str]] = {
    "Begin": frozenset({ACTIVE}),
    "Shard": frozenset({COORDINATOR}),
    "NodeCounts": frozenset({ACTIVE}),
    "ApplySplit": frozenset({COORDINATOR}),
    "DiscloseThresholds": frozenset({COORDINATOR}),
}
