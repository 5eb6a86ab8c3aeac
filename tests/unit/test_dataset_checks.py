"""Silent data handling made loud (issue 31, item 6): a user's CSV with stray text among numbers, a free-text column,
NaNs, a missing or continuous label gets a one-line error naming the column (exit 2) or a warning naming the column
and the treatment; never a traceback."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from vflsec.client.cli import app
from vflsec.services.data import datasets as D


def _csv(path: Path, header: str, rows: list[list[str]]) -> Path:
    path.write_text(header + "\n" + "\n".join(",".join(r) for r in rows) + "\n")
    return path


def _rows(n: int = 40) -> list[list[str]]:
    rng = np.random.default_rng(0)
    return [[f"{a:.3f}", f"{b:.3f}", "xyz"[i % 3], str(int(a > 5))]
            for i, (a, b) in enumerate(zip(rng.uniform(0, 10, n), rng.uniform(0, 1, n), strict=True))]  # fmt: skip


def _show(path: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["datasets", "show", str(path), *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def _one_line_error(code: int, output: str, *words: str) -> None:
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in output, output
    assert all(w in errors[0] for w in words), errors[0]


def test_a_clean_file_loads_without_notes(tmp_path) -> None:
    ds = D.load_csv(_csv(tmp_path / "ok.csv", "a,b,c,label", _rows()), -1)
    assert ds.notes == [] and ds.feature_names == ["a", "b", "c=x", "c=y", "c=z"]


def test_na_spellings_in_a_numeric_column_are_missing_and_said(tmp_path) -> None:
    rows = _rows()
    rows[3][0], rows[7][0] = "n/a", "N/A"
    ds = D.load_csv(_csv(tmp_path / "na.csv", "a,b,c,label", rows), -1)
    assert ds.feature_names[0] == "a" and len(ds.feature_names) == 5  # still one numeric column, not 40 one-hots
    observed = np.array([float(r[0]) for i, r in enumerate(rows) if i not in (3, 7)])
    assert np.allclose(ds.X[[3, 7], 0], observed.mean())
    assert any("'a'" in n and "'N/A', 'n/a'" in n and "read as missing" in n for n in ds.notes), ds.notes
    assert any("'a'" in n and "2 missing cell(s) imputed with its mean" in n for n in ds.notes), ds.notes
    code, output = _show(tmp_path / "na.csv")
    assert code == 0 and "warning: " in output and "column 'a': 2 cell(s) spelled" in output


def test_other_text_among_numbers_is_refused_naming_the_column_and_row(tmp_path) -> None:
    rows = _rows()
    rows[5][1] = "oops"
    path = _csv(tmp_path / "stray.csv", "a,b,c,label", rows)
    with pytest.raises(ValueError, match=r"column 'b' is numeric but for 1 cell\(s\) 'oops' \(data rows 6\)"):
        D.load_csv(path, -1)
    _one_line_error(*_show(path), "column 'b'", "'oops'")


def test_free_text_is_refused_and_many_categories_are_said(tmp_path) -> None:
    rows = [[*r[:2], f"free comment {i}", r[3]] for i, r in enumerate(_rows(120))]
    _one_line_error(*_show(_csv(tmp_path / "text.csv", "a,b,note,label", rows)), "column 'note'", "free text")
    rows = [[*r[:2], f"city{i % 30}", r[3]] for i, r in enumerate(_rows(120))]
    ds = D.load_csv(_csv(tmp_path / "cities.csv", "a,b,city,label", rows), -1)
    assert ds.notes == ["column 'city': text with 30 categories, one-hot encoded into 30 columns"]


def test_nans_are_imputed_and_said(tmp_path) -> None:
    rows = _rows()
    rows[2][1], rows[4][1] = "", "nan"
    ds = D.load_csv(_csv(tmp_path / "nans.csv", "a,b,c,label", rows), -1)
    assert ds.notes == [f"column 'b': 2 missing cell(s) imputed with its mean {ds.X[2, 1]:.4g}"]
    rows[2][2] = "?"
    ds = D.load_csv(_csv(tmp_path / "cat.csv", "a,b,c,label", rows), -1)
    assert "column 'c': 1 missing cell(s) kept as their own category <missing>" in ds.notes


def test_a_missing_or_continuous_label_is_a_one_line_error(tmp_path) -> None:
    path = _csv(tmp_path / "ok.csv", "a,b,c,label", _rows())
    _one_line_error(*_show(path, "--label", "target"), "label column 'target' not found", "a, b, c, label")
    rows = [[*r, f"{v:.2f}"] for r, v in zip(_rows(), np.linspace(1, 99, 40), strict=True)]
    cont = _csv(tmp_path / "cont.csv", "a,b,c,label,price", rows)
    _one_line_error(*_show(cont), "label column 'price'", "no --label was given", "continuous")
    code, output = _show(cont, "--label", "label")  # naming the class column is the fix
    assert code == 0, output
    result = CliRunner().invoke(app, ["attack", "--dataset", str(path), "--label", "target"])
    _one_line_error(result.exit_code, result.output, "label column 'target' not found")


def test_the_bundled_and_built_in_loaders_keep_their_behaviour() -> None:
    assert D.load_dataset("wine").notes == []  # scikit-learn's tables: nothing decided on the user's behalf
