"""The central reference: scikit-learn trained on the same bins, and the vertical data split the runs share.

The parity acceptance compares the federation with scikit-learn on the *bin indices* every party derives from its
own quantile bins (:mod:`.binning`), concatenated in party order: the same candidate thresholds on both sides, so
any gap is the training algorithm's. A forest's output is luo's hard vote (fraction of trees per class), also for
the reference. The forest reference uses the protocol's own bootstrap rows and per-node candidate features
(:func:`.steps.bootstrap_weights`, :func:`.steps.candidate_features`), so the only thing left to compare is how each
node's split is found: scikit-learn's (a depth-1 ``DecisionTreeClassifier`` on the node's rows, multiplicities and
candidate columns) against the protocol's encrypted per-bin counts. A scikit-learn ``RandomForestClassifier`` draws
its own bootstraps, and a single seed then differs by several pp (docs/trees.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.model_selection import train_test_split
from sklearn.tree import DecisionTreeClassifier

from vflsec.services.data.datasets import load_dataset, split_columns

from .binning import QuantileBins
from .config import TreeConfig
from .steps import bootstrap_weights, candidate_features


@dataclass
class TreeData:
    """Party 0 (active, with labels) first, then the passive parties; raw feature values."""

    train: list[np.ndarray]
    test: list[np.ndarray]
    y_train: np.ndarray
    y_test: np.ndarray
    n_classes: int
    name: str = ""
    # Each passive party's whole shard (every row it holds, aligned or not), which its bins are fitted on; empty:
    # its training and test rows are its whole shard (a built-in dataset dealt to every party in full).
    shards: tuple[np.ndarray, ...] = ()

    @property
    def features(self) -> tuple[int, ...]:
        return tuple(x.shape[1] for x in self.train)

    @classmethod
    def load(cls, name: str, n_passive: int = 1, test_fraction: float = 0.2, seed: int = 0) -> TreeData:
        """A built-in dataset, columns divided evenly (active first), a stratified seeded train/test split."""
        ds = load_dataset(name)
        split = split_columns(ds.feature_names, n_passive)
        train, test = train_test_split(
            np.arange(ds.n_samples), test_size=test_fraction, random_state=seed, stratify=ds.y
        )
        blocks = [ds.X[:, ds.column_indices(cols)] for cols in split.parties]
        return cls([b[train] for b in blocks], [b[test] for b in blocks], ds.y[train], ds.y[test], ds.n_classes, name)


def fit_bins(config: TreeConfig, data: TreeData) -> list[QuantileBins]:
    """Each party's bins as the services fit them: the active party's on its training rows, a passive party's on
    its whole shard (``data.shards``, else its training and test rows), never on rows another party names."""
    def shard(p: int) -> np.ndarray:
        return data.shards[p - 1] if data.shards else np.vstack([data.train[p], data.test[p]])

    return [QuantileBins.fit(x if p == 0 else shard(p), config.n_bins) for p, x in enumerate(data.train)]


def central_votes(config: TreeConfig, data: TreeData) -> np.ndarray:
    """scikit-learn on the concatenated bin indices: (n_test, K) one-hot (tree) or hard-vote fractions (forest)."""
    bins = fit_bins(config, data)
    X_train = np.hstack([b.transform(x) for b, x in zip(bins, data.train, strict=True)])
    X_test = np.hstack([b.transform(x) for b, x in zip(bins, data.test, strict=True)])
    if config.kind == "tree" and not config.partition_defense:
        model = DecisionTreeClassifier(
            max_depth=config.max_depth, min_samples_leaf=config.min_samples_leaf, random_state=config.seed
        )
        labels = model.fit(X_train, data.y_train).predict(X_test)[:, None]
    else:
        labels = np.stack(
            [
                _tree_labels(config, t, X_train, data.y_train, X_test, data.n_classes, data.train[0].shape[1])
                for t in range(config.n_trees)
            ],
            axis=1,
        )
    votes = np.zeros((X_test.shape[0], data.n_classes))
    for column in labels.T:
        votes[np.arange(len(column)), column.astype(int)] += 1.0
    return votes / labels.shape[1]


def _tree_labels(
    config: TreeConfig, tree: int, X: np.ndarray, y: np.ndarray, X_test: np.ndarray, n_classes: int, d_active: int
) -> np.ndarray:
    """(n_test,) leaf labels of one forest tree grown by scikit-learn on the protocol's bootstrap rows, node by node
    on the protocol's candidate features of that node (heap node ids, as the Builder numbers them; the active
    party's ``d_active`` columns alone where a partition defense hides the node, and also for a defended tree)."""
    labels = np.zeros(X_test.shape[0], dtype=np.int64)
    weights = bootstrap_weights(config, tree, X.shape[0])
    stack = [(0, 0, np.flatnonzero(weights), np.arange(X_test.shape[0]))]
    while stack:
        node_id, depth, rows, test = stack.pop()
        w = weights[rows]
        split = None
        if depth < config.max_depth:
            columns = candidate_features(config, tree, node_id, X.shape[1], d_active)
            split = _best_stump(config, X[rows], y[rows], w, columns)
        if split is not None:
            column, threshold = split
            left, test_left = X[rows, column] <= threshold, X_test[test, column] <= threshold
            stack.append((2 * node_id + 1, depth + 1, rows[left], test[test_left]))
            stack.append((2 * node_id + 2, depth + 1, rows[~left], test[~test_left]))
            continue
        # The leaf's class: the weighted majority, the lowest class on ties (scikit-learn's and the protocol's rule).
        labels[test] = int(np.argmax(np.bincount(y[rows], weights=w, minlength=n_classes)))
    return labels


def stump(config: TreeConfig, weights: np.ndarray) -> DecisionTreeClassifier:
    """A depth-1 scikit-learn tree with the protocol's leaf rule: min_samples_leaf counts bootstrap multiplicity
    (the Builder sees weighted counts only), i.e. a minimum leaf weight; integer weights, so m − ½ is exact."""
    if config.min_samples_leaf == 1:
        return DecisionTreeClassifier(max_depth=1)
    return DecisionTreeClassifier(max_depth=1, min_weight_fraction_leaf=(config.min_samples_leaf - 0.5) / weights.sum())


def _best_stump(
    config: TreeConfig, X: np.ndarray, y: np.ndarray, weights: np.ndarray, columns: list[int]
) -> tuple[int, float] | None:
    """The Gini-best (column, threshold) over the candidate columns, each column's best cut scikit-learn's (a
    depth-1 tree on that column alone); None if no column splits. Between columns the first of equally good ones wins:
    the protocol's tie rule. One stump over all columns would keep the first in a random column order instead, and on
    pure or tied nodes that picks another column (about one tree in seven on wine), not a better one."""
    best: tuple[float, int, float] | None = None
    if weights.sum() < 2 * config.min_samples_leaf:
        return None
    for column in columns:
        t = stump(config, weights).fit(X[:, [column]], y, sample_weight=weights).tree_
        if t.node_count < 3:
            continue
        impurity = t.impurity[1] * t.weighted_n_node_samples[1] + t.impurity[2] * t.weighted_n_node_samples[2]
        if best is None or impurity < best[0] - 1e-9 * weights.sum():  # equal up to float rounding: keep the first
            best = (impurity, column, float(t.threshold[0]))
    return None if best is None else best[1:]


def accuracy(votes: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.argmax(votes, axis=1) == y))


def reference_accuracy(
    config: TreeConfig, blocks: list[np.ndarray], y: np.ndarray, train: np.ndarray, test: np.ndarray, n_classes: int
) -> float:
    """scikit-learn on the same bins of the given training rows, scored on the given test rows: the parity check of
    a federated run that chose its own rows (the demo's split of the aligned IDs). ``blocks``: party columns, in
    party order, of every row."""
    data = TreeData([b[train] for b in blocks], [b[test] for b in blocks], y[train], y[test], n_classes)
    return accuracy(central_votes(config, data), data.y_test)
