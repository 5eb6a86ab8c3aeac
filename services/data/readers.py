"""Readers: CSV (pyarrow's multi-threaded reader; the csv module for whitespace-separated files and each file's
first record) and Parquet files, as a user's own dataset through :func:`load_csv`."""

from __future__ import annotations

import contextlib
import csv
import ctypes
import functools
import itertools
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

from .encoding import _category_key, _encode_table, _Table
from .tables import (
    DEFAULT_MISSING_VALUES,
    WHITESPACE,
    CategoricalEncoding,
    ColumnRef,
    Dataset,
    MissingPolicy,
    _arrow,
    _require_unique,
)


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
