"""What an attack reads of a released model, below every attack (base.py's :class:`Observations` holds it, the
attacks in trees.py walk it): the released tree view and the error an attack raises when what it needs was not
released.

A released tree is the minimal view the tree attacks need: per node its owner, the feature (a column of the owner's
own block), the threshold (None when the parameter-release chain withheld it) and the children; per leaf its class
distribution (the leaf's class is its argmax). A sample goes left at a node when its value is <= the threshold.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import numpy as np

from vflsec.services.models.tree.structure import ACTIVE, Forest, Node, Tree
from vflsec.services.models.tree.trainers import from_tensors

__all__ = ["NotApplicable", "Owner", "ReleasedTree", "TreeNode", "from_family", "from_sklearn", "released_trees_of"]


class NotApplicable(Exception):
    """The attack cannot run on these observations (e.g. the passive weights were withheld)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


Owner = Literal["active", "passive"]


@dataclass(frozen=True)
class TreeNode:
    """An internal node (``owner`` set) or a leaf (``owner`` None, ``value`` its class distribution)."""

    owner: Owner | None = None
    feature: int = -1  # column within the owner's own feature block
    threshold: float | None = None  # None when withheld from the active party (or a leaf)
    left: int = -1  # child for value <= threshold
    right: int = -1
    value: tuple[float, ...] = ()  # leaf: class fractions (or counts) of its training rows


@dataclass(frozen=True)
class ReleasedTree:
    """One released tree; ``nodes[0]`` is the root, and every child index points at a later node."""

    nodes: tuple[TreeNode, ...]

    def __post_init__(self) -> None:
        for i, node in enumerate(self.nodes):
            if node.owner is None:
                if not node.value:
                    raise ValueError(f"leaf {i} has no class distribution")
            elif node.owner not in ("active", "passive") or not (i < node.left < len(self.nodes)) or not (
                i < node.right < len(self.nodes)
            ):
                raise ValueError(f"node {i}: owner must be active/passive with later children, got {node}")

    @property
    def withholds_passive(self) -> bool:
        return any(n.owner == "passive" and n.threshold is None for n in self.nodes)

    def withheld(self) -> ReleasedTree:
        """The tree as the active party sees it under ``withhold``: passive thresholds stay with their owner."""
        return ReleasedTree(
            tuple(dataclasses.replace(n, threshold=None) if n.owner == "passive" else n for n in self.nodes)
        )

    @cached_property
    def leaves(self) -> np.ndarray:
        return np.array([i for i, n in enumerate(self.nodes) if n.owner is None])

    @cached_property
    def leaf_class(self) -> dict[int, int]:
        return {int(i): int(np.argmax(self.nodes[i].value)) for i in self.leaves}

    @cached_property
    def paths(self) -> dict[int, tuple[tuple[int, bool], ...]]:
        """Per leaf, the (node, went left) branchings from the root."""
        found: dict[int, tuple[tuple[int, bool], ...]] = {}
        stack: list[tuple[int, tuple[tuple[int, bool], ...]]] = [(0, ())]
        while stack:
            i, path = stack.pop()
            node = self.nodes[i]
            if node.owner is None:
                found[i] = path
            else:
                stack += [(node.left, (*path, (i, True))), (node.right, (*path, (i, False)))]
        return found

    def route(self, x_active: np.ndarray, x_passive: np.ndarray) -> np.ndarray:
        """The leaf each row reaches (needs every threshold on its way)."""
        at = np.zeros(len(x_active), dtype=int)
        for i, node in enumerate(self.nodes):  # parents precede children, so one pass routes every row
            if node.owner is None:
                continue
            here = at == i
            if not here.any():
                continue
            if node.threshold is None:
                raise NotApplicable(f"the threshold of {node.owner} node {i} was withheld")
            column = (x_active if node.owner == "active" else x_passive)[here, node.feature]
            at[here] = np.where(column <= node.threshold, node.left, node.right)
        return at


def from_sklearn(model: Any, d_active: int) -> tuple[ReleasedTree, ...]:
    """A scikit-learn DecisionTreeClassifier or RandomForestClassifier trained on [x_active, x_passive]
    (classes 0..C−1) as released trees; columns ≥ ``d_active`` belong to the passive party."""
    estimators = getattr(model, "estimators_", [model])
    trees = []
    for estimator in estimators:
        t = estimator.tree_
        nodes = []
        for i in range(t.node_count):
            if t.children_left[i] < 0:
                nodes.append(TreeNode(value=tuple(float(v) for v in t.value[i][0])))
                continue
            f = int(t.feature[i])
            owner: Owner = "active" if f < d_active else "passive"
            column = f if owner == "active" else f - d_active
            left, right = int(t.children_left[i]), int(t.children_right[i])
            nodes.append(TreeNode(owner, column, float(t.threshold[i]), left, right))
        trees.append(ReleasedTree(tuple(nodes)))
    return tuple(trees)


def from_family(forest: Forest, passive_widths: Sequence[int]) -> tuple[ReleasedTree, ...]:
    """The tree family's released view (services/models/tree/structure.py) as the attacks read it: passive parties'
    columns concatenated in party order (party p's column j is ``sum(passive_widths[:p-1]) + j``)."""
    offsets = np.concatenate([[0], np.cumsum(passive_widths)]).astype(int)

    def flatten(tree: Tree) -> ReleasedTree:
        nodes: list[TreeNode] = []

        def walk(node: Node) -> int:  # pre-order: a parent's index precedes its children's
            index = len(nodes)
            nodes.append(TreeNode())
            if node.is_leaf:
                nodes[index] = TreeNode(value=tuple(float(c) for c in node.counts))
                return index
            left, right = walk(node.left), walk(node.right)  # type: ignore[arg-type]
            active = node.owner == ACTIVE
            column = node.feature if active else offsets[node.owner - 1] + node.feature  # type: ignore[operator]
            nodes[index] = TreeNode("active" if active else "passive", int(column), node.threshold, left, right)
            return index

        walk(tree.root)
        return ReleasedTree(tuple(nodes))

    return tuple(flatten(tree) for tree in forest.trees)


def released_trees_of(tensors: Mapping[str, np.ndarray], passive_widths: Sequence[int]) -> tuple[ReleasedTree, ...]:
    """A tree family's released model as the active party received it (the ``tree/nodes`` and ``tree/counts``
    tensors the curious plugin records: services/models/tree/trainers.py)."""
    forest = from_tensors(tensors, "tree" if len(tensors["tree/nodes"]) == 1 else "forest")
    return from_family(forest, passive_widths)
