"""Party data files written and read in chunks (bench scale's million-row shards) are the same files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vflsec.services.data import datasets as D


def test_chunked_write_is_the_single_write_and_reads_back(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    ids = np.array([f"s{i}" for i in range(23)])
    X = rng.normal(size=(23, 3)) * np.array([1e-9, 1.0, 1e12])
    y = rng.integers(0, 3, size=23)
    whole, chunked = tmp_path / "whole.csv", tmp_path / "chunked.csv"
    D.write_party_csv(whole, ids, X, ["a", "b", "c"], labels=y, class_names=["x", "y", "z"])
    bounds = [(0, 5), (5, 6), (6, 23)]
    D.write_party_csv_chunks(
        chunked, ["a", "b", "c"], ((ids[i:j], X[i:j], y[i:j]) for i, j in bounds), class_names=["x", "y", "z"]
    )
    assert chunked.read_bytes() == whole.read_bytes()
    data = D.read_party_csv(chunked)
    assert data.ids.tolist() == ids.tolist() and data.columns == ["a", "b", "c"]
    np.testing.assert_array_equal(data.X, X)
    assert data.y is not None and data.y.tolist() == y.tolist() and data.class_names == ["x", "y", "z"]
    lines = chunked.read_text().splitlines()
    lines[2 + 6] = "s6,1.0,2.0"  # the 7th data row (after the classes line and the header)
    chunked.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"Expected 5 columns, got 3: s6,1\.0,2\.0"):
        D.read_party_csv(chunked)


def test_chunks_agree_on_labels(tmp_path: Path) -> None:
    chunks = [(["a"], np.ones((1, 1)), [0]), (["b"], np.ones((1, 1)), None)]
    with pytest.raises(ValueError, match="every chunk"):
        D.write_party_csv_chunks(tmp_path / "mixed.csv", ["f"], chunks)
