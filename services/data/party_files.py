"""The party data files: one party's rows (IDs, its columns, the active party's labels) written and read back as
CSV or Parquet."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

from .encoding import _str_array
from .readers import release_freed_memory
from .tables import _arrow, _as_class_indices, _first_rows, _nulls, _require_unique

_PARTY_ID_COLUMN = "id"
_PARTY_LABEL_COLUMN = "label"
_CLASSES_COMMENT = "# classes: "


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
