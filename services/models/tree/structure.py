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

from collections.abc import Callable, Iterator
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
