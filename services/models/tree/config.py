"""Tree-family configuration: one frozen, validated description shared by every party and the central reference.

``kind="tree"`` is one CART classifier (Gini); ``kind="forest"`` a random forest of ``n_trees`` CART trees, each on
a bootstrap sample (``bootstrap``) with a fresh feature subsample at every node (``feature_fraction``; None: sqrt(d)
features as scikit-learn's default). Thresholds are bin edges: every party bins its own features into at most
``n_bins`` quantile bins (:mod:`.binning`). ``seed`` drives only model randomness (bootstrap draws and feature
choice), which is public among the parties; nothing drawn at release time depends on it. ``partition_defense``: the
label holder's partition steps (services/models/tree/partitions.py), public, which hide nodes from the passive parties.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from vflsec.services.config import MIN_NODE_ROWS
from vflsec.services.models.family import DictForm, positive_int
from vflsec.services.models.tree.partitions import PartitionDefense

Kind = Literal["tree", "forest"]
KINDS: tuple[str, ...] = get_args(Kind)
MAX_BINS = 64  # a bin indicator column per bin and feature: this caps the width one party sends per node


@dataclass(frozen=True)
class TreeConfig(DictForm):
    """CART (``kind="tree"``) or random forest (``kind="forest"``); defaults are the issue-13 acceptance settings."""

    kind: Kind = "tree"
    max_depth: int = 5
    # The coordinator's [policy] min_node_rows default (rule 3): no leaf, hence no released count, of fewer rows;
    # scikit-learn's 1 moves wine / digits accuracy by < 1 pp (docs/trees.md).
    min_samples_leaf: int = MIN_NODE_ROWS
    n_bins: int = 16
    n_trees: int = 1
    bootstrap: bool = False
    feature_fraction: float | None = None  # None: all features (tree), sqrt(d) of them per node (forest)
    seed: int = 0
    # Partition defense specs (e.g. "complete_secure:trees=1"): nodes they hide are grown from the active party's
    # features alone, and no passive party sees their rows.
    partition_defense: tuple[str, ...] = ()

    @classmethod
    def forest(cls, n_trees: int = 100, max_depth: int = 3, **kwargs: object) -> TreeConfig:
        """luo's RF setting: bagged trees with per-node feature subsampling."""
        return cls(kind="forest", n_trees=n_trees, max_depth=max_depth, bootstrap=True, **kwargs)  # type: ignore[arg-type]

    def __post_init__(self) -> None:
        specs = self.partition_defense
        object.__setattr__(self, "partition_defense", (specs,) if isinstance(specs, str) else tuple(specs))
        for error in self._errors():
            raise ValueError(f"tree config: {error}")

    def _errors(self) -> Iterator[str]:
        if self.kind not in KINDS:
            yield f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}"
        if not positive_int(self.max_depth):
            yield f"max_depth must be a positive integer, got {self.max_depth!r}"
        if not positive_int(self.min_samples_leaf):
            yield f"min_samples_leaf must be a positive integer, got {self.min_samples_leaf!r}"
        if not (positive_int(self.n_bins) and 2 <= self.n_bins <= MAX_BINS):
            yield f"n_bins must be an integer in [2, {MAX_BINS}], got {self.n_bins!r}"
        if not positive_int(self.n_trees):
            yield f"n_trees must be a positive integer, got {self.n_trees!r}"
        elif self.kind == "tree" and self.n_trees != 1:
            yield f"a tree is one tree: n_trees must be 1 for kind='tree', got {self.n_trees} (use kind='forest')"
        if not isinstance(self.bootstrap, bool):
            yield f"bootstrap must be a bool, got {self.bootstrap!r}"
        elif self.kind == "tree" and self.bootstrap:
            yield "bootstrap applies to forests only (kind='forest')"
        fraction = self.feature_fraction
        if fraction is not None and not (
            isinstance(fraction, int | float)
            and not isinstance(fraction, bool)
            and math.isfinite(fraction)
            and 0 < fraction <= 1
        ):
            yield f"feature_fraction must lie in (0, 1] or be None, got {fraction!r}"
        if not (isinstance(self.seed, int) and not isinstance(self.seed, bool) and self.seed >= 0):
            yield f"seed must be a non-negative integer, got {self.seed!r}"
        if not all(isinstance(spec, str) for spec in self.partition_defense):
            yield f"partition_defense must be step specs (strings), got {list(self.partition_defense)!r}"
            return
        try:
            steps = self.defense.steps
        except ValueError as exc:
            yield f"partition_defense: {exc}"
            return
        if positive_int(self.max_depth):
            for step in steps:
                if reason := step.hides_nothing(self.max_depth):
                    yield f"partition_defense: {reason}"

    @functools.cached_property
    def defense(self) -> PartitionDefense:
        return PartitionDefense.from_specs(self.partition_defense, self.kind if self.kind in KINDS else "tree")

    def shows_passive(self, tree: int, depth: int) -> bool:
        """Whether the passive parties search node at ``depth`` of tree ``tree`` (and so see its rows)."""
        return not self.partition_defense or self.defense.shows(tree, depth)

    def features_per_node(self, d: int) -> int:
        """How many of the federation's d features a node's split search considers (scikit-learn's rule)."""
        if self.feature_fraction is None:
            return d if self.kind == "tree" else max(1, int(math.sqrt(d)))
        return max(1, int(self.feature_fraction * d))


MAX_SPLIT_COLUMNS = 4096  # inference shares have a column per possible split node: one ciphertext row's slots


@dataclass(frozen=True)
class TreeSettings:
    """The shared :class:`.config.TreeConfig` and the receiving party's position (0: active; 1..P: passive)."""

    config: TreeConfig
    party: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.party, int) or self.party < 0:
            raise ValueError(f"party must be a position >= 0, got {self.party!r}")
        if self.split_columns > MAX_SPLIT_COLUMNS:
            raise ValueError(
                f"n_trees x (2^max_depth - 1) = {self.split_columns} split columns exceed {MAX_SPLIT_COLUMNS}, "
                "the width of one inference share row"
            )

    @property
    def split_columns(self) -> int:
        return self.config.n_trees * (2**self.config.max_depth - 1)

    def column(self, key: tuple[int, int]) -> int:
        """A split node's column in an inference share: internal heap indices lie below 2^max_depth − 1."""
        return key[0] * (2**self.config.max_depth - 1) + key[1]

    def to_dict(self) -> dict[str, Any]:
        return {**self.config.to_dict(), "party": self.party}

    @classmethod
    def of(cls, values: Mapping[str, Any], kind: str) -> TreeSettings:
        values = dict(values)
        party = values.pop("party", 0)
        if kind == "forest":
            values = {"n_trees": 100, "max_depth": 3, "bootstrap": True, **values}
        return cls(TreeConfig.from_dict({**values, "kind": kind}), party)
