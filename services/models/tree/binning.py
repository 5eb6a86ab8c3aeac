"""Quantile bins, fitted by a feature's owner on its own training rows; the edges never leave it unless released.

Bin b of a feature holds the values x with ``edges[b-1] < x <= edges[b]`` (``b = #edges below x``), so the split
"bin <= t" is exactly "x <= edges[t]", luo's "value <= threshold goes left". Edges are the distinct interior
quantiles of the training column: a column with fewer distinct values gets fewer bins, a constant one a single
bin (no split).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class QuantileBins:
    """One party's bin edges per feature (owner-local feature order)."""

    edges: tuple[np.ndarray, ...]

    @classmethod
    def fit(cls, X: np.ndarray, n_bins: int) -> QuantileBins:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[0] < 1 or X.shape[1] < 1:
            raise ValueError(f"binning needs a non-empty 2-D feature matrix, got shape {X.shape}")
        if not np.isfinite(X).all():
            raise ValueError("binning: features contain NaN or infinite values")
        levels = np.linspace(0.0, 1.0, n_bins + 1)[1:-1]
        edges = []
        for column in X.T:
            cut = np.unique(np.quantile(column, levels))
            edges.append(cut[cut < column.max()])  # an edge at the maximum would leave its upper bin empty
        return cls(tuple(edges))

    @property
    def n_features(self) -> int:
        return len(self.edges)

    @property
    def sizes(self) -> list[int]:
        """Bins per feature (public: the coordinator needs them to size and check the per-bin aggregates)."""
        return [len(e) + 1 for e in self.edges]

    def transform(self, X: np.ndarray) -> np.ndarray:
        """(n, d) bin indices of raw values."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(f"expected ({X.shape[0] if X.ndim else '?'}, {self.n_features}) features, got {X.shape}")
        return np.stack([np.searchsorted(e, x, side="left") for e, x in zip(self.edges, X.T, strict=True)], axis=1)

    def threshold(self, feature: int, bin_index: int) -> float:
        """The raw threshold of the split "bin <= bin_index" (the edge itself)."""
        return float(self.edges[feature][bin_index])

    def to_json(self) -> list[list[float]]:
        return [e.tolist() for e in self.edges]

    @classmethod
    def from_json(cls, data: list[list[float]]) -> QuantileBins:
        return cls(tuple(np.asarray(e, dtype=np.float64) for e in data))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, QuantileBins) and json.dumps(self.to_json()) == json.dumps(other.to_json())

    __hash__ = None  # type: ignore[assignment]
