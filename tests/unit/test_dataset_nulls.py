"""A null (Parquet) or empty (CSV) cell in the label or ID column is a ValueError naming the column and the first
rows that hold one, when a dataset or a party's shard is loaded (it was an IndexError, or an ID of "")."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vflsec.services.data import datasets


def _parquet(path: Path, **columns: list) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def test_a_null_label_in_a_parquet_dataset_names_the_column_and_its_rows(tmp_path: Path) -> None:
    path = _parquet(tmp_path / "d.parquet", x=[1.0, 2.0, 3.0, 4.0] * 3, y=[0, 1, None, 1] * 3)
    with pytest.raises(ValueError, match=r"label 'y' missing in rows \[2, 6, 10\]"):
        datasets.load_csv(path, label="y")


def test_a_null_label_is_missing_whatever_the_missing_values(tmp_path: Path) -> None:
    path = _parquet(tmp_path / "d.parquet", x=[1.0, 2.0, 3.0], y=["a", None, "b"])
    with pytest.raises(ValueError, match=r"label 'y' missing in rows \[1\]"):
        datasets.load_csv(path, label="y", missing_values=["?"])


def test_a_null_id_in_a_parquet_dataset_names_the_column_and_its_rows(tmp_path: Path) -> None:
    ids = [f"r{i}" if i % 4 != 3 else None for i in range(28)]
    path = _parquet(tmp_path / "d.parquet", id=ids, x=[float(i) for i in range(28)], y=[i % 2 for i in range(28)])
    with pytest.raises(ValueError, match=r"ID column 'id' is empty in rows \[3, 7, 11, 15, 19\] \(7 in all\)"):
        datasets.load_csv(path, label="y", id_column="id")


def test_an_empty_id_in_a_csv_dataset_names_its_row(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("id,x,y\na,1,0\n,2,1\nc,3,1\n")
    with pytest.raises(ValueError, match=r"ID column 'id' is empty in rows \[1\]"):
        datasets.load_csv(path, label="y", id_column="id")


def test_party_shards_refuse_a_null_id_or_label(tmp_path: Path) -> None:
    null_id = _parquet(tmp_path / "a.parquet", id=["a", None, "c"], x0=[1.0, 2.0, 3.0], label=[0, 1, 0])
    with pytest.raises(ValueError, match=r"a\.parquet: ID column 'id' is empty in rows \[1\]"):
        datasets.read_party_csv(null_id)
    null_label = _parquet(tmp_path / "b.parquet", id=["a", "b", "c"], x0=[1.0, 2.0, 3.0], label=[0, 1, None])
    with pytest.raises(ValueError, match=r"b\.parquet: label column 'label' is empty in rows \[2\]"):
        datasets.read_party_csv(null_label)
    csv = tmp_path / "c.csv"
    csv.write_text("id,x0\na,1\n,2\n")
    with pytest.raises(ValueError, match=r"c\.csv: ID column 'id' is empty in rows \[1\]"):
        datasets.read_party_csv(csv)


def test_complete_files_still_load(tmp_path: Path) -> None:
    path = _parquet(tmp_path / "d.parquet", id=["a", "b", "c"], x=[1.0, 2.0, 3.0], y=[0, 1, 0])
    ds = datasets.load_csv(path, label="y", id_column="id")
    assert list(ds.ids) == ["a", "b", "c"] and list(ds.y) == [0, 1, 0]
