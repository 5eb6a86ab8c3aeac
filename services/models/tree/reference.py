"""The central reference: scikit-learn trained on the same bins, and the vertical data split the runs share.

The parity acceptance compares the federation with scikit-learn on the *bin indices* every party derives from its
own quantile bins (:mod:`.binning`), concatenated in party order: the same candidate thresholds on both sides, so
any gap is the training algorithm's. A forest's output is luo's hard vote (fraction of trees per class), also for
the reference, whose ``predict_proba`` would average leaf distributions instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.ensemble import RandomForestClassifier
from sklearn.model_selection import train_test_split
from sklearn.tree import DecisionTreeClassifier

from vflsec.services.data.datasets import load_dataset, split_columns

from .binning import QuantileBins
from .config import TreeConfig


@dataclass
class TreeData:
    """Party 0 (active, with labels) first, then the passive parties; raw feature values."""

    train: list[np.ndarray]
    test: list[np.ndarray]
    y_train: np.ndarray
    y_test: np.ndarray
    n_classes: int
    name: str = ""

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
    """Each party's bins on its own training rows."""
    return [QuantileBins.fit(x, config.n_bins) for x in data.train]


def central_votes(config: TreeConfig, data: TreeData) -> np.ndarray:
    """scikit-learn on the concatenated bin indices: (n_test, K) one-hot (tree) or hard-vote fractions (forest)."""
    bins = fit_bins(config, data)
    X_train = np.hstack([b.transform(x) for b, x in zip(bins, data.train, strict=True)])
    X_test = np.hstack([b.transform(x) for b, x in zip(bins, data.test, strict=True)])
    common = {"max_depth": config.max_depth, "min_samples_leaf": config.min_samples_leaf, "random_state": config.seed}
    if config.kind == "tree":
        model = DecisionTreeClassifier(**common).fit(X_train, data.y_train)
        labels = model.predict(X_test)[:, None]
    else:
        fraction = config.feature_fraction
        model = RandomForestClassifier(
            n_estimators=config.n_trees, bootstrap=config.bootstrap, max_features=fraction or "sqrt", **common
        ).fit(X_train, data.y_train)
        # Sub-estimators predict indices into model.classes_; hard votes as luo's RF output.
        labels = np.stack([model.classes_[est.predict(X_test).astype(int)] for est in model.estimators_], axis=1)
    votes = np.zeros((X_test.shape[0], data.n_classes))
    for column in labels.T:
        votes[np.arange(len(column)), column.astype(int)] += 1.0
    return votes / labels.shape[1]


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
