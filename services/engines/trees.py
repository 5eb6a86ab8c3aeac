"""Thin servicers of the tree family's own services (proto/vflsec/v1/tree.proto): each RPC runs in an engine's
family turn (caller check, session lock, checkpoint) and hands plain values to the session's trainer
(services/models/tree/trainers.py), reached through the family registry, never by import."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc
import numpy as np

from vflsec.services.engines.coordinator import Coordinator, CoordinatorSession
from vflsec.services.errors import FailedPrecondition, InvalidArgument, PermissionDenied
from vflsec.services.registry import parse_spec
from vflsec.services.transport import wire
from vflsec.services.transport.server import rpc
from vflsec.services.transport.tensors import from_tensor, to_tensor
from vflsec.services.transport.tls import current_caller
from vflsec.services.transport.tree_links import key_message, key_of, task_message, task_of
from vflsec.v1 import common_pb2, tree_pb2, tree_pb2_grpc

if TYPE_CHECKING:  # a coordinator process never imports the passive engine (nor torch through its defenses)
    from vflsec.services.engines.passive import PassiveParty, PassiveSession

ACTIVE = 0  # the active party's position in a tree session (passive parties are 1..P, in session order)


def _trainer(s: CoordinatorSession | PassiveSession) -> Any:
    if s.family not in wire.TREE_FAMILIES:
        raise FailedPrecondition(f"the session trains {s.family}: the tree services serve tree and forest sessions")
    return s.trainer


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

    def _turn(self, session_id: str, *, owner: bool = True) -> Any:
        return self.coordinator.family_turn(session_id, current_caller().party_id, owner=owner)

    @rpc
    def Begin(self, request: tree_pb2.TreeBegin, context: grpc.ServicerContext):
        index = _index(request.sample_index)
        with self._turn(request.session_id) as s:
            _trainer(s).begin(len(index), [list(b.sizes) for b in request.bins])
            s.trained_index.update(index.tolist())
        return common_pb2.Empty()

    @rpc
    def NextNode(self, request: common_pb2.SessionRef, context: grpc.ServicerContext):
        with self._turn(request.session_id) as s:
            node = _trainer(s).next_node()
        return tree_pb2.NodeTask(done=True) if node is None else task_message(node)

    @rpc
    def OpenNode(self, request: tree_pb2.NodeTotals, context: grpc.ServicerContext):
        totals = from_tensor(request.totals, "class totals", ndim=1)
        with self._turn(request.session_id) as s:
            return tree_pb2.NodeOpened(search=_trainer(s).open_node(key_of(request.node), totals))

    @rpc
    def SubmitCounts(self, request: tree_pb2.NodeCounts, context: grpc.ServicerContext):
        caller = current_caller().party_id
        with self._turn(request.session_id, owner=False) as s:
            if caller not in s.passive_parties:
                raise PermissionDenied(f"{caller} is not a passive party of session {request.session_id!r}")
            keys = s.epochs.get(0)  # the indicators are encrypted under the session's first keys
            if keys is None:
                raise FailedPrecondition("the session's first training keys are gone: it is not a tree session")
            party = s.passive_parties.index(caller) + 1
            products = _trainer(s).receive_part(keys, party, key_of(request.node), list(request.products),
                                                request.part, max(request.parts, 1))
            if products is not None:  # the last part: it carries the mask sums
                mask_sums = from_tensor(request.mask_sums, "mask sums", ndim=2)
                _trainer(s).submit_counts(keys, party, key_of(request.node), products, mask_sums)
        return common_pb2.Empty()

    @rpc
    def Decide(self, request: tree_pb2.NodeDecide, context: grpc.ServicerContext):
        own = from_tensor(request.counts, "per-bin counts", ndim=2) if request.HasField("counts") else None
        with self._turn(request.session_id) as s:
            trainer, key = _trainer(s), key_of(request.node)
            split = trainer.decide(key, own)
            if split is None:
                return tree_pb2.Decision(split=False)
            if split.owner == ACTIVE:
                return tree_pb2.Decision(split=True, own=True, feature=split.feature, bin=split.bin)
            # The split's owner keeps its threshold; the coordinator hands it its own copy of the node.
            peer = self.coordinator._peer(s.passive_parties[split.owner - 1]).tree
            left = peer.apply_split(request.session_id, trainer.current(key), split.feature, split.bin)
            trainer.apply(key, left, split.owner)
        return tree_pb2.Decision(split=True)

    @rpc
    def Partition(self, request: tree_pb2.NodePartition, context: grpc.ServicerContext):
        left = _bits(request.goes_left, "partition")
        with self._turn(request.session_id) as s:
            _trainer(s).apply(key_of(request.node), left, ACTIVE)
        return common_pb2.Empty()


class TreePassiveServicer(tree_pb2_grpc.TreePassiveServicer):
    def __init__(self, party: PassiveParty) -> None:
        self.party = party

    def _turn(self, session_id: str, *, coordinator: bool = False) -> Any:
        return self.party.family_turn(session_id, current_caller().party_id, coordinator=coordinator)

    @rpc
    def Begin(self, request: tree_pb2.TreeRows, context: grpc.ServicerContext):
        index = _index(request.sample_index)
        with self._turn(request.session_id) as (s, ctx):
            sizes = _trainer(s).begin(ctx.features(index))
            s.trained_rows.update(index.tolist())
            s.completed_step = 1  # the trees grow in the session's one training step (inference shares name it)
        return tree_pb2.BinSizes(sizes=sizes)

    @rpc
    def NodeCounts(self, request: tree_pb2.NodeIndicators, context: grpc.ServicerContext):
        node = task_of(request.task)
        with self._turn(request.session_id) as (s, ctx):
            indicators = wire.from_message(s.backend, request.indicators, "indicators", rows=len(node["rows"]))
            products, mask_sums = _trainer(s).node_products(ctx, node, indicators)
        # Outside the session lock: the coordinator may be waiting on this party (ApplySplit) meanwhile.
        key = (node["tree"], node["node_id"])
        self.party.coordinator.tree.submit_counts(request.session_id, key, products, mask_sums)
        return common_pb2.Empty()

    @rpc
    def ApplySplit(self, request: tree_pb2.SplitChoice, context: grpc.ServicerContext):
        node = task_of(request.task)
        with self._turn(request.session_id, coordinator=True) as (s, _):
            left = _trainer(s).apply_split(node, request.feature, request.bin)
        return to_tensor(np.asarray(left, dtype=np.int64))

    @rpc
    def DiscloseThresholds(self, request: tree_pb2.ThresholdRequest, context: grpc.ServicerContext):
        try:
            names = [parse_spec(spec)[0] for spec in request.steps]
        except ValueError as exc:
            raise InvalidArgument(f"parameter-release steps: {exc}") from exc
        unknown = sorted(set(names) - {"withhold"})
        if unknown:
            raise InvalidArgument(f"a tree's thresholds are released whole or withheld; no step {unknown[0]!r}")
        with self._turn(request.session_id, coordinator=True) as (s, _):
            if names:  # withhold: the thresholds stay here
                return tree_pb2.Thresholds(withheld=True)
            thresholds = _trainer(s).thresholds()
        return tree_pb2.Thresholds(nodes=[key_message(k) for k in thresholds], thresholds=list(thresholds.values()))


COORDINATOR_POLICY: dict[str, frozenset[str]] = {
    **{method: frozenset({"active"}) for method in ("Begin", "NextNode", "OpenNode", "Decide", "Partition")},
    "SubmitCounts": frozenset({"passive"}),
}
PASSIVE_POLICY: dict[str, frozenset[str]] = {
    "Begin": frozenset({"active"}),
    "NodeCounts": frozenset({"active"}),
    "ApplySplit": frozenset({"coordinator"}),
    "DiscloseThresholds": frozenset({"coordinator"}),
}
