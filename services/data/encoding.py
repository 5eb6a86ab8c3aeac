"""Encodings: turning read columns into numeric features and class labels (see datasets.py, "Encoding rules"),
and target encoding at deal time."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

from .tables import (
    MAX_CLASSES,
    MAX_LEVELS,
    MISSING_CATEGORY,
    NA_SPELLINGS,
    NOTE_LEVELS,
    CategoricalEncoding,
    ColumnRef,
    Dataset,
    MissingPolicy,
    _arrow,
    _first_rows,
    _nulls,
    _row_ids,
)


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
