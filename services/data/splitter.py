"""The splitter: per-party scaling, the vertical split of a dataset's columns among the parties, and the rows
by sample ID (selection, overlapping ID sets, the train/test split)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    pass

from .tables import ScalerKind, _positions, _require_unique

# -------------------------------------------------------------------------------------------- scaling


@dataclass(frozen=True, eq=False)
class Scaler:
    """Per-column affine scaling ``(x - offset) / scale``; columns with ``scale == 0`` map to 0.

    Each party fits one on its own columns, so no statistic crosses a party boundary.
    """

    kind: ScalerKind
    offset: np.ndarray
    scale: np.ndarray

    def __post_init__(self) -> None:
        if self.kind not in ("minmax", "standard", "none"):
            raise ValueError(f"scaler kind must be 'minmax', 'standard' or 'none', got {self.kind!r}")
        offset = np.asarray(self.offset, dtype=np.float64).ravel()
        scale = np.asarray(self.scale, dtype=np.float64).ravel()
        if offset.shape != scale.shape:
            raise ValueError(f"scaler offset {offset.shape} and scale {scale.shape} differ")
        if not (np.isfinite(offset).all() and np.isfinite(scale).all()) or (scale < 0).any():
            raise ValueError("scaler parameters must be finite with non-negative scale")
        object.__setattr__(self, "offset", offset)
        object.__setattr__(self, "scale", scale)

    @classmethod
    def fit(cls, X: np.ndarray, kind: ScalerKind = "minmax") -> Scaler:
        X = _check_matrix(X, None)
        if X.shape[0] == 0:
            raise ValueError("cannot fit a scaler on zero rows")
        d = X.shape[1]
        if kind == "minmax":
            low = X.min(axis=0)
            return cls(kind, low, X.max(axis=0) - low)
        if kind == "standard":
            return cls(kind, X.mean(axis=0), X.std(axis=0))
        return cls(kind, np.zeros(d), np.ones(d))

    @property
    def n_features(self) -> int:
        return int(self.offset.shape[0])

    def transform(self, X: np.ndarray, *, clip: bool = False) -> np.ndarray:
        """Scale ``X``; ``clip`` bounds min-max output to [0, 1] (rows outside the fitted range)."""
        X = _check_matrix(X, self.n_features)
        constant = self.scale == 0
        Z = (X - self.offset) / np.where(constant, 1.0, self.scale)
        Z[:, constant] = 0.0
        if clip and self.kind == "minmax":
            np.clip(Z, 0.0, 1.0, out=Z)
        return Z

    def inverse_transform(self, Z: np.ndarray) -> np.ndarray:
        """Back to raw units (constant columns come back as their fitted value)."""
        return _check_matrix(Z, self.n_features) * self.scale + self.offset

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "offset": self.offset.tolist(), "scale": self.scale.tolist()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scaler:
        return cls(data["kind"], np.asarray(data["offset"]), np.asarray(data["scale"]))


def _check_matrix(X: np.ndarray, n_columns: int | None) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"expected a 2-D array, got shape {X.shape}")
    if n_columns is not None and X.shape[1] != n_columns:
        raise ValueError(f"expected {n_columns} columns, got {X.shape[1]}")
    if not np.isfinite(X).all():
        raise ValueError("array contains NaN or infinite values")
    return X


# ------------------------------------------------------------------------------------ vertical split


@dataclass
class VerticalSplit:
    """Which feature columns each party holds: the active party, then passive parties 1..P."""

    active: list[str]
    passive: list[list[str]]

    def __post_init__(self) -> None:
        if not self.passive:
            raise ValueError("a vertical split needs at least one passive party")
        if any(not cols for cols in self.parties):
            raise ValueError("every party needs at least one column")
        _require_unique([c for cols in self.parties for c in cols], "columns across parties")

    @property
    def parties(self) -> list[list[str]]:
        return [self.active, *self.passive]

    @property
    def n_passive(self) -> int:
        return len(self.passive)

    def to_dict(self) -> dict[str, Any]:
        return {"active": list(self.active), "passive": [list(cols) for cols in self.passive]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VerticalSplit:
        return cls(list(data["active"]), [list(cols) for cols in data["passive"]])


@dataclass(frozen=True)
class RandomColumns:
    """A random choice of passive columns (luo's setting): a count, or a fraction of the columns, drawn with
    ``seed`` (None: the split's seed)."""

    amount: int | float
    seed: int | None = None

    def __str__(self) -> str:
        return f"random:{self.amount}" + ("" if self.seed is None else f":{self.seed}")


PassiveFeatures = int | float | Sequence[str] | RandomColumns


def _passive_count(d: int, amount: int | float) -> int:
    if isinstance(amount, bool):
        raise TypeError("passive_features must be a count, a fraction or a list of column names")
    if isinstance(amount, float):
        if not 0.0 < amount < 1.0:
            raise ValueError(f"passive fraction must lie in (0, 1), got {amount}")
        count = int(np.floor(amount * d + 0.5))
    else:
        count = int(amount)
    if not 1 <= count <= d - 1:
        raise ValueError(
            f"{amount!r} gives {count} passive columns out of {d}; "
            f"the passive side needs 1..{d - 1} so the active party keeps at least one"
        )
    return count


def _passive_columns(names: list[str], passive_features: PassiveFeatures, seed: int = 0) -> list[str]:
    d = len(names)
    if isinstance(passive_features, RandomColumns):
        count = _passive_count(d, passive_features.amount)
        rng = np.random.default_rng(seed if passive_features.seed is None else passive_features.seed)
        return [names[i] for i in sorted(rng.choice(d, size=count, replace=False))]
    if isinstance(passive_features, int | float | np.integer):
        return names[d - _passive_count(d, passive_features) :]
    chosen = [str(c) for c in passive_features]
    _require_unique(chosen, "passive_features")
    _positions(names, chosen, what="passive")
    return chosen


def _chunks(items: list[str], n: int, rng: np.random.Generator | None) -> list[list[str]]:
    """``items`` in ``n`` near-equal groups: contiguous runs, or random groups (kept in item order)."""
    order = np.arange(len(items)) if rng is None else rng.permutation(len(items))
    return [[items[i] for i in sorted(group)] for group in np.array_split(order, n)]


def split_columns(
    feature_names: Sequence[str],
    n_passive: int,
    *,
    passive_features: PassiveFeatures | None = None,
    seed: int = 0,
    shuffle: bool = False,
) -> VerticalSplit:
    """Assign columns to the active party and ``n_passive`` passive parties.

    ``passive_features``: an int N gives the last N columns to the passive side, a float in (0, 1) that
    fraction (rounded) of the last columns, a list those columns, :class:`RandomColumns` a random (seeded)
    choice of that many; the passive side is then divided as evenly
    as possible among the passive parties. ``None`` divides all columns evenly among the 1 + n_passive
    parties, the active party first. ``shuffle`` makes the division random (seeded) instead of contiguous.
    """
    names = [str(f) for f in feature_names]
    _require_unique(names, "feature names")
    if n_passive < 1:
        raise ValueError(f"n_passive must be at least 1, got {n_passive}")
    rng = np.random.default_rng(seed) if shuffle else None
    if passive_features is None:
        if len(names) < n_passive + 1:
            raise ValueError(f"{len(names)} columns cannot give each of {n_passive + 1} parties one column")
        active, *passive = _chunks(names, n_passive + 1, rng)
        return VerticalSplit(active, passive)
    passive_cols = _passive_columns(names, passive_features, seed)
    taken = set(passive_cols)
    active = [c for c in names if c not in taken]
    if not active:
        raise ValueError("the passive side takes every column; the active party needs at least one")
    if len(passive_cols) < n_passive:
        raise ValueError(f"{len(passive_cols)} passive columns cannot serve {n_passive} passive parties")
    return VerticalSplit(active, _chunks(passive_cols, n_passive, rng))


# ------------------------------------------------------------------------------------- sample IDs


class IdIndex:
    """Row positions of IDs within ``ids`` by a binary search over their sort order, which is computed once, at the
    first lookup (no Python object per row: 8 bytes per ID): for lookups repeated against one large ID column, such
    as a party's, whose sessions share one index."""

    def __init__(self, ids: Sequence[str] | np.ndarray) -> None:
        ids = np.asarray(ids)
        self.ids = ids if ids.dtype.kind == "U" else ids.astype(str)  # a str array is kept, not copied
        self._order: np.ndarray | None = None
        self._lock = threading.Lock()

    def _sorted(self) -> np.ndarray:
        with self._lock:
            if self._order is None:  # int64: searchsorted copies any other sorter per call
                self._order = np.argsort(self.ids, kind="stable")
            return self._order

    def find(self, wanted: Sequence[str] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rows, found) for each of ``wanted``, in its order; a row is meaningful only where ``found``."""
        wanted = np.asarray(wanted).astype(str).reshape(-1)
        if not len(self.ids):
            return np.zeros(len(wanted), dtype=np.int64), np.zeros(len(wanted), dtype=bool)
        order = self._sorted()
        rows = order[np.minimum(np.searchsorted(self.ids, wanted, sorter=order), len(self.ids) - 1)]
        return rows.astype(np.int64), self.ids[rows] == wanted


def select_ids(ids: Sequence[str] | np.ndarray, wanted: Sequence[str] | np.ndarray) -> np.ndarray:
    """Row positions of ``wanted`` within ``ids`` (in the order of ``wanted``); KeyError if any is absent."""
    wanted = np.asarray(wanted).astype(str).reshape(-1)
    rows, found = IdIndex(ids).find(wanted)
    if not found.all():
        raise KeyError(f"{int((~found).sum())} id(s) not present, e.g. {wanted[~found][:5].tolist()}")
    return rows


def overlapping_id_sets(
    ids: Sequence[str] | np.ndarray, n_parties: int, drop_fraction: float, seed: int, *, shuffle: bool = False
) -> list[np.ndarray]:
    """One ID subset per party: each party independently drops a random ``drop_fraction`` of ``ids``.

    The sets overlap (about ``(1 - drop_fraction) ** n_parties`` of the ids are common to all) but differ,
    so alignment has real work to do. Each subset keeps the input order unless ``shuffle``.
    """
    ids = np.asarray(ids).astype(str)
    _require_unique(ids, "ids")
    return [ids[rows] for rows in overlapping_rows(len(ids), n_parties, drop_fraction, seed, shuffle=shuffle)]


def overlapping_rows(
    n: int, n_parties: int, drop_fraction: float, seed: int, *, shuffle: bool = False
) -> list[np.ndarray]:
    """The row positions behind :func:`overlapping_id_sets` (the same draw): a dealer slices its table with them
    instead of looking the IDs up again."""
    if n_parties < 1:
        raise ValueError(f"n_parties must be at least 1, got {n_parties}")
    if not 0.0 <= drop_fraction < 1.0:
        raise ValueError(f"drop_fraction must lie in [0, 1), got {drop_fraction}")
    rng = np.random.default_rng(seed)
    n_keep = n - int(np.floor(drop_fraction * n + 0.5))
    subsets = []
    for _ in range(n_parties):
        keep = rng.permutation(n)[:n_keep]
        subsets.append(keep if shuffle else np.sort(keep))
    return subsets


def train_test_split_ids(
    ids: Sequence[str] | np.ndarray, y: Sequence[int] | np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Stratified, seeded split: each class sends ``round(test_fraction * n_class)`` of its ids to the test
    side. Both sides keep the input order."""
    ids = np.asarray(ids).astype(str)
    y = np.asarray(y).reshape(-1)
    if y.shape != ids.shape:
        raise ValueError(f"{y.shape[0]} labels for {ids.shape[0]} ids")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}")
    rng = np.random.default_rng(seed)
    is_test = np.zeros(len(ids), dtype=bool)
    for cls in np.unique(y):
        members = np.flatnonzero(y == cls)
        n_test = int(np.floor(test_fraction * len(members) + 0.5))
        is_test[rng.permutation(members)[:n_test]] = True
    return ids[~is_test], ids[is_test]
