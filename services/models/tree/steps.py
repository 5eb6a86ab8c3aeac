"""The per-party protocol steps of tree training and inference: numpy (or ciphertexts) in, numpy (or ciphertexts) out.

Roles (party 0 is the active party; every party, the active one included, is a :class:`FeatureOwner`):

* :class:`Builder` — the coordinator's tree growth: the node queue, bootstrap weights and per-node feature choice
  (seeded model randomness), the stopping rules and the best split by Gini from per-bin class counts
  (:func:`best_split`); it holds the skeleton (owner, feature, bin per split; no thresholds).
* :class:`LabelHolder` — the active party's labels: per node, the class indicators of the node's rows (times their
  bootstrap multiplicity), every class's but the last encrypted for the passive parties (:meth:`LabelHolder.encrypt`)
  and the node's class totals in the clear.
* :class:`FeatureOwner` — a party's bins and thresholds: per-bin class counts of its candidate features, in the clear
  for the active party (:meth:`FeatureOwner.plain_counts`) and as masked ct x pt products for a passive party
  (:meth:`FeatureOwner.masked_products`, masking.masked_feature_products against its 0/1 bin indicators); when its
  split wins it partitions the node's rows and keeps the threshold; at inference it answers its own splits.
* :class:`KeyHolder` — the coordinator's decryption: one answer per (party, tree, node), exactly the width the
  node's candidate features need, honest ciphertext form and the masked range (masking.block_sums); the passive
  party's mask sums come with its products, so the per-bin counts open at the coordinator and nowhere else (the last
  class's as the party's bin weights less the others').

Who learns what (per node): the coordinator learns the (weighted) class counts of every bin of every candidate
feature, and which bin index wins; never a threshold or a per-sample value (every decrypted slot is masked,
uniform in [-2^24, 2^24]). A passive party computes only on ciphertexts and keeps its thresholds, but the partitions
it sees carry the labels (docs/attacks.md), and a deviating one reads chosen rows' labels through crafted products
(docs/protocol.md, Known limits); the active party learns nothing about passive features except the partition of each
node's training rows (which rows go left), which it needs to encrypt the children's indicators. At inference
every party sends the coordinator one bit per (row, own split node); the coordinator routes the rows, so it
learns each query's path, and releases only the class / vote fractions through the score-release chain: the
active party, which would otherwise see every passive comparison (what luo's PRA tries to infer), does not
combine.

State (json bytes): the Builder's is the grown trees and the open queue, the KeyHolder's the answers it spent, a
FeatureOwner's its bin edges and splits. Data (labels, training columns) is not state: it is given again on
restore. The engines checkpoint the KeyHolder with the step that decrypts, after it: a crash in between may open one
(party, node)'s products twice, never decide a node twice (the decision is recorded before its owner learns it).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from vflsec.services.crypto import entropy, he, masking, product_pool
from vflsec.services.errors import FailedPrecondition, InvalidArgument

from .binning import QuantileBins
from .config import TreeConfig
from .structure import ACTIVE, Forest, Node, Tree, copy_tree

# Feature groups a masked product carries (two under CKKS), the rule LR's products follow too.
product_parts = masking.product_parts

NodeKey = tuple[int, int]  # (tree, heap index)


@dataclass(frozen=True)
class Task:
    """One node to grow. Public among the parties: its rows (training positions), their bootstrap multiplicity
    and each party's candidate features."""

    tree: int
    node_id: int
    depth: int
    rows: np.ndarray
    weights: np.ndarray
    features: dict[int, tuple[int, ...]]

    @property
    def key(self) -> NodeKey:
        return (self.tree, self.node_id)

    def to_json(self) -> dict[str, object]:
        return {
            "tree": self.tree,
            "node_id": self.node_id,
            "depth": self.depth,
            "rows": self.rows.tolist(),
            "weights": self.weights.tolist(),
            "features": {str(p): list(f) for p, f in self.features.items()},
        }

    def digest(self, session_id: str, key_epoch: int) -> bytes:
        """A fingerprint of the node as a party holds it (rows, multiplicities, candidate features) in its session
        and key epoch: the key holder opens products only if they were made for its own copy (review 12, R2), in
        this session under this epoch's keys (review 16, F6: not another session's products of the same node)."""
        named = {"session_id": session_id, "key_epoch": int(key_epoch), "node": self.to_json()}
        return hashlib.sha256(json.dumps(named, sort_keys=True).encode()).digest()

    @classmethod
    def from_json(cls, d: dict) -> Task:
        return cls(
            d["tree"],
            d["node_id"],
            d["depth"],
            np.asarray(d["rows"], dtype=np.int64),
            np.asarray(d["weights"], dtype=np.float64),
            {int(p): tuple(f) for p, f in d["features"].items()},
        )


@dataclass(frozen=True)
class Split:
    owner: int
    feature: int  # owner-local
    bin: int  # bin <= bin goes left
    proxy: float  # Σ_side Σ_c count² / n_side (larger is purer)


def best_split(
    task: Task,
    counts: Mapping[int, np.ndarray],
    weights: Mapping[int, np.ndarray],
    totals: np.ndarray,
    bin_sizes: Sequence[Sequence[int]],
    min_samples_leaf: int,
) -> Split | None:
    """The Gini-best split from per-bin class counts; None if no candidate leaves both sides min_samples_leaf.

    ``counts[p]`` is party p's (K, D) block for its candidate features ``task.features[p]``, each feature's bins
    contiguous; ``weights[p]`` (D,) the weighted rows per bin in the bins' owner's word, on which the leaf size is
    judged (so the owner's partition always passes it); ``totals`` (K,) the node's class totals. A feature whose
    counts do not add up to its bins' weights and to the class totals (crafted products or indicators: review 11,
    F1 and F2) is no candidate, whatever else: honest counts match both exactly.

    Minimising the weighted Gini impurity n_L·G_L + n_R·G_R equals maximising Σ_c L_c²/n_L + Σ_c R_c²/n_R. Cuts lie
    only between bins the node's rows occupy, and the chosen bin is the midpoint of the two occupied bins around the
    cut: scikit-learn's threshold on bin-index features, so that unseen bins route the same way. Ties go to the first
    party, feature and cut.
    """
    best: Split | None = None
    for party in sorted(task.features):
        block = np.asarray(counts[party], dtype=np.float64)
        needed = sum(bin_sizes[party][f] for f in task.features[party])
        if block.shape[1] != needed or np.shape(weights[party]) != (needed,):
            raise InvalidArgument(f"party {party}'s counts and bin weights must have {needed} columns")
        offset = 0
        for feature in task.features[party]:
            size = bin_sizes[party][feature]
            per_bin, weight = block[:, offset : offset + size], np.asarray(weights[party])[offset : offset + size]
            offset += size
            if not _adds_up(per_bin, weight, totals):
                continue
            occupied = np.flatnonzero(weight > 0)
            if occupied.size < 2:
                continue
            left = np.cumsum(per_bin[:, occupied], axis=1)[:, :-1]  # (K, cuts)
            right = per_bin.sum(axis=1, keepdims=True) - left
            n_left = np.cumsum(weight[occupied])[:-1]
            n_right = weight.sum() - n_left
            valid = (n_left >= min_samples_leaf) & (n_right >= min_samples_leaf)
            if not valid.any():
                continue
            proxy = np.where(
                valid,
                (left**2).sum(axis=0) / np.maximum(n_left, 1) + (right**2).sum(axis=0) / np.maximum(n_right, 1),
                -np.inf,
            )
            cut = int(np.argmax(proxy))
            if best is None or proxy[cut] > best.proxy:
                best = Split(party, feature, int((occupied[cut] + occupied[cut + 1]) // 2), float(proxy[cut]))
    return best


def _adds_up(per_bin: np.ndarray, weight: np.ndarray, totals: np.ndarray) -> bool:
    """Counts of one feature that sum to its bins' weights (over classes) and to the class totals (over bins)."""
    return bool(
        np.allclose(per_bin.sum(axis=0), weight, rtol=0.0, atol=0.5)
        and np.allclose(per_bin.sum(axis=1), totals, rtol=0.0, atol=0.5)
    )


# Model randomness: seeded per tree / node, so a restored Builder draws the same without saving a generator, and the
# central reference (reference.forest_reference_votes) draws exactly the same rows and features.
def bootstrap_weights(config: TreeConfig, tree: int, n_rows: int) -> np.ndarray:
    """(n_rows,) multiplicity of each training row in tree's bootstrap sample (all ones without bootstrap)."""
    if not config.bootstrap:
        return np.ones(n_rows)
    draws = np.random.default_rng([config.seed, tree]).integers(0, n_rows, n_rows)
    return np.bincount(draws, minlength=n_rows).astype(np.float64)


def candidate_features(config: TreeConfig, tree: int, node_id: int, d: int, d_active: int) -> list[int]:
    """Sorted global indices (party order, then owner-local order) of the features node (tree, node_id) searches.
    At a node the session's partition defense hides from the passive parties, only the active party's (the first
    ``d_active``): as many as elsewhere where it has them, drawn the same way."""
    m = config.features_per_node(d)
    if not config.shows_passive(tree, node_depth(node_id)):
        d, m = d_active, min(m, d_active)
    if m >= d:
        return list(range(d))
    return sorted(int(i) for i in np.random.default_rng([config.seed, tree, node_id, 1]).choice(d, m, replace=False))


def product_fold(task: Task) -> int:
    """Chunks whose products a passive party adds before masking them once (masking.masked_column_products): as many as
    keep every slot's value, a sum of that many rows' multiplicity times a 0/1 bin indicator, within the range the
    masks hide (he.FEATURE_BOUND), as a single row's product was. Public: both the party and the key holder derive it
    from the node's multiplicities."""
    return max(1, int(he.FEATURE_BOUND // max(float(task.weights.max(initial=1.0)), 1.0)))


def products_over(task: Task, sibling: Task | None) -> Task:
    """The smaller child first: the node as a passive party's products are made for it. A left child's right sibling
    (given only where its parent's counts are held for the party with the node's candidate features, so that either
    child's counts are the parent's less the other's) with fewer rows: the sibling's rows and multiplicities under
    the node's key and features, and the key holder derives the node's counts as the parent's less those
    (Histograms.less). Otherwise the node itself. Each party applies it to what it holds, both children's rows among
    them (a passive party: the parent's it made products for or was told were derived, less the node's)."""
    if sibling is None or task.node_id % 2 == 0 or sibling.rows.size >= task.rows.size:
        return task
    return replace(task, rows=sibling.rows, weights=sibling.weights)


def parent_key(key: NodeKey) -> NodeKey:
    return (key[0], (key[1] - 1) // 2)


def encrypted_classes(n_classes: int) -> int:
    """Class columns of a node's encrypted indicators: every class but the last. The last class's per-bin counts are
    the bin weights (the passive party's own word, which it sends beside its products) less the other classes'
    (:meth:`KeyHolder.open_counts`), so its products are never made: K − 1 columns, half the products for two
    classes."""
    return n_classes - 1


def product_count(task: Task, width: int, layout: he.MatrixLayout, parts: int) -> int:
    """Ciphertexts of a passive party's products for a block of ``width`` one-hot columns at a node."""
    return masking.product_count(width, layout, fold=product_fold(task), parts=parts)


def indicator_layout(task: Task, n_classes: int, widest: int, slots: int, parts: int = 1) -> he.MatrixLayout:
    """The layout of a node's encrypted class indicators, (rows, K − 1) (the active party's and the key holder's own
    copy): the replicas that make the least work for the products of the widest passive block at the node's fold
    and ``parts`` (:func:`product_parts`)."""
    shape = (task.rows.size, encrypted_classes(n_classes))
    replicas = he.choose_replicas(*shape, max(widest, 1), slots, fold=product_fold(task), parts=parts)
    return he.MatrixLayout.for_matrix(shape, replicas, slots)


def is_leaf(config: TreeConfig, task: Task, totals: np.ndarray) -> bool:
    """The growth's stopping rules: a node at max_depth, pure, of one row or lighter than 2 * min_samples_leaf (its
    children could not both weigh min_samples_leaf) is a leaf. The coordinator's Builder and the active party's
    GrowthMirror (which holds every input: the node's rows, multiplicities and labels) apply the same rules."""
    return bool(
        task.depth >= config.max_depth
        or np.count_nonzero(totals) <= 1
        or task.rows.size < 2
        or task.weights.sum() < 2 * config.min_samples_leaf
    )


def check_searchable(config: TreeConfig, task: Task) -> None:
    """A passive party's own bounds on a node it is asked to work on (products, or the word that its counts are
    derived): a node key the session's shape has (INVALID_ARGUMENT), of at least 2 * min_samples_leaf weighted rows,
    the session's agreed minimum (FAILED_PRECONDITION; rule 3: a lighter node has no split both of whose sides weigh
    min_samples_leaf). Both depend only on the node as the caller named it (rule 4)."""
    if not (
        task.tree < config.n_trees and task.node_id < 2**config.max_depth - 1 and task.depth == node_depth(task.node_id)
    ):
        raise InvalidArgument(
            f"node {task.key} at depth {task.depth} is no node a session of {config.n_trees} tree(s) of depth "
            f"{config.max_depth} searches"
        )
    if task.weights.sum() < 2 * config.min_samples_leaf:
        raise FailedPrecondition(
            f"node {task.key}: lighter than 2 x min_samples_leaf {config.min_samples_leaf} (this session's), so "
            "the growth leaves it a leaf"
        )


def node_depth(node_id: int) -> int:
    """The depth of a heap-numbered node (root 0, children 2i+1 and 2i+2)."""
    return (node_id + 1).bit_length() - 1


class Builder:
    """The coordinator's side of training: which node next, whether to split it, and the skeleton."""

    def __init__(self, config: TreeConfig, n_classes: int, n_rows: int, bin_sizes: Sequence[Sequence[int]]) -> None:
        if n_classes < 2 or n_rows < 1 or len(bin_sizes) < 2:
            raise ValueError(
                f"need >= 2 classes, >= 1 row and >= 2 parties; got {n_classes}, {n_rows}, {len(bin_sizes)}"
            )
        self.config, self.n_classes, self.n_rows = config, n_classes, n_rows
        self.bin_sizes = [list(sizes) for sizes in bin_sizes]
        self._global = [(p, f) for p, sizes in enumerate(self.bin_sizes) for f in range(len(sizes))]
        self.roots: list[Node | None] = [None] * config.n_trees
        self._nodes: dict[NodeKey, Node] = {}
        # One tree at a time: a tree's root is queued when the one before it is closed, so the queue (and every
        # checkpoint of it) holds one tree's open nodes, not the rows of every tree not yet begun.
        self.started = 1
        self.queue: list[Task] = [self._root_task(0)]

    def _root_task(self, tree: int) -> Task:
        weights = bootstrap_weights(self.config, tree, self.n_rows)
        rows = np.flatnonzero(weights)
        return self._task(tree, 0, 0, rows, weights[rows])

    def _task(self, tree: int, node_id: int, depth: int, rows: np.ndarray, weights: np.ndarray) -> Task:
        features: dict[int, list[int]] = {}
        d_active = len(self.bin_sizes[ACTIVE])
        for index in candidate_features(self.config, tree, node_id, len(self._global), d_active):
            party, feature = self._global[index]
            features.setdefault(party, []).append(feature)
        return Task(tree, node_id, depth, rows, weights, {p: tuple(f) for p, f in features.items()})

    def next_task(self) -> Task | None:
        return self.queue[0] if self.queue else None

    def _close(self) -> None:
        """The current node is done; the next tree's root follows its tree's last node."""
        self.queue.pop(0)
        if not self.queue and self.started < self.config.n_trees:
            self.queue.append(self._root_task(self.started))
            self.started += 1

    def width(self, task: Task, party: int) -> int:
        """Columns of party's per-bin block for this node (0 if it has no candidate feature here)."""
        return sum(self.bin_sizes[party][f] for f in task.features.get(party, ()))

    def decision_bits(self, task: Task) -> int:
        """What the node's decision can say, in bits: one of 1 + Σ candidate bins outcomes (a leaf, or which
        party, feature and bin), whatever the counts it was chosen on; the key budget is charged this much."""
        return max(1, math.ceil(math.log2(1 + sum(self.width(task, p) for p in task.features))))

    def _current(self, task: Task) -> None:
        if not self.queue or self.queue[0].key != task.key:
            raise FailedPrecondition(f"node {task.key} is not the node being grown")

    def open(self, task: Task, totals: np.ndarray) -> bool:
        """Record the node with the active party's class totals; True if its split must be searched."""
        self._current(task)
        totals = np.asarray(totals, dtype=np.float64)
        if totals.shape != (self.n_classes,) or not (np.isfinite(totals).all() and totals.min() >= 0):
            raise InvalidArgument(f"class totals must be {self.n_classes} finite non-negative counts")
        if not np.isclose(totals.sum(), task.weights.sum()):
            raise InvalidArgument(f"class totals {totals.shape} do not sum to the node's weight {task.weights.sum()}")
        node = Node(task.node_id, totals)
        self._nodes[task.key] = node
        if task.node_id == 0:
            self.roots[task.tree] = node
        else:
            parent = self._nodes[(task.tree, (task.node_id - 1) // 2)]
            if task.node_id % 2:
                parent.left = node
            else:
                parent.right = node
        terminal = is_leaf(self.config, task, totals)
        if terminal:
            self._close()
        return not terminal

    def decide(
        self, task: Task, counts: Mapping[int, np.ndarray], weights: Mapping[int, np.ndarray] | None = None
    ) -> Split | None:
        """Best split from every candidate party's counts and bin weights (a party without weights: its counts
        summed over classes, as the active party's own); None makes the node a leaf (and closes it)."""
        self._current(task)
        weights = dict(weights or {})
        for party in task.features:
            expected = (self.n_classes, self.width(task, party))
            if party not in counts or np.shape(counts[party]) != expected:
                raise InvalidArgument(f"party {party}'s counts must have shape {expected}")
            if not (np.isfinite(counts[party]).all() and np.min(counts[party], initial=0) >= 0):
                raise InvalidArgument(f"party {party}'s counts must be finite and non-negative")
            weights.setdefault(party, np.asarray(counts[party]).sum(axis=0))
        totals = self._nodes[task.key].counts
        split = best_split(task, counts, weights, totals, self.bin_sizes, self.config.min_samples_leaf)
        if split is None:
            self._close()
        return split

    def apply(self, task: Task, split: Split, goes_left: np.ndarray) -> None:
        """The owner's partition of the node's rows: record the split, queue both children."""
        self._current(task)
        goes_left = np.asarray(goes_left)
        if goes_left.dtype != bool or goes_left.shape != task.rows.shape:
            raise InvalidArgument(
                f"partition must be {task.rows.size} booleans, got {goes_left.dtype} {goes_left.shape}"
            )
        if goes_left.all() or not goes_left.any():
            raise InvalidArgument("the owner's partition leaves one side empty; the per-bin counts promised both")
        # The counts the split was chosen on are the caller's word (its own counts, or its indicators): the partition
        # itself must leave both children min_samples_leaf (>= [policy] min_node_rows), whatever they claimed.
        lightest = min(float(task.weights[goes_left].sum()), float(task.weights[~goes_left].sum()))
        if lightest < self.config.min_samples_leaf:
            raise InvalidArgument(  # no weight named: it would be a statistic of the owner's bins (review 12, R2)
                f"the owner's partition leaves a side below min_samples_leaf {self.config.min_samples_leaf}: the bin "
                "weights the split was chosen on do not match the node's rows"
            )
        node = self._nodes[task.key]
        node.owner, node.feature, node.bin = split.owner, split.feature, split.bin
        for child, side in ((2 * task.node_id + 1, goes_left), (2 * task.node_id + 2, ~goes_left)):
            self.queue.append(self._task(task.tree, child, task.depth + 1, task.rows[side], task.weights[side]))
        self._close()

    @property
    def done(self) -> bool:
        return not self.queue

    def forest(self) -> Forest:
        """The skeleton (owners, features, bins; no thresholds), once every node is closed."""
        if not self.done or any(r is None for r in self.roots):
            raise FailedPrecondition(f"training is not finished: {len(self.queue)} node(s) still open")
        return Forest([Tree(r, self.n_classes) for r in self.roots], self.n_classes, self.config.kind)  # type: ignore[arg-type]

    def to_state(self) -> bytes:
        return json.dumps(
            {
                "nodes": {
                    f"{t}:{i}": [n.counts.tolist(), n.owner, n.feature, n.bin] for (t, i), n in self._nodes.items()
                },
                "queue": [task.to_json() for task in self.queue],
                "started": self.started,
            }
        ).encode()

    @classmethod
    def from_state(
        cls, data: bytes, config: TreeConfig, n_classes: int, n_rows: int, bin_sizes: Sequence[Sequence[int]]
    ) -> Builder:
        builder = cls(config, n_classes, n_rows, bin_sizes)
        state = json.loads(data)
        builder._nodes = {}
        for key in sorted(state["nodes"], key=lambda k: tuple(map(int, k.split(":")))):
            t, i = map(int, key.split(":"))
            counts, owner, feature, bin_index = state["nodes"][key]
            node = Node(i, np.asarray(counts, dtype=np.float64), owner, feature, bin_index)
            builder._nodes[(t, i)] = node
            if i == 0:
                builder.roots[t] = node
            else:
                parent = builder._nodes[(t, (i - 1) // 2)]
                if i % 2:
                    parent.left = node
                else:
                    parent.right = node
        builder.queue = [Task.from_json(d) for d in state["queue"]]
        builder.started = state.get("started", config.n_trees)  # older checkpoints queued every root at once
        return builder


class GrowthMirror:
    """The active party's copy of the growth (review 14, F1): it sends a node's rows (their class totals to the
    coordinator, their encrypted indicators to the passive parties) only if they are the rows that node must have. A
    root's are the public draw (:func:`bootstrap_weights`: every training row without bootstrap); a child comes after
    its parent was decided a split, and holds one side of it: the active party's own partition where the split is
    its own, else two disjoint sides covering the parent (the left one first); nodes come as the Builder queues
    them, per tree, breadth first. A coordinator that names a node the session hides under a shown node's key, or
    chosen rows, is refused before anything of the node leaves. O(rows) per node, on rows this party holds already.
    """

    def __init__(self, config: TreeConfig, n_rows: int) -> None:
        self.config, self.n_rows = config, n_rows
        self.started = 0
        # (key, rows, weights, exact): the rows the node must hold (exact), or its parent's (a passive split's left)
        self.due: list[tuple[NodeKey, np.ndarray, np.ndarray, bool]] = []
        # recent searched nodes -> each passive party asked there (its [[Y]] or the word) and its candidate features
        self.asked: dict[NodeKey, dict[int, tuple[int, ...]]] = {}
        self._root()

    def _root(self) -> None:
        weights = bootstrap_weights(self.config, self.started, self.n_rows)
        rows = np.flatnonzero(weights)
        self.due.append(((self.started, 0), rows, weights[rows], True))
        self.started += 1

    @property
    def done(self) -> bool:
        return not self.due

    def check(self, task: Task) -> None:
        """Refuse a node that is not the next one due, or whose rows and multiplicities are not its own."""
        if not self.due or task.key != self.due[0][0] or task.depth != node_depth(task.node_id):
            raise FailedPrecondition(
                f"node {task.key}: not the next node of this session's growth (each tree from its root, per tree "
                "breadth first, a node's children only after it was decided a split)"
            )
        _, rows, weights, exact = self.due.pop(0)
        if exact:
            if not (np.array_equal(task.rows, rows) and np.array_equal(task.weights, weights)):
                what = (
                    "its tree's public bootstrap draw (without bootstrap: every training row, once)"
                    if task.node_id == 0
                    else "the side of its parent's split the split's owner partitioned"
                )
                raise FailedPrecondition(f"node {task.key}: its rows or multiplicities are not {what}")
            return
        at = np.searchsorted(rows, task.rows)
        inside = at < rows.size
        if not (
            inside.all()
            and np.array_equal(rows[at], task.rows)
            and np.unique(at).size == at.size
            and 0 < at.size < rows.size
            and np.array_equal(task.weights, weights[at])
        ):
            raise FailedPrecondition(f"node {task.key}: its rows are not one side of its parent's split")
        other = np.ones(rows.size, dtype=bool)
        other[at] = False
        if min(task.weights.sum(), weights[other].sum()) < self.config.min_samples_leaf:
            raise FailedPrecondition(
                f"node {task.key}: a side of its parent's split is lighter than min_samples_leaf "
                f"{self.config.min_samples_leaf} (this session's)"
            )
        sibling = self.due[0][0]
        self.due[0] = (sibling, rows[other], weights[other], True)  # the right side: the rest of the parent

    def opened(self, task: Task, totals: np.ndarray, derived: Sequence[int]) -> None:
        """The coordinator said the node is searched, with the passive parties whose counts it derives: refused
        (before any [[Y]] or word leaves) if the growth's stopping rules, applied here to this party's own labels,
        leave it a leaf (:func:`is_leaf`), or if a party is said derived that was not asked at both the node's
        parent and left sibling for the same candidate features (Histograms.derive: the only nodes an honest
        coordinator derives)."""
        if is_leaf(self.config, task, totals):
            raise FailedPrecondition(
                f"node {task.key}: the coordinator says it is searched, but the growth leaves it a leaf (depth "
                f"{self.config.max_depth}, pure, or lighter than 2 x min_samples_leaf {self.config.min_samples_leaf})"
            )
        family = split_family(task.key)
        for party in derived:
            features = task.features.get(party)
            if family is None or not features or any(self.asked.get(k, {}).get(party) != features for k in family):
                raise FailedPrecondition(
                    f"node {task.key}: the coordinator says party {party}'s counts are derived, but it was not asked "
                    "at both the node's parent and left sibling for the same candidate features"
                )
        self.asked = {key: v for key, v in self.asked.items() if _still_needed(key, task.key)}
        self.asked[task.key] = {p: f for p, f in task.features.items() if p != ACTIVE}

    def products_over(self, task: Task, parties: Sequence[int]) -> Task:
        """The rows the node's [[Y]] is encrypted over (:func:`products_over`): its right sibling's where that has
        fewer rows and every party asked here was asked at the parent for the same candidate features (so the key
        holder holds their parent's counts: the coordinator's own rule, Histograms.holds)."""
        due = self.due[0] if self.due else None
        parent = self.asked.get(parent_key(task.key), {})
        if not parties or due is None or due[0] != (task.tree, task.node_id + 1) or not due[3]:
            return task
        if any(parent.get(p) != task.features.get(p) for p in parties):
            return task
        return products_over(task, Task(task.tree, task.node_id + 1, task.depth, due[1], due[2], task.features))

    def decided(self, task: Task, split: bool, goes_left: np.ndarray | None = None) -> None:
        """The node's decision: a leaf, or a split into its owner's partition (``goes_left``: the active party's
        own; None: a passive party's, known only once its left side is named)."""
        if split:
            children = (2 * task.node_id + 1, 2 * task.node_id + 2)
            if goes_left is None:
                for child in children:
                    self.due.append(((task.tree, child), task.rows, task.weights, False))
            else:
                for child, side in zip(children, (goes_left, ~goes_left), strict=True):
                    self.due.append(((task.tree, child), task.rows[side], task.weights[side], True))
        if not self.due and self.started < self.config.n_trees:
            self._root()


def split_family(key: NodeKey) -> tuple[NodeKey, NodeKey] | None:
    """A right child's parent and left sibling (its histogram is theirs subtracted), None for any other node."""
    tree, node = key
    return None if node == 0 or node % 2 else ((tree, (node - 1) // 2), (tree, node - 1))


def _still_needed(key: NodeKey, current: NodeKey) -> bool:
    """Whether a node's histogram or rows may still serve at ``current`` or after: as a left sibling (node + 1) or a
    parent (up to its right child 2 * node + 2). Nodes grow per tree, breadth first, in increasing heap index."""
    return key[0] == current[0] and current[1] <= 2 * key[1] + 2


class Histograms:
    """The key holder's per-bin counts of recent nodes, per party (histogram subtraction): a right child's counts
    are its parent's minus its left sibling's, when the party's candidate features are the same at all three and
    both were opened (or derived) here, so that party makes and this holder decrypts nothing for it. The derived
    counts are exactly what opening the right child's own products would have given (integer counts of disjoint
    rows), so nothing is learnt that was not before; its decision is charged as before (Builder.decision_bits)."""

    def __init__(self) -> None:
        # (party, node) -> (counts (K, D), bin weights (D,) in the party's word, its candidate features there)
        self.kept: dict[tuple[int, NodeKey], tuple[np.ndarray, np.ndarray, tuple[int, ...]]] = {}

    def keep(self, party: int, task: Task, counts: np.ndarray, weights: np.ndarray) -> None:
        self.kept[(party, task.key)] = (np.asarray(counts), np.asarray(weights), tuple(task.features[party]))

    def derive(self, party: int, task: Task) -> tuple[np.ndarray, np.ndarray] | None:
        """The right child's (counts, bin weights) for ``party`` from its parent and left sibling (:meth:`less`), or
        None."""
        family = split_family(task.key)
        if family is None:
            return None
        got = [self.kept.get((party, key)) for key in family]
        features = tuple(task.features.get(party, ()))
        if not features or any(entry is None or entry[2] != features for entry in got):
            return None
        return self.less(party, task, *got[1][:2])  # type: ignore[index]

    def holds(self, party: int, key: NodeKey, features: Sequence[int]) -> bool:
        """Whether ``party``'s counts at node ``key`` are kept here, for these candidate features."""
        entry = self.kept.get((party, key))
        return entry is not None and entry[2] == tuple(features)

    def less(self, party: int, task: Task, counts: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``task``'s counts and bin weights as its parent's (kept here) less its sibling's (given), clipped as
        opened counts are (KeyHolder.open_counts): crafted products may make the difference negative, and only the
        decision may depend on a decryption (rule 4); Builder.best_split drops a feature that does not add up."""
        parent, parent_weights, _ = self.kept[(party, parent_key(task.key))]
        return np.clip(parent - counts, 0.0, float(task.weights.sum())), np.clip(parent_weights - weights, 0.0, None)

    def prune(self, current: NodeKey) -> None:
        self.kept = {key: v for key, v in self.kept.items() if _still_needed(key[1], current)}

    def to_json(self) -> list[list]:
        return [[p, *key, c.tolist(), w.tolist(), list(f)] for (p, key), (c, w, f) in self.kept.items()]

    @classmethod
    def from_json(cls, data: Sequence[Sequence]) -> Histograms:
        kept = cls()
        for p, t, i, c, w, f in data:
            kept.kept[(p, (t, i))] = (np.asarray(c, dtype=np.float64), np.asarray(w, dtype=np.float64), tuple(f))
        return kept


class KnownRows:
    """A passive party's rows of recent nodes: those it made products for, and the complement of each such left
    child in its parent (its right sibling, whose counts the key holder derives: Histograms). ApplySplit at a right
    child it made no products for is answered only once the active party said it was opened (:meth:`opened`), and
    only for exactly those rows and candidate features."""

    def __init__(self) -> None:
        # node -> (rows, multiplicities, this party's candidate features there)
        self.nodes: dict[NodeKey, tuple[np.ndarray, np.ndarray, tuple[int, ...]]] = {}
        self.searched_here: set[NodeKey] = set()  # derived nodes the active party said were opened (searched)
        self.made: set[NodeKey] = set()  # nodes whose products the key holder took from this party

    def searched(self, task: Task, party: int) -> Task | None:
        """Record a node this party makes products for; the right sibling it implies (a left child's complement in
        its parent), if any."""
        self.nodes = {key: v for key, v in self.nodes.items() if _still_needed(key, task.key)}
        self.searched_here = {key for key in self.searched_here if key in self.nodes}
        self.made = {key for key in self.made if key in self.nodes} | {task.key}
        self.nodes[task.key] = (task.rows, task.weights, tuple(task.features.get(party, ())))
        sibling = self._sibling(task, party)
        if sibling is not None:
            self.nodes[sibling.key] = (sibling.rows, sibling.weights, sibling.features[party])
        return sibling

    def _sibling(self, task: Task, party: int, counted: bool = False) -> Task | None:
        """A left child's right sibling (its parent's rows less its own), if its parent's rows are known here with
        the same candidate features (``counted``: and the key holder holds the parent's counts from this party,
        products taken or the word that they were derived)."""
        features, (tree, node) = tuple(task.features.get(party, ())), task.key
        parent_at = parent_key(task.key)
        parent = self.nodes.get(parent_at) if node % 2 else None
        if parent is None or parent[2] != features or (counted and parent_at not in self.made | self.searched_here):
            return None
        rest = ~np.isin(parent[0], task.rows)
        return Task(tree, node + 1, task.depth, parent[0][rest], parent[1][rest], {party: features})

    def products_over(self, task: Task, party: int, rows: int) -> Task | None:
        """The node as this party makes products for it, given the rows of the [[Y]] it received: its own, or its
        right sibling's where :func:`products_over` allows them (fewer rows, the parent's counts held); None if
        ``rows`` is neither."""
        over = self._smaller(task, party)
        return over if rows == over.rows.size else task if rows == task.rows.size else None

    def accepted_rows(self, task: Task, party: int) -> list[int]:
        """The row counts of a [[Y]] :meth:`products_over` accepts for ``task`` (named in a refusal)."""
        return sorted({task.rows.size, self._smaller(task, party).rows.size})

    def _smaller(self, task: Task, party: int) -> Task:
        return products_over(task, self._sibling(task, party, counted=True))

    def complement(self, task: Task, party: int) -> bool:
        """Whether ``task`` is a right child whose rows and candidate features are its known complement."""
        entry = self.nodes.get(task.key)
        return (
            split_family(task.key) is not None
            and entry is not None
            and entry[2] == tuple(task.features.get(party, ()))
            and np.array_equal(entry[0], task.rows)
        )

    def opened(self, task: Task, party: int) -> None:
        """The active party's word that a derived node is searched (a NodeCounts without [[Y]])."""
        if not self.complement(task, party):
            raise FailedPrecondition(
                f"node {task.key}: not a right child whose rows are its parent's less its left sibling's, both with "
                "products from this party for the same candidate features"
            )
        self.searched_here.add(task.key)

    def derived(self, task: Task, party: int) -> bool:
        """Whether ApplySplit may be answered at ``task`` without products of its own: a known complement that the
        active party said was opened."""
        return task.key in self.searched_here and self.complement(task, party)

    def to_json(self) -> dict[str, list]:
        nodes = [[*key, rows.tolist(), w.tolist(), list(f)] for key, (rows, w, f) in self.nodes.items()]
        made = [list(key) for key in sorted(self.made)]
        return {"nodes": nodes, "opened": [list(key) for key in sorted(self.searched_here)], "made": made}

    @classmethod
    def from_json(cls, data: Mapping[str, Sequence]) -> KnownRows:
        known = cls()
        known.nodes = {
            (t, i): (np.asarray(r, dtype=np.int64), np.asarray(w, dtype=np.float64), tuple(f))
            for t, i, r, w, f in data.get("nodes", [])
        }
        known.searched_here = {(t, i) for t, i in data.get("opened", [])}
        known.made = {(t, i) for t, i in data.get("made", known.nodes)}  # older checkpoints: every node recorded
        return known


class LabelHolder:
    """The active party's labels (data, not state)."""

    def __init__(self, y: np.ndarray, n_classes: int) -> None:
        self.y, self.n_classes = np.asarray(y, dtype=np.int64), n_classes

    def indicators(self, task: Task) -> np.ndarray:
        """(n_node, K): row i's class indicator times its bootstrap multiplicity."""
        return np.eye(self.n_classes)[self.y[task.rows]] * task.weights[:, None]

    def totals(self, task: Task) -> np.ndarray:
        return self.indicators(task).sum(axis=0)

    def encrypt(
        self, backend: he.Backend, task: Task, widest: int, pool: product_pool.ProductPool | None = None
    ) -> he.WireMatrix:
        """[[indicators]] of every class but the last (:func:`encrypted_classes`) for the passive parties, replicated
        for the widest block a passive party sends, as they go on the wire (each ciphertext saved once); encrypted in
        ``pool``'s worker processes where that pays."""
        layout = indicator_layout(task, self.n_classes, widest, backend.slots, product_parts(backend))
        sent = self.indicators(task)[:, : encrypted_classes(self.n_classes)]
        encrypt = he.encrypt_to_wire if pool is None else pool.encrypt_to_wire
        return encrypt(backend, sent, layout.replicas, form=he.OPERAND)


class FeatureOwner:
    """One party's bins, its training bin matrix and the thresholds of the splits it won."""

    def __init__(self, party: int, bins: QuantileBins, X_train: np.ndarray | None = None) -> None:
        self.party, self.bins = party, bins
        self.train_bins = None if X_train is None else bins.transform(X_train)
        self.splits: dict[NodeKey, tuple[int, int]] = {}  # (tree, node) -> (feature, bin)
        self._last: tuple[Task, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None  # the last task's _columns

    @classmethod
    def fit(cls, party: int, X_train: np.ndarray, config: TreeConfig) -> FeatureOwner:
        return cls(party, QuantileBins.fit(X_train, config.n_bins), X_train)

    def _train(self) -> np.ndarray:
        if self.train_bins is None:
            raise FailedPrecondition(f"party {self.party} was restored without its training columns")
        return self.train_bins

    def _columns(self, task: Task) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The node's bins of its candidate features (n_node, F), their features' first columns (F + 1, the last
        the width D) and the candidate features themselves; gathered once for the last Task object asked (a node's
        products and bin weights ask for them in turn: 0.1 s each at a 228,000-row root)."""
        if self._last is None or self._last[0] is not task:
            features = np.asarray(task.features.get(self.party, ()), dtype=np.int64)
            starts = np.concatenate([[0], np.cumsum([self.bins.sizes[f] for f in features], dtype=np.int64)])
            self._last = task, (self._train()[np.ix_(task.rows, features)], starts, features)
        return self._last[1]

    def one_hot(self, task: Task) -> tuple[np.ndarray, np.ndarray]:
        """The node's bins of its candidate features (n_node, F) and their features' first columns (F + 1, the last
        the width D): the (n_node, D) 0/1 bin indicator matrix, row i in bin b of candidate feature f, as
        product_pool.one_hot_columns builds it."""
        return self._columns(task)[:2]

    def indicator_columns(self, task: Task) -> Callable[[int, int], np.ndarray]:
        """columns(lo, hi): columns lo..hi-1 of the bin indicator matrix (:meth:`one_hot`), a few at a time."""
        return product_pool.one_hot_columns(*self.one_hot(task))

    def indicator_matrix(self, task: Task) -> np.ndarray:
        """(n_node, D) 0/1: the whole bin indicator matrix (tests, small nodes)."""
        return self.indicator_columns(task)(0, self.width(task))

    def width(self, task: Task) -> int:
        return sum(self.bins.sizes[f] for f in task.features.get(self.party, ()))

    def plain_counts(self, task: Task, indicators: np.ndarray) -> np.ndarray:
        """(K, D) per-bin class counts in the clear (the active party on its own features): indicators' columns
        summed per bin of each candidate feature."""
        bins, starts, _ = self._columns(task)
        # Each row adds to one bin per feature: column starts[f] + bins[:, f] of the flat (D,) histogram.
        flat = (bins + starts[:-1]).ravel()
        return np.stack(
            [np.bincount(flat, np.repeat(column, bins.shape[1]), starts[-1]) for column in np.asarray(indicators).T]
        )

    def bin_weights(self, task: Task) -> np.ndarray:
        """(D,) the node's weighted rows per bin of each candidate feature (what the key holder checks counts by)."""
        return self.plain_counts(task, task.weights[:, None])[0]

    def masked_products(
        self, backend: he.Backend, encrypted: he.EncryptedMatrix, task: Task, rng: he.RandomSource
    ) -> tuple[list[he.Ct], np.ndarray]:
        """Masked [[indicators ⊙ bin indicator]] blocks (each the sum of product_fold(task) chunks) and their mask
        sums, both for the key holder."""
        if encrypted.shape[0] != task.rows.size:
            raise InvalidArgument(f"encrypted indicators have {encrypted.shape[0]} rows, the node {task.rows.size}")
        columns, fold = self.indicator_columns(task), product_fold(task)
        return masking.masked_column_products(
            backend, encrypted, columns, self.width(task), rng, fold=fold, parts=product_parts(backend)
        )

    def pooled_products(
        self, pool: product_pool.ProductPool, keys: he.Backend, indicators: he.WireMatrix, task: Task
    ) -> tuple[list[bytes], np.ndarray]:
        """:meth:`masked_products` of the indicators as they came off the wire, serialized: made in ``pool``'s worker
        processes (over every core it has), or here when the pool would not pay for it (one worker, a small node)."""
        try:
            if pool.pays(keys, indicators, self.width(task), product_parts(keys)):
                return pool.products(keys, indicators, *self.one_hot(task), product_fold(task), product_parts(keys))
            received = product_pool.parse(keys, indicators)
        except product_pool.BadIndicators as exc:
            raise InvalidArgument(f"indicators: {exc}") from exc
        products, mask_sums = self.masked_products(keys, received, task, entropy.os_entropy())
        return [keys.serialize(ct) for ct in products], mask_sums

    def apply_split(self, task: Task, feature: int, bin_index: int, min_samples_leaf: int = 1) -> np.ndarray:
        """Keep the split; the node's rows that go left (the partition everyone learns). A split that leaves a side
        lighter than ``min_samples_leaf`` (the session's) is refused before anything is kept or sent (rule 3 at the
        partition's holder): the chooser holds this party's bin weights, so the refusal tells it nothing new."""
        if feature not in task.features.get(self.party, ()) or not 0 <= bin_index < self.bins.sizes[feature] - 1:
            raise InvalidArgument(f"party {self.party} has no candidate split feature {feature} bin {bin_index} here")
        left = self._train()[task.rows, feature] <= bin_index
        if min(task.weights[left].sum(), task.weights[~left].sum()) < min_samples_leaf:
            raise FailedPrecondition(
                f"node {task.key}: the split of feature {feature} at bin {bin_index} leaves a side below "
                f"min_samples_leaf {min_samples_leaf} (this session's); no partition is sent"
            )
        self.splits[task.key] = (feature, bin_index)
        return left

    def thresholds(self) -> dict[NodeKey, float]:
        """Raw thresholds of this party's splits (disclosed only if the parameter-release chain says so)."""
        return {key: self.bins.threshold(f, b) for key, (f, b) in self.splits.items()}

    def directions(self, X: np.ndarray) -> dict[NodeKey, np.ndarray]:
        """Inference: for each of this party's split nodes, which of these rows go left."""
        bins = self.bins.transform(X)
        return {key: bins[:, f] <= b for key, (f, b) in self.splits.items()}

    def to_state(self) -> bytes:
        return json.dumps(
            {
                "party": self.party,
                "edges": self.bins.to_json(),
                "splits": [[t, i, f, b] for (t, i), (f, b) in self.splits.items()],
            }
        ).encode()

    @classmethod
    def from_state(cls, data: bytes, X_train: np.ndarray | None = None) -> FeatureOwner:
        state = json.loads(data)
        owner = cls(state["party"], QuantileBins.from_json(state["edges"]), X_train)
        owner.splits = {(t, i): (f, b) for t, i, f, b in state["splits"]}
        return owner


class KeyHolder:
    """The coordinator's decryptions for split finding, under the LR block-sum limits (docs/protocol.md)."""

    def __init__(self, backend: he.Backend) -> None:
        if not backend.can_decrypt:
            raise ValueError("the key holder needs the secret key")
        self.backend = backend
        self.answered: set[tuple[int, int, int]] = set()  # (party, tree, node): one answer each

    def open_counts(
        self,
        party: int,
        task: Task,
        width: int,
        layout: he.MatrixLayout,
        products: Sequence[bytes],
        mask_sums: np.ndarray,
        bin_weights: np.ndarray,
    ) -> np.ndarray:
        """Serialized masked products + the party's mask sums and bin weights -> the (K, width) per-bin class counts.

        ``width`` and ``layout`` are the coordinator's own (the node's candidate bins, the indicators' layout of
        K − 1 classes), never the caller's. The products open the first K − 1 classes' counts; the last class's are
        the party's bin weights (its own word, checked here before anything is parsed) less theirs. The answer is
        spent before anything is parsed, whatever the outcome. Nothing decrypted decides a refusal (rule 4): a
        product beyond the masked range is clipped to it and the counts to [0, the node's weight], so that only the
        split decision depends on the decryption (and is charged).
        """
        key = (party, *task.key)
        if key in self.answered:
            raise FailedPrecondition(f"party {party} already had its one decryption for node {task.key}")
        if layout.shape[0] != task.rows.size or width < 1:
            raise InvalidArgument(f"layout {layout.shape} / width {width} do not fit node {task.key}")
        weights = np.asarray(bin_weights, dtype=np.float64)
        if weights.shape != (width,) or not (np.isfinite(weights).all() and weights.min(initial=0) >= 0):
            raise InvalidArgument(f"bin weights must be {width} finite non-negative numbers, got {weights.shape}")
        if not np.array_equal(weights, np.rint(weights)):  # sums of row multiplicities: a fraction is no honest word
            raise InvalidArgument("bin weights must be whole numbers (sums of row multiplicities)")
        fold, parts = product_fold(task), product_parts(self.backend)
        expected = product_count(task, width, layout, parts)
        if len(products) != expected:
            raise InvalidArgument(
                f"a block of {width} columns at {layout.replicas} replicas over {layout.n_chunks} chunks, "
                f"{fold} to a product, {parts} groups a product, is "
                f"{expected} ciphertexts, got {len(products)}"
            )
        k = layout.shape[1]
        rows = math.ceil(width / layout.replicas) * layout.replicas
        mask_sums = np.asarray(mask_sums, dtype=np.float64)
        if mask_sums.shape != (rows, k) or not np.isfinite(mask_sums).all():
            raise InvalidArgument(f"mask sums must be finite with shape {(rows, k)}, got {mask_sums.shape}")
        limit = self.backend.max_ciphertext_bytes
        if any(len(blob) > limit for blob in products):
            raise InvalidArgument(f"a ciphertext exceeds {limit} bytes, the size of a fresh one")
        self.answered.add(key)
        try:
            cts = he.deserialize_all(self.backend, products, layout.ct_size)
            self.backend.check_form(cts, product=True, form=he.OPERAND)
            bound = self.backend.default_mask_bound + he.FEATURE_BOUND + 1.0
            sums = masking.block_sums(self.backend, cts, layout, max_abs=bound, clip=True, fold=fold, parts=parts)
            sums = sums[:rows]  # two parts and an odd number of groups: the last imaginary part carries none
        except ValueError as exc:
            raise InvalidArgument(f"ciphertexts: {exc}") from exc
        # Counts are integers (bootstrap multiplicities times 0/1); rounding removes the CKKS decoding error.
        counts = np.rint(masking.gradient_from_block_sums(sums, mask_sums, width))
        counts = np.vstack([counts, weights - counts.sum(axis=0)])  # the last class: the bins' weight less the others
        return np.clip(counts, 0.0, float(task.weights.sum()))

    def to_state(self) -> bytes:
        """The spent answers: a restored coordinator must not decrypt a node's products twice."""
        return json.dumps(sorted(self.answered)).encode()

    def load_state(self, data: bytes) -> None:
        self.answered = {tuple(k) for k in json.loads(data)}  # type: ignore[misc]


def combine(forest: Forest, directions: Mapping[int, Mapping[NodeKey, np.ndarray]], n: int) -> np.ndarray:
    """The coordinator: route n rows with every owner's answers -> (n, K) vote fractions (one-hot for a tree)."""
    labels = np.empty((n, len(forest.trees)), dtype=np.int64)
    for t, tree in enumerate(forest.trees):

        def descend(node: Node, rows: np.ndarray, t: int = t) -> None:
            if node.is_leaf:
                labels[rows, t] = node.label
                return
            answer = np.asarray(directions.get(node.owner, {}).get((t, node.node_id)))  # type: ignore[arg-type]
            if answer.dtype != bool or answer.shape != (n,):
                raise InvalidArgument(f"party {node.owner} must answer node {(t, node.node_id)} with {n} booleans")
            left, right = node.children()
            descend(left, rows[answer[rows]])
            descend(right, rows[~answer[rows]])

        descend(tree.root, np.arange(n))
    return forest.votes(labels)


def full_tree(forest: Forest, owners: Sequence[FeatureOwner]) -> Forest:
    """The skeleton with every owner's thresholds filled in (what ``release(..., "full")`` then discloses)."""
    thresholds = [owner.thresholds() for owner in owners]
    trees = []
    for t, tree in enumerate(forest.trees):
        filled = copy_tree(tree)
        for node in filled.nodes():
            if not node.is_leaf:
                node.threshold = thresholds[node.owner][(t, node.node_id)]  # type: ignore[index]
        trees.append(filled)
    return Forest(trees, forest.n_classes, forest.kind)


__all__ = [
    "ACTIVE",
    "Builder",
    "FeatureOwner",
    "GrowthMirror",
    "Histograms",
    "KeyHolder",
    "KnownRows",
    "LabelHolder",
    "NodeKey",
    "Split",
    "Task",
    "best_split",
    "combine",
    "encrypted_classes",
    "full_tree",
    "indicator_layout",
    "product_count",
    "product_fold",
    "product_parts",
    "split_family",
]
