"""The tree family's links (proto/vflsec/v1/tree.proto): protobuf in and out here, plain values to the family.

A node travels as the dict of ``services/models/tree/steps.py`` ``Task.to_json`` (transport never imports a family).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grpc
import numpy as np

from vflsec.services.crypto import he
from vflsec.services.errors import InvalidArgument
from vflsec.services.transport import wire
from vflsec.services.transport.server import DEFAULT_CALL_POLICY, CallPolicy, call
from vflsec.services.transport.tensors import from_tensor, to_tensor
from vflsec.v1 import common_pb2, tree_pb2, tree_pb2_grpc

Node = dict[str, Any]  # a Task's JSON form: tree, node_id, depth, rows, weights, features {party: [features]}


PART_BYTES = 64 * 1024 * 1024  # products per SubmitCounts message: well inside the 256 MB gRPC message default


def product_parts(products: list[bytes], limit: int = PART_BYTES) -> list[list[bytes]]:
    """Consecutive groups of ciphertexts of at most ``limit`` bytes each (one ciphertext at least)."""
    groups: list[list[bytes]] = [[]]
    size = 0
    for ct in products:
        if groups[-1] and size + len(ct) > limit:
            groups.append([])
            size = 0
        groups[-1].append(ct)
        size += len(ct)
    return groups


def task_message(node: Mapping[str, Any]) -> tree_pb2.NodeTask:
    return tree_pb2.NodeTask(
        tree=node["tree"],
        node_id=node["node_id"],
        depth=node["depth"],
        rows=list(node["rows"]),
        weights=list(node["weights"]),
        features=[tree_pb2.PartyFeatures(party=int(p), features=list(f)) for p, f in node["features"].items()],
    )


def task_of(message: tree_pb2.NodeTask) -> Node:
    if len({f.party for f in message.features}) != len(message.features) or len(message.rows) != len(message.weights):
        raise InvalidArgument("a node task names a party twice or has as many weights as rows")
    return {
        "tree": message.tree,
        "node_id": message.node_id,
        "depth": message.depth,
        "rows": list(message.rows),
        "weights": list(message.weights),
        "features": {str(f.party): list(f.features) for f in message.features},
    }


def key_message(key: Sequence[int]) -> tree_pb2.NodeKey:
    return tree_pb2.NodeKey(tree=key[0], node_id=key[1])


def key_of(message: tree_pb2.NodeKey) -> tuple[int, int]:
    return (message.tree, message.node_id)


class TreeCoordinatorClient:
    """The active party's and the passive parties' calls to the coordinator's TreeCoordinator service."""

    peer = "coordinator"

    def __init__(self, channel: grpc.Channel, policy: CallPolicy = DEFAULT_CALL_POLICY) -> None:
        self.stub = tree_pb2_grpc.TreeCoordinatorStub(channel)
        self.policy = policy

    def begin(self, session_id: str, sample_index: np.ndarray, sizes: Sequence[Sequence[int]]) -> None:
        request = tree_pb2.TreeBegin(
            session_id=session_id,
            sample_index=np.asarray(sample_index).tolist(),
            bins=[tree_pb2.BinSizes(sizes=list(s)) for s in sizes],
        )
        call(self.peer, self.stub.Begin, request, self.policy)

    def next_node(self, session_id: str) -> Node | None:
        reply = call(self.peer, self.stub.NextNode, common_pb2.SessionRef(session_id=session_id), self.policy)
        return None if reply.done else task_of(reply)

    def open_node(self, session_id: str, key: Sequence[int], totals: np.ndarray) -> tuple[bool, int, list[int]]:
        request = tree_pb2.NodeTotals(session_id=session_id, node=key_message(key), totals=to_tensor(totals))
        reply = call(self.peer, self.stub.OpenNode, request, self.policy)
        return reply.search, reply.key_epoch, list(reply.derived)

    def node_keys(self, session_id: str, key_epoch: int) -> bytes:
        request = tree_pb2.NodeKeysRequest(session_id=session_id, key_epoch=key_epoch)
        return call(self.peer, self.stub.NodeKeys, request, self.policy).public_context

    def submit_counts(
        self,
        session_id: str,
        key: Sequence[int],
        products: list[bytes],
        mask_sums: np.ndarray,
        bin_weights: np.ndarray,
        task_digest: bytes,
    ) -> None:
        groups = product_parts(products, PART_BYTES)
        for part, group in enumerate(groups):
            last = part == len(groups) - 1
            request = tree_pb2.NodeCounts(
                session_id=session_id,
                node=key_message(key),
                products=group,
                mask_sums=to_tensor(mask_sums) if last else None,
                bin_weights=to_tensor(bin_weights) if last else None,
                task_digest=task_digest,
                part=part,
                parts=len(groups),
            )
            call(self.peer, self.stub.SubmitCounts, request, self.policy)

    def decide(
        self, session_id: str, key: Sequence[int], counts: np.ndarray | None
    ) -> tuple[bool, tuple[int, int] | None]:
        """Whether the node is split, and the active party's own split (feature, bin) if it won."""
        request = tree_pb2.NodeDecide(
            session_id=session_id, node=key_message(key), counts=None if counts is None else to_tensor(counts)
        )
        reply = call(self.peer, self.stub.Decide, request, self.policy)
        return reply.split, (reply.feature, reply.bin) if reply.split and reply.own else None

    def partition(self, session_id: str, key: Sequence[int], goes_left: np.ndarray) -> None:
        request = tree_pb2.NodePartition(
            session_id=session_id, node=key_message(key), goes_left=to_tensor(np.asarray(goes_left, np.int64))
        )
        call(self.peer, self.stub.Partition, request, self.policy)


class TreePassiveClient:
    """Calls to a passive party's TreePassive service: the active party's (Begin, NodeCounts) and the
    coordinator's (ApplySplit, DiscloseThresholds)."""

    def __init__(self, party_id: str, channel: grpc.Channel, policy: CallPolicy = DEFAULT_CALL_POLICY) -> None:
        self.peer = party_id
        self.stub = tree_pb2_grpc.TreePassiveStub(channel)
        self.policy = policy

    def begin(self, session_id: str, sample_index: np.ndarray) -> list[int]:
        request = tree_pb2.TreeRows(session_id=session_id, sample_index=np.asarray(sample_index).tolist())
        return list(call(self.peer, self.stub.Begin, request, self.policy).sizes)

    def shard(self, session_id: str) -> tuple[list[int], int, int]:
        """The party's own bins per feature, aligned rows and training rows."""
        reply = call(self.peer, self.stub.Shard, common_pb2.SessionRef(session_id=session_id), self.policy)
        return list(reply.bins.sizes), reply.aligned_rows, reply.training_rows

    def node_counts(self, session_id: str, node: Mapping[str, Any], indicators: he.WireMatrix, key_epoch: int) -> None:
        request = tree_pb2.NodeIndicators(
            session_id=session_id, task=task_message(node), indicators=wire.message_of(indicators), key_epoch=key_epoch
        )
        call(self.peer, self.stub.NodeCounts, request, self.policy)

    def apply_split(self, session_id: str, node: Mapping[str, Any], feature: int, bin_index: int) -> np.ndarray:
        request = tree_pb2.SplitChoice(session_id=session_id, task=task_message(node), feature=feature, bin=bin_index)
        reply = call(self.peer, self.stub.ApplySplit, request, self.policy)
        left = from_tensor(reply, f"partition from {self.peer}", shape=(len(node["rows"]),))
        if not np.isin(left, (0, 1)).all():
            raise InvalidArgument(f"{self.peer}'s partition must be 0/1 per row")
        return left.astype(bool)

    def thresholds(self, session_id: str, specs: Sequence[str]) -> dict[tuple[int, int], float] | None:
        """The party's thresholds per split node it owns, None if it withheld them."""
        request = tree_pb2.ThresholdRequest(session_id=session_id, steps=list(specs))
        reply = call(self.peer, self.stub.DiscloseThresholds, request, self.policy)
        if reply.withheld:
            return None
        if len(reply.nodes) != len(reply.thresholds) or not np.isfinite(list(reply.thresholds)).all():
            raise InvalidArgument(f"{self.peer} sent {len(reply.nodes)} nodes, {len(reply.thresholds)} thresholds")
        return {key_of(k): t for k, t in zip(reply.nodes, reply.thresholds, strict=True)}
