"""Datasets: loading, encoding, per-party scaling, vertical splits and the party data files.

Shared by the party services (each party reads its own data file) and the operator CLI (the demo splits a
dataset vertically and writes one data file per party).

Sources
    * scikit-learn's bundled datasets (``breast_cancer``, ``wine``, ``digits``, ``iris``), always present;
    * the raw UCI / Kaggle files in ``shared/datasets`` (see :func:`shared_datasets_dir`), read in their
      published formats (CRLF, ``;`` or whitespace separators, junk banner lines, ``.``-suffixed test labels);
    * any CSV or Parquet file through :func:`load_csv`: pyarrow's multi-threaded reader, column by column
      (no Python object per row); the csv module reads only whitespace-separated files, each file's first
      record (names, header detection) and a file Arrow's dialect would read differently (see
      :func:`_arrow_cells`).

Encoding rules (:func:`load_csv` and the UCI loaders)
    * A column is *numeric* when every non-missing cell parses as a float; otherwise it is *categorical*.
      Numerically coded categories (e.g. ``SEX`` = 1/2 in the credit data) therefore stay numeric.
    * ``categorical="onehot"``: one 0/1 column per category, named ``column=category`` (``job=admin.``);
      a two-category column becomes a single indicator of its second category (``Fever=Yes``), since the
      second column would be redundant. ``categorical="ordinal"``: one column of category codes 0..k-1.
      Categories are ordered numbers-first (numerically), then strings (lexicographically).
    * Missing values: a cell is missing when, after stripping whitespace, it equals one of
      ``missing_values`` (default ``"?"`` and the empty string), or when a numeric cell is NaN/infinite.
      With ``missing="impute"`` (default) a numeric cell gets the mean of the observed cells of its column
      (0 if none) and a categorical cell gets its own category ``<missing>`` (sorted last). With
      ``missing="drop"`` every row with a missing feature is removed. A missing *label* is always an error.
    * Labels are mapped to class indices in the same category order (``class_names[i]`` is class ``i``).
    * Rows without an ID column get IDs ``s000000``, ``s000001``, ... (row index, zero-padded).

Dataset-specific choices (from the PROVENANCE files and the papers in ``shared/papers``)
    * ``bank``: ``duration`` is dropped. The dataset's description says it "highly affects the output
      target ... should be discarded if the intention is to have a realistic predictive model", and the
      Rassouli and Varasteh papers drop it too (19 features, 41188 records).
    * ``grid``: ``stab`` is dropped because it determines the label ``stabf`` exactly.
    * ``credit``: ``ID`` becomes the sample IDs, not a feature.
    * ``adult``: ``adult.data`` and ``adult.test`` are concatenated (48842 rows); the test file's banner
      line is skipped and the trailing ``.`` of its labels removed.
    * ``satellite`` and ``pendigits``: the published train and test files are concatenated.
    * ``covid``: kept as published, including its duplicate rows and two constant columns.
"""

from __future__ import annotations

import contextlib
import csv
import ctypes
import functools
import io
import itertools
import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
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
_PARTY_ID_COLUMN = "id"
_PARTY_LABEL_COLUMN = "label"
_CLASSES_COMMENT = "# classes: "


@functools.cache
def _arrow() -> tuple[Any, Any, Any]:
    """pyarrow, its compute functions and its CSV module, imported on first use (0.4 s: not at CLI start-up)."""
    import pyarrow
    import pyarrow.compute
    import pyarrow.csv

    return pyarrow, pyarrow.compute, pyarrow.csv


# --------------------------------------------------------------------------------------------- Dataset


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


# ------------------------------------------------------------------------------------ encoding tables


def _category_key(value: str) -> tuple[int, float, str]:
    """Numbers first in numeric order (so class "10" follows "9"), then strings; ``<missing>`` last."""
    if value == MISSING_CATEGORY:
        return (2, 0.0, value)
    try:
        return (0, float(value), value)
    except ValueError:
        return (1, 0.0, value)


def _codes(values: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Sorted categories (see :func:`_category_key`) and each value's index among them."""
    uniques, inverse = np.unique(values, return_inverse=True)
    order = sorted(range(len(uniques)), key=lambda i: _category_key(str(uniques[i])))
    rank = np.empty(len(uniques), dtype=np.int64)
    rank[order] = np.arange(len(uniques))
    return [str(uniques[i]) for i in order], rank[inverse.ravel()]


def _parse_numeric(values: np.ndarray, missing: np.ndarray) -> np.ndarray | None:
    """Floats with NaN where missing or non-finite, or None when some present cell is not a number."""
    out = np.full(values.shape, np.nan)
    try:
        out[~missing] = values[~missing].astype(np.float64)
    except ValueError:
        return None
    out[~np.isfinite(out)] = np.nan
    return out


def _str_array(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An Arrow string column as a fixed-width numpy str array, cut from its buffers (no Python str per row).
    A null becomes the empty string."""
    pa, pc, _ = _arrow()
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    arr = pc.fill_null(pc.cast(arr, pa.large_string()), "")
    n = len(arr)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + n + 1]
    start, end = (int(offsets[0]), int(offsets[-1])) if n else (0, 0)
    data = np.frombuffer(arr.buffers()[2], dtype=np.uint8)[start:end] if end > start else np.zeros(0, np.uint8)
    if data.size and data.max() >= 0x80:  # not ASCII: numpy's bytes-to-str cast would refuse it
        return np.array(arr.to_pylist(), dtype=str).reshape(n)
    lengths = np.diff(offsets)
    width = max(int(lengths.max(initial=0)), 1)
    out = np.zeros((n, width), dtype=np.uint8)
    rows = np.repeat(np.arange(n), lengths)
    out[rows, np.arange(data.size) - (np.repeat(offsets[:-1], lengths) - start)] = data
    return out.view(f"S{width}").reshape(n).astype(f"U{width}")


def _strings(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """A column's distinct cells (str; a number in Arrow's spelling, a null as ``""``) and each row's index
    among them."""
    pa, pc, _ = _arrow()
    encoded = pc.dictionary_encode(pc.fill_null(pc.cast(column.combine_chunks(), pa.string()), ""))
    return _str_array(encoded.dictionary), encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)


def _numbers(column: pa.ChunkedArray, missing_values: Sequence[str]) -> tuple[np.ndarray | None, np.ndarray]:
    """A column's floats (NaN where missing or non-finite), or None when some present cell is not a number; and
    which rows are missing (a cell in ``missing_values``, or a null of a typed Parquet column)."""
    pa, pc, _ = _arrow()
    if pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
        floats = np.array(pc.cast(column, pa.float64()).to_numpy(), dtype=np.float64)
        missing = np.asarray(column.is_null().to_numpy(), dtype=bool)
    else:
        column = pc.fill_null(pc.cast(column, pa.string()), "")
        is_missing = pc.is_in(column, value_set=pa.array(list(missing_values), pa.string()))
        missing = np.asarray(is_missing.to_numpy(), dtype=bool)
        try:  # Arrow parses a subset of Python's float syntax (no "_"), correctly rounded as numpy is
            present = pc.if_else(is_missing, pa.scalar(None, pa.string()), column)
            floats = np.array(pc.cast(present, pa.float64()).to_numpy(), dtype=np.float64)
        except pa.ArrowInvalid:  # a category, or a number only Python spells (1_000): numpy on the distinct cells
            values, index = _strings(column)
            parsed = _parse_numeric(values, np.isin(values, list(missing_values)))
            floats = None if parsed is None else parsed[index]
    if floats is not None:
        floats[~np.isfinite(floats)] = np.nan
    return floats, missing


def _encode_column(
    name: str,
    column: pa.ChunkedArray,
    floats: np.ndarray | None,
    keep: np.ndarray,
    categorical: CategoricalEncoding,
    missing_values: Sequence[str],
    notes: list[str] | None = None,
) -> tuple[list[str], np.ndarray]:
    notes = [] if notes is None else notes
    if floats is not None:
        numeric = floats if keep.all() else floats[keep]
        absent = np.isnan(numeric)
        if absent.any():
            fill = numeric[~absent].mean() if (~absent).any() else 0.0
            numeric[absent] = fill
            notes.append(f"column {name!r}: {int(absent.sum())} missing cell(s) imputed with its mean {fill:.4g}")
        return [name], numeric[:, None]
    values, index = _strings(column)
    values = np.where(np.isin(values, list(missing_values)), MISSING_CATEGORY, values)
    levels, codes = _codes(values[index[keep]])
    if MISSING_CATEGORY in levels:
        absent = int((codes == levels.index(MISSING_CATEGORY)).sum())
        notes.append(f"column {name!r}: {absent} missing cell(s) kept as their own category {MISSING_CATEGORY}")
    if len(levels) > NOTE_LEVELS:
        into = f"one-hot encoded into {len(levels)} columns" if categorical == "onehot" else "coded 0..k-1"
        notes.append(f"column {name!r}: text with {len(levels)} categories, {into}")
    if categorical == "ordinal":
        return [name], codes[:, None].astype(np.float64)
    if len(levels) == 2:
        return [f"{name}={levels[1]}"], (codes == 1).astype(np.float64)[:, None]
    return [f"{name}={level}" for level in levels], np.eye(len(levels))[codes]


class ColumnNotFound(KeyError, ValueError):
    """A named column the file does not have (a ValueError too, so the CLI reports it in one line)."""

    def __str__(self) -> str:
        return str(self.args[0])


def _resolve_column(columns: Sequence[str], ref: ColumnRef, role: str) -> int:
    if isinstance(ref, bool) or not isinstance(ref, str | int | np.integer):
        raise TypeError(f"{role} column must be a name or an index, got {ref!r}")
    if isinstance(ref, str):
        if ref not in columns:
            shown = ", ".join(list(columns)[:20]) + (", ..." if len(columns) > 20 else "")
            raise ColumnNotFound(f"{role} column {ref!r} not found; the file's columns: {shown}")
        return list(columns).index(ref)
    if not -len(columns) <= ref < len(columns):
        raise ColumnNotFound(f"{role} column index {ref} out of range for {len(columns)} columns")
    return int(ref) % len(columns)


@dataclass
class _Table:
    """One or more files with the same layout, one Arrow column per name: the cells as written (stripped
    strings), or typed numbers (a Parquet file's)."""

    columns: list[str]
    data: list[pa.ChunkedArray]

    @property
    def n_rows(self) -> int:
        return len(self.data[0]) if self.data else 0


def _encode_table(
    name: str,
    table: _Table,
    label: ColumnRef,
    *,
    id_column: ColumnRef | None,
    drop: Sequence[ColumnRef],
    categorical: CategoricalEncoding,
    missing: MissingPolicy,
    missing_values: Sequence[str],
    label_suffix: str = "",
    strict: bool = False,
    label_given: bool = True,
) -> Dataset:
    """The table encoded (module docstring). ``strict`` (a user's file): stray text among numbers, free text and
    continuous labels are refused with the column named, and what loading decided is in the dataset's notes."""
    if categorical not in ("onehot", "ordinal"):
        raise ValueError(f"categorical must be 'onehot' or 'ordinal', got {categorical!r}")
    if missing not in ("impute", "drop"):
        raise ValueError(f"missing must be 'impute' or 'drop', got {missing!r}")
    columns = table.columns
    label_at = _resolve_column(columns, label, "label")
    id_at = None if id_column is None else _resolve_column(columns, id_column, "id")
    skip = {label_at, *(() if id_at is None else (id_at,))}
    skip |= {_resolve_column(columns, ref, "drop") for ref in drop}
    feature_at = [j for j in range(len(columns)) if j not in skip]
    if not feature_at:
        raise ValueError(f"dataset {name!r}: no feature columns left")

    values, index = _strings(table.data[label_at])
    label_missing = np.isin(values, list(missing_values))[index] | _nulls(table.data[label_at])
    if label_missing.any():
        raise ValueError(f"dataset {name!r}: label {columns[label_at]!r} missing in {_first_rows(label_missing)}")
    if label_suffix:
        values = np.array([v.removesuffix(label_suffix) for v in values], dtype=str)
    label_values = values[index]
    # IDs are fixed before rows are dropped, so a generated ID always names the same file row.
    if id_at is None:
        ids = _row_ids(table.n_rows)
    else:
        values, index = _strings(table.data[id_at])
        ids = values[index]
        if (blank := ids == "").any():
            raise ValueError(f"dataset {name!r}: ID column {columns[id_at]!r} is empty in {_first_rows(blank)}")
    parsed = {j: _numbers(table.data[j], missing_values) for j in feature_at}
    notes: list[str] = []
    if strict:
        _check_label(columns[label_at], label_values, label_given)
        for j in feature_at:
            if parsed[j][0] is None:
                parsed[j] = _numbers_among_text(columns[j], table.data[j], missing_values, notes) or parsed[j]
    keep = np.ones(table.n_rows, dtype=bool)
    if missing == "drop":
        for _, is_missing in parsed.values():
            keep &= ~is_missing
    label_values, ids = label_values[keep], ids[keep]
    if not keep.any():
        raise ValueError(f"dataset {name!r}: no rows")

    names: list[str] = []
    blocks: list[np.ndarray] = []
    coded: list[str] = []
    for j in feature_at:
        floats = parsed.pop(j)[0]  # each column's floats live until its block does
        col_names, block = _encode_column(columns[j], table.data[j], floats, keep, categorical, missing_values, notes)
        names += col_names
        blocks.append(block)
        if categorical == "ordinal" and floats is None:
            coded.append(columns[j])
    class_names, y = _codes(label_values)
    return Dataset(name, ids, np.hstack(blocks), y, names, class_names, coded, notes if strict else [])


def _check_label(name: str, values: np.ndarray, given: bool) -> None:
    """A label vflsec can classify: not a continuous number, not hundreds of classes."""
    distinct = np.unique(values)
    numbers = _parse_numeric(distinct, np.zeros(len(distinct), dtype=bool))
    continuous = numbers is not None and len(distinct) > NOTE_LEVELS and bool((numbers != np.round(numbers)).any())
    if continuous or len(distinct) > MAX_CLASSES:
        which = f"label column {name!r}" + ("" if given else " (the last column: no --label was given)")
        kind = "non-integer numbers, a continuous target" if continuous else "values, too many to be classes"
        raise ValueError(
            f"{which} holds {len(distinct)} distinct {kind}; vflsec trains classifiers: name a class column "
            "with --label (or bin this one into classes in the file)"
        )


def _numbers_among_text(
    name: str, column: pa.ChunkedArray, missing_values: Sequence[str], notes: list[str]
) -> tuple[np.ndarray, np.ndarray] | None:
    """A column that failed to parse as numbers: None when it is text (a category), refused when it is free text;
    when only a few cells are text among numbers, the column's floats if every such cell spells "not available"
    (read as missing, noted), else refused naming the column and the cells."""
    values, index = _strings(column)
    missing = np.isin(values, list(missing_values))
    parsed = np.array([_float_or_none(v) for v in values], dtype=object)
    text = ~missing & np.array([p is None for p in parsed])
    counts = np.bincount(index, minlength=len(values))
    n_text, n_numbers = int(counts[text].sum()), int(counts[~text & ~missing].sum())
    if n_numbers <= n_text:  # a text column
        if int((~missing).sum()) > MAX_LEVELS:
            raise ValueError(
                f"column {name!r} holds {int((~missing).sum())} distinct text values in {len(index)} rows: free "
                f"text or IDs, not a category (at most {MAX_LEVELS}); remove the column from the file"
            )
        return None
    stray = sorted(values[text].tolist())
    if all(v.strip().lower() in NA_SPELLINGS for v in stray):
        floats = np.array([np.nan if p is None else p for p in parsed], dtype=np.float64)[index]
        floats[~np.isfinite(floats)] = np.nan
        notes.append(f"column {name!r}: {n_text} cell(s) spelled {', '.join(map(repr, stray))} read as missing")
        return floats, (text | missing)[index]
    rows = np.flatnonzero(text[index])[:3].tolist()
    raise ValueError(
        f"column {name!r} is numeric but for {n_text} cell(s) {', '.join(map(repr, stray[:3]))} (data rows "
        f"{', '.join(str(r + 1) for r in rows)}{', ...' if n_text > 3 else ''}): fix them in the file, or leave "
        f"them empty or '?' to mark them missing"
    )


def _float_or_none(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def target_encode(ds: Dataset, fit_rows: np.ndarray | Sequence[int]) -> Dataset:
    """The papers' target encoding of an ordinally coded dataset: each category code becomes the mean class
    index of the rows ``fit_rows`` in that category (for two classes: the share of class 1). A category absent
    from ``fit_rows`` gets their overall mean. Numeric columns are unchanged.

    It reads labels, so only a dealer who saw them may apply it (before the columns are dealt out).
    """
    fit_rows = np.asarray(fit_rows, dtype=np.int64)
    if not fit_rows.size:
        raise ValueError("target encoding needs at least one row to fit on")
    X = ds.X.copy()
    y = ds.y[fit_rows].astype(np.float64)
    for j in ds.column_indices(ds.categorical):
        codes = ds.X[:, j].astype(np.int64)
        sums = np.bincount(codes[fit_rows], weights=y, minlength=codes.max() + 1)
        counts = np.bincount(codes[fit_rows], minlength=codes.max() + 1)
        means = np.where(counts > 0, sums / np.maximum(counts, 1), y.mean())
        X[:, j] = means[codes]
    return Dataset(ds.name, ds.ids, X, ds.y, list(ds.feature_names), list(ds.class_names), [])


# ---------------------------------------------------------------------------------------- CSV reading


def _sniff_delimiter(path: Path) -> str:
    """The most frequent of ``;``, ``,``, tab on the first non-blank line; whitespace if none occurs."""
    with path.open(encoding="utf-8-sig", newline="") as fh:
        first = next((line for line in fh if line.strip()), "")
    counts = {d: first.count(d) for d in (";", ",", "\t")}
    best = max(counts, key=lambda d: counts[d])
    return best if counts[best] else WHITESPACE


def _iter_records(path: Path, delimiter: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, stripped cells) of every non-blank record; quoting as in the csv module."""
    with path.open(encoding="utf-8-sig", newline="") as fh:
        numbered: Iterable[tuple[int, list[str]]]
        if delimiter == WHITESPACE:
            numbered = enumerate((line.split() for line in fh), start=1)
        else:
            reader = csv.reader(fh, delimiter=delimiter, skipinitialspace=True)
            numbered = ((reader.line_num, record) for record in reader)
        for number, record in numbered:
            cells = [c.strip() for c in record]
            if any(cells):
                yield number, cells


def _looks_like_header(cells: Sequence[str]) -> bool:
    """For all-numeric files: a first line whose first cell is not a number is a header."""
    return _category_key(cells[0])[0] != 0


def _arrow_cells(path: Path, delimiter: str, skip_rows: int, n_columns: int) -> list[pa.ChunkedArray] | None:
    """The file's records after its first ``skip_rows`` lines, as stripped Arrow strings (pyarrow's
    multi-threaded reader), blank records left out; None where Arrow's dialect parts from the csv module's (a
    ragged or unparsable row, a quote after spaces): the caller reads that file with the csv module, which
    also names the offending line."""
    pa, pc, pcsv = _arrow()
    names = [f"c{j}" for j in range(n_columns)]
    try:
        cells = pcsv.read_csv(
            path,
            read_options=pcsv.ReadOptions(column_names=names, skip_rows=skip_rows),
            parse_options=pcsv.ParseOptions(delimiter=delimiter),
            convert_options=pcsv.ConvertOptions(
                column_types=dict.fromkeys(names, pa.string()), strings_can_be_null=False
            ),
        ).columns
    except (pa.ArrowInvalid, UnicodeDecodeError):
        return None
    quoted = [c for c in cells if pc.any(pc.match_substring(c, '"')).as_py()]
    if any(pc.any(pc.match_substring_regex(c, r'^\s+"')).as_py() for c in quoted):
        return None  # the csv module's skipinitialspace opens a quote after spaces; Arrow keeps it as text
    # Stripped as the csv-module reader strips (str.strip: Unicode whitespace too, e.g. a no-break space).
    cells = [pc.utf8_trim_whitespace(c) for c in cells]
    blank = functools.reduce(pc.and_, [pc.equal(c, "") for c in cells])
    return [c.filter(pc.invert(blank)) for c in cells] if pc.any(blank).as_py() else cells


def _read_table(
    paths: Sequence[Path],
    *,
    delimiter: str | None,
    header: bool | None,
    column_names: Sequence[str] | None,
    skip_lines: Sequence[int] = (),
) -> _Table:
    """Read files of one layout into a table. ``header=None`` detects it (see :func:`_looks_like_header`).

    With ``column_names`` given, a header line (if any) is skipped and the names are used instead. The csv module
    reads each file's first record (names, header detection); Arrow the rest, except in whitespace-separated
    files and where :func:`_arrow_cells` declines, which the csv module reads whole.
    """
    pa = _arrow()[0]
    if not paths:
        raise ValueError("no files to read")
    columns: list[str] | None = list(column_names) if column_names is not None else None
    parts: list[list[pa.ChunkedArray]] = []
    for i, path in enumerate(paths):
        sep = delimiter if delimiter is not None else _sniff_delimiter(path)
        records = _iter_records(path, sep)
        skip = skip_lines[i] if i < len(skip_lines) else 0
        records = itertools.islice(records, skip, None)
        first = next(records, None)
        if first is None:
            raise ValueError(f"{path}: no data")
        has_header = _looks_like_header(first[1]) if header is None else header
        if columns is None:
            columns = first[1] if has_header else [f"c{j}" for j in range(len(first[1]))]
        elif has_header and column_names is None and first[1] != columns:
            raise ValueError(f"{path}: header {first[1]} differs from {columns}")
        cells = None if sep == WHITESPACE else _arrow_cells(path, sep, first[0] - (not has_header), len(columns))
        if cells is None:
            if not has_header:
                records = itertools.chain([first], records)
            rows: list[list[str]] = []
            for number, record in records:
                if len(record) != len(columns):
                    raise ValueError(f"{path}:{number}: {len(record)} fields, expected {len(columns)}")
                rows.append(record)
            matrix = np.array(rows, dtype=str).reshape(len(rows), len(columns))
            cells = [pa.chunked_array([pa.array(matrix[:, j], pa.string())]) for j in range(len(columns))]
        parts.append(cells)
    assert columns is not None  # set while reading the first path
    _require_unique(columns, "column names")
    return _Table(columns, [pa.chunked_array([c for part in parts for c in part[j].chunks], pa.string())
                            for j in range(len(columns))])  # fmt: skip


def _read_parquet(path: Path) -> _Table:
    """A Parquet file's columns: numbers stay typed (a null is missing), anything else becomes stripped text (a null
    feature cell reads as ``""``)."""
    pa, pc, _ = _arrow()
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    _require_unique(table.column_names, "column names")
    data = [
        c if pa.types.is_integer(c.type) or pa.types.is_floating(c.type)
        else pc.utf8_trim_whitespace(pc.cast(c, pa.string()))  # a null stays null: a label or ID may not be one
        for c in table.columns
    ]  # fmt: skip
    return _Table(list(table.column_names), data)


def load_csv(
    path: str | os.PathLike[str],
    label: ColumnRef,
    *,
    id_column: ColumnRef | None = None,
    drop: Sequence[ColumnRef] = (),
    categorical: CategoricalEncoding = "onehot",
    name: str | None = None,
    delimiter: str | None = None,
    header: bool = True,
    column_names: Sequence[str] | None = None,
    missing: MissingPolicy = "impute",
    missing_values: Sequence[str] = DEFAULT_MISSING_VALUES,
    label_given: bool = True,
) -> Dataset:
    """Load a delimited text file, or a Parquet file (``.parquet``; its own column names and types, the reading
    options do not apply); encoding and missing-value rules are in the module docstring.

    ``label``, ``id_column`` and ``drop`` take column names or 0-based indices (negative ones count from
    the end). ``delimiter=None`` picks ``;``, ``,`` or tab from the first line, else whitespace; pass
    :data:`WHITESPACE` for whitespace-separated files. Without a header, columns are named ``c0, c1, ...``
    unless ``column_names`` is given.
    """
    path = Path(path)
    if path.suffix == ".parquet":
        table = _read_parquet(path)
    else:
        table = _read_table([path], delimiter=delimiter, header=header, column_names=column_names)
    ds = _encode_table(
        name or path.stem,
        table,
        label,
        id_column=id_column,
        drop=drop,
        categorical=categorical,
        missing=missing,
        missing_values=missing_values,
        strict=True,
        label_given=label_given,
    )
    del table
    release_freed_memory()
    return ds


def release_freed_memory() -> None:
    """Hand the memory freed after loading back to the OS: Arrow's pool keeps freed cells (300 MB at 1M x 20), and
    glibc's heap keeps the holes numpy's large temporaries left (a passive party's 1M-row shard left ~170 MB)."""
    _arrow()[0].default_memory_pool().release_unused()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


# ------------------------------------------------------------------------------- built-in datasets


def _load_sklearn(name: str) -> Dataset:
    from sklearn import datasets as skd  # imported lazily: sklearn takes a while to import

    loaders = {
        "breast_cancer": skd.load_breast_cancer,
        "wine": skd.load_wine,
        "digits": skd.load_digits,
        "iris": skd.load_iris,
    }
    bunch = loaders[name]()
    n = bunch.data.shape[0]
    return Dataset(
        name,
        _row_ids(n),
        bunch.data,
        bunch.target,
        list(bunch.feature_names),
        [str(c) for c in bunch.target_names],
    )


_SKLEARN_DATASETS: dict[str, str] = {
    "breast_cancer": "Wisconsin diagnostic breast cancer (scikit-learn): 569 x 30, 2 classes",
    "wine": "Wine recognition (scikit-learn): 178 x 13, 3 classes",
    "digits": "8x8 handwritten digits (scikit-learn): 1797 x 64, 10 classes",
    "iris": "Iris (scikit-learn): 150 x 4, 3 classes",
}


@dataclass(frozen=True)
class _UciSpec:
    """How one dataset in ``shared/datasets`` is stored (see its PROVENANCE.md)."""

    folder: str
    files: tuple[str, ...]
    description: str
    label: ColumnRef
    delimiter: str
    header: bool | None  # None: detect (the robot file has a header line added by its uploader)
    column_names: tuple[str, ...] | None = None
    skip_lines: tuple[int, ...] = ()
    drop: tuple[str, ...] = ()
    id_column: str | None = None
    label_suffix: str = ""


_ADULT_COLUMNS = (
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "education-num",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "capital-gain",
    "capital-loss",
    "hours-per-week",
    "native-country",
    "income",
)
# sat.doc: per pixel of the 3x3 neighbourhood (row by row) its four spectral bands.
_SATELLITE_COLUMNS = (*(f"px{p}_band{b}" for p in range(1, 10) for b in range(1, 5)), "class")
# pendigits.names: 8 resampled (x, y) pen positions.
_PENDIGITS_COLUMNS = (*(f"{axis}{k}" for k in range(1, 9) for axis in "xy"), "digit")
_ROBOT_COLUMNS = (*(f"S{k}" for k in range(1, 25)), "class")
_NURSERY_COLUMNS = (
    "parents",
    "has_nurs",
    "form",
    "children",
    "housing",
    "finance",
    "social",
    "health",
    "class",
)

_UCI_DATASETS: dict[str, _UciSpec] = {
    "bank": _UciSpec(
        "bank_marketing",
        ("bank-additional-full.csv",),
        "Bank marketing (UCI, bank-additional-full): 41188 rows, 19 features (duration dropped), 2 classes",
        label="y",
        delimiter=";",
        header=True,
        drop=("duration",),
    ),
    "credit": _UciSpec(
        "default_credit_card_clients",
        ("UCI_Credit_Card.csv",),
        "Default of credit card clients (UCI/Kaggle): 30000 rows, 23 features, 2 classes",
        label="default.payment.next.month",
        delimiter=",",
        header=True,
        id_column="ID",
    ),
    "adult": _UciSpec(
        "adult",
        ("adult.data", "adult.test"),
        "Adult census income (UCI, train+test): 48842 rows, 14 features, 2 classes",
        label="income",
        delimiter=",",
        header=False,
        column_names=_ADULT_COLUMNS,
        skip_lines=(0, 1),
        label_suffix=".",
    ),
    "satellite": _UciSpec(
        "statlog_landsat_satellite",
        ("sat.trn", "sat.tst"),
        "Statlog Landsat satellite (UCI, train+test): 6435 rows, 36 features, 6 classes",
        label="class",
        delimiter=WHITESPACE,
        header=False,
        column_names=_SATELLITE_COLUMNS,
    ),
    "pendigits": _UciSpec(
        "pendigits",
        ("pendigits.tra", "pendigits.tes"),
        "Pen-based handwritten digits (UCI, train+test): 10992 rows, 16 features, 10 classes",
        label="digit",
        delimiter=",",
        header=False,
        column_names=_PENDIGITS_COLUMNS,
    ),
    "robot": _UciSpec(
        "wall_following_robot",
        ("sensor_readings_24.data",),
        "Wall-following robot navigation (UCI): 5456 rows, 24 features, 4 classes",
        label="class",
        delimiter=",",
        header=None,
        column_names=_ROBOT_COLUMNS,
    ),
    "grid": _UciSpec(
        "electrical_grid_stability",
        ("Data_for_UCI_named.csv",),
        "Electrical grid stability (UCI): 10000 rows, 12 features (stab dropped), 2 classes",
        label="stabf",
        delimiter=",",
        header=True,
        drop=("stab",),
    ),
    "nursery": _UciSpec(
        "nursery",
        ("nursery.data",),
        "Nursery (UCI): 12960 rows, 8 categorical features, 5 classes",
        label="class",
        delimiter=",",
        header=False,
        column_names=_NURSERY_COLUMNS,
    ),
    "covid": _UciSpec(
        "covid_symptoms",
        ("Covid Dataset.csv",),
        "Symptoms and COVID presence (Kaggle): 5434 rows, 20 binary features, 2 classes",
        label="COVID-19",
        delimiter=",",
        header=True,
    ),
}


def _dataset_dir_candidates() -> list[Path]:
    """Where the shared datasets may be; an explicit environment variable is the only candidate."""
    override = os.environ.get(DATASETS_ENV_VAR)
    if override:
        return [Path(override).expanduser()]
    repo_root = Path(__file__).resolve().parents[1]
    return [repo_root.parent / "shared" / "datasets", Path.cwd().parent / "shared" / "datasets"]


def shared_datasets_dir() -> Path | None:
    """The shared datasets folder: ``$VFLSEC_DATASETS`` if set, else ``../shared/datasets`` next to the
    repository or the working directory; None when absent."""
    return next((p for p in _dataset_dir_candidates() if p.is_dir()), None)


def _find_uci_files(spec: _UciSpec, roots: Sequence[Path]) -> list[Path] | None:
    """The dataset's files under the first root that holds all of them."""
    for root in roots:
        paths = [root / spec.folder / f for f in spec.files]
        if all(p.is_file() for p in paths):
            return paths
    return None


def load_uci(
    name: str,
    *,
    categorical: CategoricalEncoding = "onehot",
    missing: MissingPolicy = "impute",
    root: str | os.PathLike[str] | None = None,
) -> Dataset:
    """Load one of the raw UCI datasets (see :data:`UCI_DATASET_NAMES`) from ``root`` or the shared folder."""
    if name not in _UCI_DATASETS:
        raise KeyError(f"unknown UCI dataset {name!r}; known: {sorted(_UCI_DATASETS)}")
    spec = _UCI_DATASETS[name]
    roots = [Path(root)] if root is not None else _dataset_dir_candidates()
    paths = _find_uci_files(spec, roots)
    if paths is None:
        searched = ", ".join(str(r / spec.folder) for r in roots)
        raise FileNotFoundError(
            f"dataset {name!r} needs {', '.join(spec.files)}; searched: {searched} "
            f"(set {DATASETS_ENV_VAR} to the shared datasets folder)"
        )
    table = _read_table(
        paths,
        delimiter=spec.delimiter,
        header=spec.header,
        column_names=spec.column_names,
        skip_lines=spec.skip_lines,
    )
    return _encode_table(
        name,
        table,
        spec.label,
        id_column=spec.id_column,
        drop=spec.drop,
        categorical=categorical,
        missing=missing,
        missing_values=DEFAULT_MISSING_VALUES,
        label_suffix=spec.label_suffix,
    )


SKLEARN_DATASET_NAMES: tuple[str, ...] = tuple(_SKLEARN_DATASETS)
UCI_DATASET_NAMES: tuple[str, ...] = tuple(_UCI_DATASETS)


def available_datasets() -> dict[str, str]:
    """Built-in dataset name -> one-line description; UCI datasets only when their files are present."""
    roots = _dataset_dir_candidates()
    uci = {n: s.description for n, s in _UCI_DATASETS.items() if _find_uci_files(s, roots) is not None}
    return {**_SKLEARN_DATASETS, **uci}


def load_dataset(
    name_or_path: str, *, label: ColumnRef | None = None, categorical: CategoricalEncoding = "onehot"
) -> Dataset:
    """A built-in dataset by name, or a CSV file by path (``label`` defaults to its last column)."""
    if name_or_path in _SKLEARN_DATASETS:
        return _load_sklearn(name_or_path)
    if name_or_path in _UCI_DATASETS:
        return load_uci(name_or_path, categorical=categorical)
    path = Path(name_or_path)
    if path.is_file():
        return load_csv(path, -1 if label is None else label, categorical=categorical, label_given=label is not None)
    raise ValueError(
        f"{name_or_path!r} is neither a built-in dataset ({', '.join([*_SKLEARN_DATASETS, *_UCI_DATASETS])})"
        " nor an existing file"
    )


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


# -------------------------------------------------------------------------------- party data files


@dataclass
class PartyData:
    """One party's rows: its sample IDs, its feature columns and (active party only) the labels."""

    ids: np.ndarray
    X: np.ndarray
    columns: list[str]
    y: np.ndarray | None = None
    class_names: list[str] | None = field(default=None)

    def __post_init__(self) -> None:
        self.ids = np.asarray(self.ids).astype(str).reshape(-1)
        self.columns = [str(c) for c in self.columns]
        shape = (len(self.ids), len(self.columns))
        X = np.asarray(self.X, dtype=np.float64)
        self.X = X.reshape(shape) if X.size == 0 else X
        if self.X.shape != shape:
            raise ValueError(f"party features have shape {self.X.shape}, expected {shape}")
        _require_unique(self.ids, "party sample ids")
        _require_unique(self.columns, "party columns")
        if not np.isfinite(self.X).all():
            raise ValueError("party features contain NaN or infinite values")
        if self.y is None:
            return
        self.y = np.asarray(self.y).reshape(-1)
        if self.y.shape != self.ids.shape:
            raise ValueError(f"{self.y.shape[0]} labels for {self.ids.shape[0]} rows")
        n_classes = len(self.class_names) if self.class_names else int(self.y.max(initial=-1)) + 1
        self.y = _as_class_indices(self.y, max(n_classes, 1), "party labels")

    @property
    def n_samples(self) -> int:
        return int(self.X.shape[0])


def write_party_csv(
    path: str | os.PathLike[str],
    ids: Sequence[str] | np.ndarray,
    X: np.ndarray,
    columns: Sequence[str],
    labels: Sequence[int] | np.ndarray | None = None,
    class_names: Sequence[str] | None = None,
) -> None:
    """Write ``id,<columns...>[,label]`` (labels as class indices, floats at full precision).

    With ``class_names``, a first line ``# classes: [...]`` (JSON) records the class order and count, which
    the rows alone cannot (a class may be absent from a party's rows). The file is replaced atomically.
    """
    write_party_csv_chunks(path, columns, [(ids, X, labels)], class_names)


def write_party_csv_chunks(
    path: str | os.PathLike[str],
    columns: Sequence[str],
    chunks: Iterable[tuple[Sequence[str] | np.ndarray, np.ndarray, Sequence[int] | np.ndarray | None]],
    class_names: Sequence[str] | None = None,
) -> None:
    """:func:`write_party_csv` with the rows arriving as ``(ids, X, labels)`` chunks, so a file larger than
    memory can be written (``bench scale``'s synthetic million rows, the dealer's shards) one chunk at a time.
    Each chunk is checked as a whole file would be (ID uniqueness within the chunk); every chunk has labels or
    none does. A path ending in ``.parquet`` gets a Parquet file (the class names in its metadata)."""
    pa, pc, pcsv = _arrow()
    reserved = {_PARTY_ID_COLUMN, _PARTY_LABEL_COLUMN} & {str(c) for c in columns}
    if reserved:
        raise ValueError(f"column names {sorted(reserved)} are reserved in party data files")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    parquet = path.suffix == ".parquet"
    with tmp.open("wb") as fh, contextlib.ExitStack() as stack:
        if class_names is not None and not parquet:
            fh.write((_CLASSES_COMMENT + json.dumps([str(c) for c in class_names]) + "\n").encode())
        labelled: bool | None = None
        for ids, X, labels in chunks:
            data = PartyData(
                np.asarray(ids),
                X,
                list(columns),
                None if labels is None else np.asarray(labels),
                None if class_names is None else list(class_names),
            )
            if labelled is None:
                labelled = data.y is not None
                names = [_PARTY_ID_COLUMN, *data.columns, *([_PARTY_LABEL_COLUMN] if labelled else [])]
                if parquet:
                    import pyarrow.parquet as pq

                    meta = None if class_names is None else {"vflsec.classes": json.dumps(data.class_names)}
                    schema = pa.schema(
                        [(_PARTY_ID_COLUMN, pa.string()), *((c, pa.float64()) for c in data.columns)]
                        + ([(_PARTY_LABEL_COLUMN, pa.int64())] if labelled else []),
                        metadata=meta,
                    )
                    parquet_writer = stack.enter_context(pq.ParquetWriter(fh, schema))
                else:
                    header = io.StringIO()
                    csv.writer(header, lineterminator="\n").writerow(names)
                    fh.write(header.getvalue().encode())
            elif labelled != (data.y is not None):
                raise ValueError("every chunk of a party file has labels, or none does")
            table = pa.table(
                [pa.array(data.ids, pa.string()), *data.X.T, *([data.y] if labelled else [])],
                names=[_PARTY_ID_COLUMN, *(f"x{j}" for j in range(len(data.columns))), _PARTY_LABEL_COLUMN][
                    : 1 + len(data.columns) + bool(labelled)
                ],
            )
            if parquet:
                parquet_writer.write_table(table.rename_columns(parquet_writer.schema.names))
                continue
            # Arrow writes the shortest decimal that reads back to the same double; IDs are quoted only if they
            # must be (Arrow's "needed" quotes every string).
            special = pc.any(pc.match_substring_regex(table.column(0), '[",\\r\\n]')).as_py()
            options = pcsv.WriteOptions(include_header=False, quoting_style="needed" if special else "none")
            pcsv.write_csv(table, fh, options)
    os.replace(tmp, path)


def read_party_csv(path: str | os.PathLike[str]) -> PartyData:
    """Read a file written by :func:`write_party_csv` (or a ``.parquet`` one of :func:`write_party_csv_chunks`).

    pyarrow's multi-threaded reader parses the columns straight into typed arrays (IDs as exact strings,
    features as doubles, labels as integers): no Python object per row, which took gigabytes at a million rows.
    """
    pa, _, pcsv = _arrow()
    path = Path(path)
    if path.suffix == ".parquet":
        return _read_party_parquet(path)
    with path.open(encoding="utf-8", newline="") as fh:
        first = fh.readline()
        class_names: list[str] | None = None
        skip = 1
        if first.startswith(_CLASSES_COMMENT):
            class_names = [str(c) for c in json.loads(first[len(_CLASSES_COMMENT) :])]
            first, skip = fh.readline(), 2
    header = next(csv.reader([first]), [])
    if not header or header[0] != _PARTY_ID_COLUMN:
        raise ValueError(f"{path}: not a party data file (header must start with {_PARTY_ID_COLUMN!r})")
    has_label = header[-1] == _PARTY_LABEL_COLUMN
    columns = header[1:-1] if has_label else header[1:]
    types = {"id": pa.string(), **{f"x{j}": pa.float64() for j in range(len(columns))}}
    if has_label:
        types["label"] = pa.int64()
    try:
        table = pcsv.read_csv(
            path,
            read_options=pcsv.ReadOptions(column_names=list(types), skip_rows=skip),
            convert_options=pcsv.ConvertOptions(column_types=types, null_values=[], strings_can_be_null=False),
        )
    except pa.ArrowInvalid as exc:
        raise ValueError(f"{path}: {exc}") from exc
    try:
        return _party_data(table, columns, has_label, class_names)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    finally:
        del table
        release_freed_memory()


def _read_party_parquet(path: Path) -> PartyData:
    import pyarrow.parquet as pq

    pa = _arrow()[0]

    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise ValueError(f"{path}: {exc}") from exc
    names = table.column_names
    if not names or names[0] != _PARTY_ID_COLUMN:
        raise ValueError(f"{path}: not a party data file (first column must be {_PARTY_ID_COLUMN!r})")
    meta = table.schema.metadata or {}
    classes = meta.get(b"vflsec.classes")
    has_label = names[-1] == _PARTY_LABEL_COLUMN
    try:
        table = table.cast(pa.schema([(n, pa.string() if n == _PARTY_ID_COLUMN else f.type) for n, f in
                                      zip(names, table.schema, strict=True)]))  # fmt: skip
    except pa.ArrowInvalid as exc:
        raise ValueError(f"{path}: {exc}") from exc
    columns = names[1:-1] if has_label else names[1:]
    try:
        return _party_data(table, columns, has_label, None if classes is None else json.loads(classes))
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    finally:
        del table
        release_freed_memory()


def _nulls(column: pa.ChunkedArray) -> np.ndarray:
    """Which rows of a column are null (a Parquet file's missing cell)."""
    return np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=bool)


def _first_rows(rows: np.ndarray) -> str:
    """'rows [2, 7] (0-based)', the first five of the rows marked, and how many there are in all."""
    marked = np.flatnonzero(rows)
    more = f" ({len(marked)} in all)" if len(marked) > 5 else ""
    return f"rows {marked[:5].tolist()}{more} (0-based data rows)"


def _party_data(table: pa.Table, columns: list[str], has_label: bool, class_names: list[str] | None) -> PartyData:
    """A party file's table as PartyData; a null or empty ID, or a null label, is a ValueError naming the column
    and the first rows that hold one."""
    n = table.num_rows
    ids = _str_array(table.column(0))
    if (blank := _nulls(table.column(0)) | (ids == "")).any():
        raise ValueError(f"ID column {_PARTY_ID_COLUMN!r} is empty in {_first_rows(blank)}")
    if has_label and (missing := _nulls(table.column(table.num_columns - 1))).any():
        raise ValueError(f"label column {_PARTY_LABEL_COLUMN!r} is empty in {_first_rows(missing)}")
    X = np.empty((n, len(columns)))
    for j in range(len(columns)):
        X[:, j] = table.column(1 + j).to_numpy()
    labels = table.column(table.num_columns - 1).to_numpy() if has_label else None
    return PartyData(ids, X, columns, labels, class_names)


# ------------------------------------------------------------------------------------- sample IDs


class IdIndex:
    """Row positions of IDs within ``ids`` by a binary search over their sort order, which is computed once (no
    Python object per row): for lookups repeated against one large ID column."""

    def __init__(self, ids: Sequence[str] | np.ndarray) -> None:
        ids = np.asarray(ids)
        self.ids = ids if ids.dtype.kind == "U" else ids.astype(str)  # a str array is kept, not copied
        self._order = np.argsort(self.ids, kind="stable")

    def find(self, wanted: Sequence[str] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rows, found) for each of ``wanted``, in its order; a row is meaningful only where ``found``."""
        wanted = np.asarray(wanted).astype(str).reshape(-1)
        if not len(self.ids):
            return np.zeros(len(wanted), dtype=np.int64), np.zeros(len(wanted), dtype=bool)
        rows = self._order[np.minimum(np.searchsorted(self.ids, wanted, sorter=self._order), len(self.ids) - 1)]
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
