"""The party data reader (pyarrow's typed columns, no Python object per row) keeps the csv module's meaning: IDs stay
exact strings, blank lines are skipped, a header-only file is an empty party, and a ragged row or a non-integer
label is an error naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from vflsec.services.data import datasets as D


def test_ids_stay_strings_and_blank_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text('id,f,label\n007,1.5,1\n\n"x,""y",2,0\n 8 ,-3e-9,1\n')
    data = D.read_party_csv(path)
    assert data.ids.tolist() == ["007", 'x,"y', " 8 "]
    assert data.X.tolist() == [[1.5], [2.0], [-3e-9]] and data.y is not None and data.y.tolist() == [1, 0, 1]


def test_header_only_file_is_an_empty_party(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text('# classes: ["no", "yes"]\nid,f,g\n')
    data = D.read_party_csv(path)
    assert data.ids.shape == (0,) and data.X.shape == (0, 2) and data.y is None and data.class_names == ["no", "yes"]


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("id,f\na,1\nb,1,3\n", "Expected 2 columns, got 3: b,1,3"),
        ("id,f\na,1\nb\n", "Expected 2 columns, got 1: b"),
        ("id,f,label\na,1,1.5\n", "column #2: CSV conversion error to int64: invalid value '1.5'"),
        ("id,f\na,abc\n", "column #1: CSV conversion error to double: invalid value 'abc'"),
    ],
)
def test_bad_rows_name_the_file_and_the_problem(tmp_path: Path, body: str, problem: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(ValueError, match=r"bad\.csv: ") as err:
        D.read_party_csv(path)
    assert problem in str(err.value)
