"""A dataset as every loader returns it (:class:`Dataset`: raw features, class indices, string IDs), the
encoding vocabulary the loaders and dealers share, and the checks on names and labels they all run."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa


CategoricalEncoding = Literal["onehot", "ordinal"]
# What a dealer may deal: a loader's encoding, or "target" (ordinal codes replaced by :func:`target_encode`).
Encoding = Literal["onehot", "ordinal", "target"]
MissingPolicy = Literal["impute", "drop"]
ScalerKind = Literal["minmax", "standard", "none"]
ColumnRef = str | int

MISSING_CATEGORY = "<missing>"
DEFAULT_MISSING_VALUES: tuple[str, ...] = ("?", "")
# Spellings of "not available" that, in an otherwise numeric column of a user's CSV, are read as missing (and the
# load says so); any other text among numbers is refused with the column named (load_csv's checks).
NA_SPELLINGS = frozenset({"n/a", "na", "nan", "null", "none", "-", "--", "#n/a"})
# A user's CSV: a text column with more distinct values than this is free text or IDs, not a category (refused);
# one with more than NOTE_LEVELS categories is encoded and the load says into how many columns.
MAX_LEVELS, NOTE_LEVELS = 100, 20
# A label with more classes than this, or non-integer numbers beyond NOTE_LEVELS of them, is a continuous target.
MAX_CLASSES = 100
DATASETS_ENV_VAR = "VFLSEC_DATASETS"
# Delimiter value meaning "runs of whitespace" (the Statlog files are space separated).
WHITESPACE = " "

_ID_WIDTH = 6


@functools.cache
def _arrow() -> tuple[Any, Any, Any]:
    """pyarrow, its compute functions and its CSV module, imported on first use (0.4 s: not at CLI start-up)."""
    import pyarrow
    import pyarrow.compute
    import pyarrow.csv

    return pyarrow, pyarrow.compute, pyarrow.csv


@dataclass
class Dataset:
    """A labelled tabular dataset with raw (unscaled) numeric features and string sample IDs."""

    name: str
    ids: np.ndarray
    X: np.ndarray
    y: np.ndarray
    feature_names: list[str]
    class_names: list[str]
    categorical: list[str] = field(default_factory=list)  # columns holding category codes (ordinal encoding)
    # What loading decided on the user's behalf, one line each naming the column and the treatment (the CLI warns).
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ids = np.asarray(self.ids).astype(str)
        self.X = np.asarray(self.X, dtype=np.float64)
        self.y = np.asarray(self.y)
        self.feature_names = [str(f) for f in self.feature_names]
        self.class_names = [str(c) for c in self.class_names]
        if self.X.ndim != 2:
            raise ValueError(f"dataset {self.name!r}: X must be 2-D, got shape {self.X.shape}")
        n, d = self.X.shape
        if self.ids.shape != (n,):
            raise ValueError(f"dataset {self.name!r}: {self.ids.shape} ids for {n} rows")
        if self.y.shape != (n,):
            raise ValueError(f"dataset {self.name!r}: y has shape {self.y.shape}, expected ({n},)")
        if len(self.feature_names) != d:
            raise ValueError(f"dataset {self.name!r}: {len(self.feature_names)} names for {d} columns")
        _require_unique(self.feature_names, f"dataset {self.name!r}: feature names")
        _require_unique(self.ids, f"dataset {self.name!r}: sample ids")
        if not np.isfinite(self.X).all():
            raise ValueError(f"dataset {self.name!r}: X contains NaN or infinite values")
        if not self.class_names:
            raise ValueError(f"dataset {self.name!r}: no class names")
        _require_unique(self.class_names, f"dataset {self.name!r}: class names")
        self.y = _as_class_indices(self.y, len(self.class_names), f"dataset {self.name!r}")

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    @property
    def n_samples(self) -> int:
        return int(self.X.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.X.shape[1])

    def column_indices(self, columns: Sequence[str]) -> np.ndarray:
        """Positions of ``columns`` in :attr:`feature_names`, in the given order."""
        return _positions(self.feature_names, columns, what="feature")

    def subset(self, rows: np.ndarray | Sequence[int]) -> Dataset:
        """The rows at positions ``rows`` (same features and classes, even if a class no longer occurs)."""
        rows = np.asarray(rows, dtype=np.int64)
        return Dataset(
            self.name,
            self.ids[rows],
            self.X[rows],
            self.y[rows],
            list(self.feature_names),
            list(self.class_names),
            list(self.categorical),
        )


def _require_unique(values: Iterable[Any], what: str) -> None:
    if isinstance(values, np.ndarray):  # sorted in C: a million IDs make no Python objects
        ordered = np.sort(values, kind="stable")
        repeated = ordered[1:][ordered[1:] == ordered[:-1]]
        if repeated.size:
            raise ValueError(f"{what} are not unique, e.g. {sorted(str(v) for v in np.unique(repeated))[:5]}")
        return
    counts = Counter(values)
    if len(counts) != sum(counts.values()):
        dupes = sorted(str(v) for v, c in counts.items() if c > 1)
        raise ValueError(f"{what} are not unique, e.g. {dupes[:5]}")


def _as_class_indices(y: np.ndarray, n_classes: int, what: str) -> np.ndarray:
    integral = np.issubdtype(y.dtype, np.integer) or (
        np.issubdtype(y.dtype, np.floating) and np.array_equal(y, np.round(y))
    )
    if y.size and not integral:
        raise ValueError(f"{what}: labels must be integer class indices, got dtype {y.dtype}")
    y = y.astype(np.int64)
    if y.size and (y.min() < 0 or y.max() >= n_classes):
        raise ValueError(f"{what}: labels must lie in 0..{n_classes - 1}, got {y.min()}..{y.max()}")
    return y


def _positions(names: Sequence[str], wanted: Sequence[str], *, what: str) -> np.ndarray:
    index = {name: i for i, name in enumerate(names)}
    unknown = [w for w in wanted if w not in index]
    if unknown:
        raise KeyError(f"unknown {what} column(s) {unknown[:5]}; available: {list(names)}")
    return np.array([index[w] for w in wanted], dtype=np.int64)


def _row_ids(n: int, start: int = 0) -> np.ndarray:
    width = max(_ID_WIDTH, len(str(max(start + n - 1, 0))))
    if n == 0:
        return np.array([], dtype=str)
    return np.strings.add("s", np.strings.zfill(np.arange(start, start + n).astype(str), width))


def _nulls(column: pa.ChunkedArray) -> np.ndarray:
    """Which rows of a column are null (a Parquet file's missing cell)."""
    return np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=bool)


def _first_rows(rows: np.ndarray) -> str:
    """'rows [2, 7] (0-based)', the first five of the rows marked, and how many there are in all."""
    marked = np.flatnonzero(rows)
    more = f" ({len(marked)} in all)" if len(marked) > 5 else ""
    return f"rows {marked[:5].tolist()}{more} (0-based data rows)"
