"""Columnar loading (pyarrow) keeps the csv module's encoding rules: the same dataset from Arrow's reader as from
the csv-module reader it replaced, on every shipped UCI file present and on a CSV with quotes, blanks and
categories; a Parquet file encodes as its CSV does; party shards round-trip through Parquet."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vflsec.services.data import datasets as D
from vflsec.services.data import readers


def _same(a: D.Dataset, b: D.Dataset) -> None:
    assert a.feature_names == b.feature_names and a.class_names == b.class_names and a.categorical == b.categorical
    assert a.ids.tolist() == b.ids.tolist() and a.y.tolist() == b.y.tolist()
    np.testing.assert_array_equal(a.X, b.X)


@pytest.fixture
def csv_module_only(monkeypatch: pytest.MonkeyPatch):
    """Load through the csv-module reader (Arrow declines every file)."""

    def load(loader, *args, **kwargs):  # type: ignore[no-untyped-def]
        with monkeypatch.context() as patched:
            patched.setattr(readers, "_arrow_cells", lambda *a: None)
            return loader(*args, **kwargs)

    return load


UCI_PRESENT = [n for n in D.UCI_DATASET_NAMES if n in D.available_datasets()]


@pytest.mark.skipif(not UCI_PRESENT, reason="shared/datasets not present")
@pytest.mark.parametrize("name", UCI_PRESENT)
def test_arrow_and_csv_module_agree_on_the_shipped_files(name: str, csv_module_only) -> None:
    for categorical, missing in (("onehot", "impute"), ("ordinal", "drop")):
        arrow = D.load_uci(name, categorical=categorical, missing=missing)
        _same(arrow, csv_module_only(D.load_uci, name, categorical=categorical, missing=missing))


# Quotes (a delimiter and a doubled quote inside), a quote after a space (the csv module's skipinitialspace),
# blank lines and an all-blank record, missing cells ("?", empty, spaces), a BOM, CRLF, categories that look
# like numbers among text ones (a text column: as many text cells as numbers, else it is refused as numeric with
# stray text) and a number only Python spells (1_000), an infinite cell, a numeric label.
EDGE = (
    "\ufeffid,amount,job,code,note,y\r\n"
    '1,1.5,"admin., clerk",10,"say ""hi""",1\r\n'
    '2,?,blue-collar,nine, "quoted after space",0\r\n'
    "\r\n"
    ",,,,,\r\n"
    "3, 2.25 ,?,1_000,plain,1\r\n"
    "4,inf,  ,ten,,0\r\n"
    "5,-3e-2,admin.,x,plain,1\r\n"
)


@pytest.mark.parametrize("categorical", ["onehot", "ordinal"])
@pytest.mark.parametrize("missing", ["impute", "drop"])
def test_arrow_and_csv_module_agree_on_quotes_blanks_and_categories(
    tmp_path: Path, csv_module_only, categorical: str, missing: str
) -> None:
    path = tmp_path / "edge.csv"
    path.write_bytes(EDGE.encode())
    kwargs = {"id_column": "id", "categorical": categorical, "missing": missing}
    arrow = D.load_csv(path, "y", **kwargs)
    _same(arrow, csv_module_only(D.load_csv, path, "y", **kwargs))
    if missing == "impute":
        assert arrow.ids.tolist() == ["1", "2", "3", "4", "5"]  # the all-blank record is no row
        assert any(n.startswith("note=") for n in arrow.feature_names) or "note" in arrow.categorical
        assert arrow.X[:, arrow.feature_names.index("amount")].tolist() == pytest.approx([1.5, 1.24, 2.25, 1.24, -0.03])


def test_a_file_arrow_reads_differently_falls_back_and_keeps_the_line_number(tmp_path: Path) -> None:
    path = tmp_path / "ragged.csv"
    path.write_text("a,b,y\n1,2,0\n3,4\n")
    with pytest.raises(ValueError, match=r"ragged\.csv:3: 2 fields, expected 3"):
        D.load_csv(path, "y")


def test_a_parquet_file_encodes_as_its_csv(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    n = 50
    amount = rng.normal(size=n).round(3)
    job = rng.choice(["admin.", "clerk", "blue-collar"], size=n)
    y = rng.integers(0, 2, size=n)
    lines = ["amount,job,y", *(f"{float(a)!r},{j},{c}" for a, j, c in zip(amount, job, y, strict=True))]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    missing_amount = pa.array([None if i == 7 else float(a) for i, a in enumerate(amount)], pa.float64())
    pq.write_table(pa.table({"amount": missing_amount, "job": job, "y": y}), tmp_path / "t.parquet")
    from_csv = D.load_csv(tmp_path / "t.csv", "y")
    from_parquet = D.load_csv(tmp_path / "t.parquet", "y")
    expected = from_csv.X.copy()
    expected[7, 0] = np.delete(amount, 7).mean()  # a Parquet null is a missing cell, imputed by the mean
    assert from_parquet.feature_names == from_csv.feature_names and from_parquet.class_names == ["0", "1"]
    np.testing.assert_allclose(from_parquet.X, expected)
    assert from_parquet.y.tolist() == from_csv.y.tolist() and from_parquet.ids.tolist() == from_csv.ids.tolist()
    assert D.load_dataset(str(tmp_path / "t.parquet"), label="y").n_samples == n


def test_party_shards_round_trip_through_parquet_and_csv(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    ids = np.array([f"s{i}" for i in range(40)] + ['x,"y'])
    X = rng.normal(size=(41, 3)) * np.array([1e-9, 1.0, 1e12])
    y = rng.integers(0, 3, size=41)
    chunks = [(ids[i : i + 10], X[i : i + 10], y[i : i + 10]) for i in range(0, 41, 10)]
    for name in ("p.csv", "p.parquet"):
        D.write_party_csv_chunks(tmp_path / name, ["a", "b", "c"], chunks, class_names=["lo", "mid", "hi"])
        data = D.read_party_csv(tmp_path / name)
        assert data.ids.tolist() == ids.tolist() and data.columns == ["a", "b", "c"]
        np.testing.assert_array_equal(data.X, X)  # exact doubles both ways
        assert data.y is not None and data.y.tolist() == y.tolist() and data.class_names == ["lo", "mid", "hi"]


def test_ids_beyond_ascii_come_back_exact(tmp_path: Path) -> None:
    ids = np.array(["client-é", "b", "ключ"])
    D.write_party_csv(tmp_path / "p.csv", ids, np.ones((3, 1)), ["f"])
    assert D.read_party_csv(tmp_path / "p.csv").ids.tolist() == ids.tolist()


def test_cells_padded_with_unicode_whitespace_are_stripped_as_the_csv_module_strips(
    tmp_path: Path, csv_module_only
) -> None:
    path = tmp_path / "nbsp.csv"
    path.write_text("id,c,y\n1,\xa0b,0\n2,b,1\n3,c\u2003,0\n4,b,1\n", encoding="utf-8")  # no ASCII padding
    arrow = D.load_csv(path, "y", id_column="id")
    _same(arrow, csv_module_only(D.load_csv, path, "y", id_column="id"))
    assert arrow.feature_names == ["c=c"] and arrow.X[:, 0].tolist() == [0.0, 0.0, 1.0, 0.0]  # one category b
