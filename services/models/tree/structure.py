"""Plain dataclass trees: the coordinator's skeleton and the active party's released view.

Nodes carry luo's heap index (root 0, children 2i+1 and 2i+2, as in luo Algorithm 1), the owning party (0 is the
active party) and the owner-local feature index; ``bin`` and ``threshold`` say "x <= threshold (bin <= bin) goes
left" and are None where the viewer does not know them. Every node carries its (weighted) training class counts;
a leaf predicts their argmax (lowest class on ties, as scikit-learn).

Example (a depth-1 tree whose root splits passive party 1's feature 2 at 0.5, viewed under ``withhold``)::

    >>> import numpy as np
    >>> root = Node(0, np.array([6.0, 4.0]), owner=1, feature=2, bin=3, threshold=0.5,
    ...             left=Node(1, np.array([5.0, 1.0])), right=Node(2, np.array([1.0, 3.0])))
    >>> tree = Tree(root, n_classes=2)
    >>> [(n.node_id, n.owner, n.is_leaf) for n in tree.nodes()]
    [(0, 1, False), (1, None, True), (2, None, True)]
    >>> tree.leaf(0, lambda node: True).label   # route one sample: the callback says "goes left"
    0
    >>> view = release(tree, "withhold")
    >>> view.root.threshold is None and view.root.bin is None and view.root.owner == 1
    True
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Literal, get_args

import numpy as np

ReleaseSetting = Literal["full", "withhold"]
RELEASE_SETTINGS: tuple[str, ...] = get_args(ReleaseSetting)
ACTIVE = 0  # the active party's index; passive parties are 1..P


@dataclass
class Node:
    node_id: int
    counts: np.ndarray  # (n_classes,) weighted training class counts reaching this node
    owner: int | None = None  # None for a leaf
    feature: int | None = None  # owner-local feature index
    bin: int | None = None  # bin <= bin goes left; None for a leaf or where withheld
    threshold: float | None = None  # raw value <= threshold goes left; None for a leaf or where unknown
    left: Node | None = None
    right: Node | None = None

    @property
    def is_leaf(self) -> bool:
        return self.left is None

    @property
    def label(self) -> int:
        return int(np.argmax(self.counts))

    def children(self) -> tuple[Node, Node]:
        if self.left is None or self.right is None:
            raise ValueError(f"node {self.node_id} is a leaf")
        return self.left, self.right


@dataclass
class Tree:
    root: Node
    n_classes: int

    def nodes(self) -> Iterator[Node]:
        """Breadth-first, i.e. in heap-index order."""
        queue = [self.root]
        while queue:
            node = queue.pop(0)
            yield node
            if not node.is_leaf:
                queue.extend(node.children())

    def splits(self) -> list[Node]:
        return [n for n in self.nodes() if not n.is_leaf]

    def leaves(self) -> list[Node]:
        return [n for n in self.nodes() if n.is_leaf]

    @property
    def depth(self) -> int:
        return max(int(np.floor(np.log2(n.node_id + 1))) for n in self.leaves())

    def leaf(self, row: int, goes_left: Callable[[Node], bool]) -> Node:
        """The leaf one sample reaches; ``goes_left(node)`` answers each split on its path."""
        node = self.root
        while not node.is_leaf:
            node = node.children()[0 if goes_left(node) else 1]
        return node


@dataclass
class Forest:
    """One tree (``kind="tree"``) or a forest; both predict by (hard) votes of their trees' leaf labels."""

    trees: list[Tree]
    n_classes: int
    kind: str = "tree"
    setting: ReleaseSetting | None = None  # None: the coordinator's skeleton; else the release it was made for

    def votes(self, labels: np.ndarray) -> np.ndarray:
        """(n, T) leaf labels -> (n, K) fractions of trees voting for each class (luo §II: RF output)."""
        labels = np.asarray(labels, dtype=np.int64)
        out = np.zeros((labels.shape[0], self.n_classes))
        for column in labels.T:
            out[np.arange(labels.shape[0]), column] += 1.0
        return out / labels.shape[1]

    def predict_values(self, X_parties: list[np.ndarray]) -> np.ndarray:
        """Released-output view for anyone holding every threshold: (n, K) votes (one-hot for a tree)."""
        labels = np.stack([_route(tree, X_parties) for tree in self.trees], axis=1)
        return self.votes(labels)


def _route(tree: Tree, X_parties: list[np.ndarray]) -> np.ndarray:
    out = np.empty(X_parties[0].shape[0], dtype=np.int64)
    for row in range(out.size):

        def goes_left(node: Node, row: int = row) -> bool:
            if node.threshold is None:
                raise ValueError(f"node {node.node_id} has no threshold in this view")
            return bool(X_parties[node.owner][row, node.feature] <= node.threshold)  # type: ignore[index]

        out[row] = tree.leaf(row, goes_left).label
    return out


def copy_tree(tree: Tree, edit: Callable[[Node], Node] = lambda n: n) -> Tree:
    """A deep copy with ``edit`` applied to every node (children are re-linked afterwards)."""

    def walk(node: Node) -> Node:
        new = edit(replace(node, counts=node.counts.copy()))
        if node.is_leaf:
            return replace(new, left=None, right=None)
        left, right = node.children()
        return replace(new, left=walk(left), right=walk(right))

    return Tree(walk(tree.root), tree.n_classes)


def release(tree: Tree, setting: ReleaseSetting) -> Tree:
    """The active party's view of a fully known tree: ``full`` keeps every threshold (luo's PRA setting),
    ``withhold`` drops the passive parties' bins and thresholds (the active party's own stay)."""
    if setting not in RELEASE_SETTINGS:
        raise ValueError(f"release setting must be one of {', '.join(RELEASE_SETTINGS)}, got {setting!r}")
    if setting == "full":
        return copy_tree(tree)
    return copy_tree(tree, lambda n: n if n.owner in (None, ACTIVE) else replace(n, bin=None, threshold=None))


def release_forest(forest: Forest, setting: ReleaseSetting) -> Forest:
    return Forest([release(t, setting) for t in forest.trees], forest.n_classes, forest.kind, setting)


# --- the released model as named tensors (what ReleaseModel carries and the curious plugin records) ---
_KIND, _OWNER, _FEATURE, _BIN, _KNOWN, _THRESHOLD = range(6)


def to_tensors(forest: Forest, depth: int) -> dict[str, np.ndarray]:
    """``tree/nodes`` (T, 2^(depth+1) − 1, 6) per heap slot: kind (−1 absent, 0 leaf, 1 split), owner, feature,
    bin (−1 unknown), threshold known (0/1), threshold; ``tree/counts`` (T, slots, K) training class counts."""
    slots = 2 ** (depth + 1) - 1
    nodes = np.zeros((len(forest.trees), slots, 6))
    nodes[:, :, _KIND] = -1
    counts = np.zeros((len(forest.trees), slots, forest.n_classes))
    for t, tree in enumerate(forest.trees):
        for node in tree.nodes():
            row = nodes[t, node.node_id]
            counts[t, node.node_id] = node.counts
            row[_KIND] = 0 if node.is_leaf else 1
            if not node.is_leaf:
                row[_OWNER], row[_FEATURE] = node.owner, node.feature
                row[_BIN] = -1 if node.bin is None else node.bin
                row[_KNOWN], row[_THRESHOLD] = (0, 0.0) if node.threshold is None else (1, node.threshold)
    return {"tree/nodes": nodes, "tree/counts": counts}


def from_tensors(tensors: Mapping[str, np.ndarray], kind: str) -> Forest:
    """The inverse of :func:`to_tensors` (ValueError on a malformed release)."""
    nodes, counts = np.asarray(tensors["tree/nodes"]), np.asarray(tensors["tree/counts"])
    if nodes.ndim != 3 or nodes.shape[2] != 6 or counts.shape[:2] != nodes.shape[:2] or counts.ndim != 3:
        raise ValueError(f"released tree tensors have shapes {nodes.shape} and {counts.shape}")

    def build(t: int, i: int) -> Node:
        if i >= nodes.shape[1] or nodes[t, i, _KIND] < 0:
            raise ValueError(f"tree {t} has no node {i} below a split")
        row = nodes[t, i]
        node = Node(i, counts[t, i].copy())
        if row[_KIND] == 1:
            node.owner, node.feature = int(row[_OWNER]), int(row[_FEATURE])
            node.bin = None if row[_BIN] < 0 else int(row[_BIN])
            node.threshold = float(row[_THRESHOLD]) if row[_KNOWN] else None
            node.left, node.right = build(t, 2 * i + 1), build(t, 2 * i + 2)
        return node

    n_classes = counts.shape[2]
    return Forest([Tree(build(t, 0), n_classes) for t in range(nodes.shape[0])], n_classes, kind)
