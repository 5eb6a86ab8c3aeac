"""Tests for vflsec.services.data.datasets: loaders, encoding rules, scaling, vertical splits, party files, IDs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vflsec.services.data import datasets as D

# ------------------------------------------------------------------------------------- built-ins


@pytest.mark.parametrize(
    ("name", "n", "d", "n_classes"),
    [("breast_cancer", 569, 30, 2), ("wine", 178, 13, 3), ("digits", 1797, 64, 10), ("iris", 150, 4, 3)],
)
def test_sklearn_datasets(name: str, n: int, d: int, n_classes: int) -> None:
    ds = D.load_dataset(name)
    assert ds.name == name
    assert ds.X.shape == (n, d) and ds.X.dtype == np.float64
    assert ds.n_classes == n_classes and len(ds.feature_names) == d
    assert ds.y.dtype == np.int64 and set(np.unique(ds.y)) == set(range(n_classes))
    assert ds.ids[0] == "s000000" and ds.ids[-1] == f"s{n - 1:06d}"
    assert len(set(ds.ids)) == n


def test_breast_cancer_keeps_sklearn_class_order() -> None:
    ds = D.load_dataset("breast_cancer")
    assert ds.class_names == ["malignant", "benign"]
    assert np.bincount(ds.y).tolist() == [212, 357]


def test_unknown_dataset_name_is_rejected() -> None:
    with pytest.raises(ValueError, match="neither a built-in dataset"):
        D.load_dataset("no_such_dataset_or_file")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"ids": ["a", "a", "b"]}, "not unique"),
        ({"X": [[1.0], [np.nan], [3.0]]}, "NaN"),
        ({"y": [0, 1, 2]}, r"0\.\.1"),
        ({"feature_names": ["f", "g"]}, "names for 1 columns"),
        ({"y": [0.5, 1, 0]}, "integer class indices"),
    ],
)
def test_dataset_validation(change: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {
        "name": "t", "ids": ["a", "b", "c"], "X": [[1.0], [2.0], [3.0]], "y": [0, 1, 0],
        "feature_names": ["f"], "class_names": ["n", "p"],
    }  # fmt: skip
    fields.update(change)
    with pytest.raises(ValueError, match=message):
        D.Dataset(**fields)  # type: ignore[arg-type]


def test_dataset_subset_and_column_indices() -> None:
    ds = D.load_dataset("iris")
    sub = ds.subset([5, 0])
    assert sub.ids.tolist() == ["s000005", "s000000"]
    np.testing.assert_array_equal(sub.X, ds.X[[5, 0]])
    assert sub.class_names == ds.class_names
    assert ds.column_indices(["petal width (cm)", "sepal length (cm)"]).tolist() == [3, 0]
    with pytest.raises(KeyError, match="unknown feature"):
        ds.column_indices(["nope"])


# ------------------------------------------------------------------------------------- load_csv

_MIXED_CSV = (
    "customer;age;job;income;member;outcome\r\n"
    "c1;34;admin.;1000.5;yes;no\r\n"
    "c2;?;technician;2000;no;yes\r\n"
    'c3;51;?;1500;yes;"maybe"\r\n'
    "c4;28;admin.;;no;no\r\n"
    "\r\n"
)


@pytest.fixture
def mixed_csv(tmp_path: Path) -> Path:
    path = tmp_path / "mixed.csv"
    path.write_bytes(_MIXED_CSV.encode())
    return path


def test_csv_onehot_missing_and_string_labels(mixed_csv: Path) -> None:
    ds = D.load_csv(mixed_csv, "outcome", id_column="customer")
    assert ds.name == "mixed"
    assert ds.ids.tolist() == ["c1", "c2", "c3", "c4"]
    onehot_job = ["job=admin.", "job=technician", "job=<missing>"]
    assert ds.feature_names == ["age", *onehot_job, "income", "member=yes"]
    # '?' in a numeric column -> mean of the observed cells; '' likewise; '?' in a categorical -> <missing>
    expected = np.array(
        [
            [34.0, 1, 0, 0, 1000.5, 1],
            [(34 + 51 + 28) / 3, 0, 1, 0, 2000.0, 0],
            [51.0, 0, 0, 1, 1500.0, 1],
            [28.0, 1, 0, 0, (1000.5 + 2000 + 1500) / 3, 0],
        ]
    )
    np.testing.assert_allclose(ds.X, expected)
    assert ds.class_names == ["maybe", "no", "yes"]
    assert ds.y.tolist() == [1, 2, 0, 1]


def test_csv_ordinal_encoding(mixed_csv: Path) -> None:
    ds = D.load_csv(mixed_csv, "outcome", id_column="customer", categorical="ordinal")
    assert ds.feature_names == ["age", "job", "income", "member"]
    assert ds.X[:, 1].tolist() == [0.0, 1.0, 2.0, 0.0]  # admin., technician, <missing> (last)
    assert ds.X[:, 3].tolist() == [1.0, 0.0, 1.0, 0.0]


def test_csv_missing_drop_keeps_original_ids(tmp_path: Path) -> None:
    path = tmp_path / "gaps.csv"
    path.write_text("a,b,y\n1,x,p\n?,x,q\n3,z,p\n4,,q\n")
    ds = D.load_csv(path, "y", missing="drop")
    assert ds.ids.tolist() == ["s000000", "s000002"]
    assert ds.feature_names == ["a", "b=z"]
    np.testing.assert_array_equal(ds.X, [[1.0, 0.0], [3.0, 1.0]])


def test_csv_headerless_numeric_labels_and_nan_cells(tmp_path: Path) -> None:
    path = tmp_path / "plain.txt"
    path.write_text(" 10, 1.5, 7\n 9, nan, 8\n 2, 2.5, 9\n 10, 1e+05, 6\n")
    ds = D.load_csv(path, 0, header=False)
    assert ds.feature_names == ["c1", "c2"]
    assert ds.class_names == ["2", "9", "10"]  # numeric labels sort numerically
    assert ds.y.tolist() == [2, 1, 0, 2]
    assert ds.X[1, 0] == pytest.approx((1.5 + 2.5 + 1e5) / 3)  # "nan" counts as missing
    named = D.load_csv(path, "digit", header=False, column_names=["digit", "u", "v"], drop=["v"])
    assert named.feature_names == ["u"]


def test_csv_quoted_delimiter_and_whitespace_files(tmp_path: Path) -> None:
    quoted = tmp_path / "quoted.csv"
    quoted.write_text('name,kind,label\n1,"a,b",x\n2,c,y\n3,d,x\n')
    ds = D.load_csv(quoted, "label")
    assert ds.feature_names == ["name", "kind=a,b", "kind=c", "kind=d"]
    spaced = tmp_path / "spaced.dat"
    spaced.write_bytes(b"1 2 3 a\r\n4 5  6 b\r\n")
    ds = D.load_csv(spaced, -1, header=False)
    np.testing.assert_array_equal(ds.X, [[1, 2, 3], [4, 5, 6]])


def test_csv_errors(tmp_path: Path) -> None:
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("a,b,y\n1,2,p\n3,q\n")
    with pytest.raises(ValueError, match=r"ragged\.csv:3: 2 fields, expected 3"):
        D.load_csv(ragged, "y")
    no_label = tmp_path / "nolabel.csv"
    no_label.write_text("a,y\n1,p\n2,?\n")
    with pytest.raises(ValueError, match="label 'y' missing in rows"):
        D.load_csv(no_label, "y")
    with pytest.raises(KeyError, match="label column 'z' not found"):
        D.load_csv(no_label, "z")
    with pytest.raises(ValueError, match="categorical must be"):
        D.load_csv(no_label, "y", categorical="target")  # type: ignore[arg-type]


def test_load_dataset_csv_path_defaults_to_last_column(mixed_csv: Path) -> None:
    ds = D.load_dataset(str(mixed_csv))
    assert ds.class_names == ["maybe", "no", "yes"]
    assert "customer=c1" in ds.feature_names  # no id column given: it is just a categorical feature
    assert D.load_dataset(str(mixed_csv), label="member").class_names == ["no", "yes"]


# ------------------------------------------------------------------- UCI formats on small fake files


@pytest.fixture
def fake_shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(D.DATASETS_ENV_VAR, str(tmp_path))
    return tmp_path


def test_adult_format_banner_and_test_label_period(fake_shared: Path) -> None:
    folder = fake_shared / "adult"
    folder.mkdir()
    row = (
        "39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, "
        "2174, 0, 40"
    )
    (folder / "adult.data").write_text(f"{row}, United-States, <=50K\n{row}, ?, >50K\n\n")
    (folder / "adult.test").write_text(f"|1x3 Cross validator\n{row}, Cuba, >50K.\n\n")
    ds = D.load_dataset("adult")
    assert ds.n_samples == 3 and ds.class_names == ["<=50K", ">50K"]
    assert ds.y.tolist() == [0, 1, 1]
    assert ds.ids.tolist() == ["s000000", "s000001", "s000002"]
    assert "native-country=<missing>" in ds.feature_names and "workclass" not in ds.feature_names
    assert "adult" in D.available_datasets() and "bank" not in D.available_datasets()


@pytest.mark.parametrize("with_header", [True, False])
def test_robot_header_line_is_detected(fake_shared: Path, with_header: bool) -> None:
    folder = fake_shared / "wall_following_robot"
    folder.mkdir()
    header = ",".join(f"S{k}" for k in range(1, 25)) + ",OUTPUT\n"
    rows = "".join(",".join(["0.5"] * 24) + f",{label}\n" for label in ("Move-Forward", "Slight-Left-Turn"))
    (folder / "sensor_readings_24.data").write_text((header if with_header else "") + rows)
    ds = D.load_dataset("robot")
    assert ds.X.shape == (2, 24)
    assert ds.feature_names[0] == "S1" and ds.class_names == ["Move-Forward", "Slight-Left-Turn"]


def test_missing_uci_dataset_names_the_searched_path(fake_shared: Path) -> None:
    assert D.shared_datasets_dir() == fake_shared
    with pytest.raises(FileNotFoundError, match=str(fake_shared / "bank_marketing")):
        D.load_dataset("bank")
    assert set(D.available_datasets()) == set(D.SKLEARN_DATASET_NAMES)


def test_shared_dir_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(D.DATASETS_ENV_VAR, str(tmp_path / "absent"))
    assert D.shared_datasets_dir() is None


# ------------------------------------------------------------------------ real UCI files (optional)

# Row counts, raw feature counts and class counts as verified in each folder's PROVENANCE.md.
_UCI_EXPECTED: dict[str, tuple[int, int, dict[str, int]]] = {
    "bank": (41188, 19, {"no": 36548, "yes": 4640}),
    "credit": (30000, 23, {"0": 23364, "1": 6636}),
    "adult": (32561 + 16281, 14, {"<=50K": 24720 + 12435, ">50K": 7841 + 3846}),
    "satellite": (
        4435 + 2000, 36,
        {"1": 1072 + 461, "2": 479 + 224, "3": 961 + 397, "4": 415 + 211, "5": 470 + 237, "7": 1038 + 470},
    ),
    "pendigits": (
        7494 + 3498, 16,
        {str(digit): train + test for digit, (train, test) in enumerate(zip(
            [780, 779, 780, 719, 780, 720, 720, 778, 719, 719],
            [363, 364, 364, 336, 364, 335, 336, 364, 336, 336], strict=True))},
    ),
    "robot": (5456, 24, {"Move-Forward": 2205, "Sharp-Right-Turn": 2097, "Slight-Right-Turn": 826,
                         "Slight-Left-Turn": 328}),
    "grid": (10000, 12, {"stable": 3620, "unstable": 6380}),
    "nursery": (12960, 8, {"not_recom": 4320, "priority": 4266, "spec_prior": 4044, "very_recom": 328,
                           "recommend": 2}),
    "covid": (5434, 20, {"Yes": 4383, "No": 1051}),
}  # fmt: skip


def _present(name: str) -> bool:
    return name in D.available_datasets()


def _needs(name: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        not _present(name),
        reason=f"shared dataset {name!r} not found (set {D.DATASETS_ENV_VAR} or add ../shared/datasets)",
    )


@pytest.mark.datasets
@pytest.mark.parametrize("name", [pytest.param(n, marks=_needs(n)) for n in _UCI_EXPECTED])
def test_uci_loader_matches_provenance(name: str) -> None:
    n_rows, n_features, class_counts = _UCI_EXPECTED[name]
    ds = D.load_dataset(name, categorical="ordinal")
    assert ds.X.shape == (n_rows, n_features)
    counts = np.bincount(ds.y, minlength=ds.n_classes).tolist()
    assert dict(zip(ds.class_names, counts, strict=True)) == class_counts
    assert len(set(ds.ids)) == n_rows


@pytest.mark.datasets
@_needs("bank")
def test_bank_onehot_drops_duration() -> None:
    ds = D.load_dataset("bank")
    assert "duration" not in ds.feature_names
    assert {"job=admin.", "contact=telephone", "default=unknown", "emp.var.rate"} <= set(ds.feature_names)
    assert "contact=cellular" not in ds.feature_names  # binary categorical: a single indicator


@pytest.mark.datasets
@_needs("nursery")
def test_nursery_onehot_width() -> None:
    # nursery.names: 3+5+4+4+3+2+3+3 values; the two-valued `finance` becomes one indicator column.
    ds = D.load_dataset("nursery")
    assert ds.n_features == 3 + 5 + 4 + 4 + 3 + 1 + 3 + 3
    assert ((ds.X == 0) | (ds.X == 1)).all()


@pytest.mark.datasets
@_needs("credit")
def test_credit_ids_come_from_id_column() -> None:
    ds = D.load_dataset("credit")
    assert ds.ids[0] == "1" and ds.ids[-1] == "30000"
    assert "ID" not in ds.feature_names and ds.X[0, 0] == 20000.0


@pytest.mark.datasets
@_needs("adult")
def test_adult_missing_drop_gives_complete_rows() -> None:
    ds = D.load_uci("adult", missing="drop")
    assert ds.n_samples == 30162 + 15060  # complete rows of adult.data + adult.test
    assert not any(name.endswith("=<missing>") for name in ds.feature_names)


# ------------------------------------------------------------------------------------------ Scaler


def test_minmax_scaler_bounds_and_constant_columns() -> None:
    rng = np.random.default_rng(1)
    X = np.column_stack([rng.normal(5, 3, 200), np.full(200, 7.0), rng.integers(-4, 9, 200)])
    scaler = D.Scaler.fit(X, "minmax")
    Z = scaler.transform(X)
    assert Z.min() == 0.0 and Z[:, [0, 2]].max(axis=0).tolist() == [1.0, 1.0]
    assert (Z[:, 1] == 0).all()
    np.testing.assert_allclose(scaler.inverse_transform(Z), X)
    outside = scaler.transform(np.array([[X[:, 0].max() + 10, 7.0, -100.0]]))
    assert outside[0, 0] > 1 and outside[0, 2] < 0
    clipped = scaler.transform(np.array([[X[:, 0].max() + 10, 8.0, -100.0]]), clip=True)
    assert clipped.tolist() == [[1.0, 0.0, 0.0]]


def test_standard_and_none_scalers() -> None:
    X = np.random.default_rng(2).normal([1.0, -20.0], [0.1, 40.0], size=(500, 2))
    Z = D.Scaler.fit(X, "standard").transform(X)
    np.testing.assert_allclose(Z.mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(Z.std(axis=0), 1.0)
    np.testing.assert_array_equal(D.Scaler.fit(X, "none").transform(X), X)


def test_scaler_dict_round_trip_and_errors() -> None:
    X = np.random.default_rng(3).uniform(-5, 5, size=(50, 4))
    scaler = D.Scaler.fit(X, "standard")
    restored = D.Scaler.from_dict(scaler.to_dict())
    assert restored.kind == "standard"
    np.testing.assert_array_equal(restored.transform(X), scaler.transform(X))
    with pytest.raises(ValueError, match="expected 4 columns"):
        scaler.transform(X[:, :3])
    with pytest.raises(ValueError, match="scaler kind"):
        D.Scaler.fit(X, "robust")  # type: ignore[arg-type]


# --------------------------------------------------------------------------------- split_columns

_COLS = [f"f{i}" for i in range(10)]


def test_split_default_is_even_and_active_first() -> None:
    split = D.split_columns(_COLS, 2)
    assert split.active == ["f0", "f1", "f2", "f3"]
    assert split.passive == [["f4", "f5", "f6"], ["f7", "f8", "f9"]]


def test_split_by_count_fraction_and_names() -> None:
    by_count = D.split_columns(_COLS, 2, passive_features=5)
    assert by_count.active == _COLS[:5]
    assert by_count.passive == [["f5", "f6", "f7"], ["f8", "f9"]]
    by_fraction = D.split_columns(_COLS, 1, passive_features=0.3)
    assert by_fraction.passive == [["f7", "f8", "f9"]] and by_fraction.active == _COLS[:7]
    by_name = D.split_columns(_COLS, 2, passive_features=["f1", "f8", "f3"])
    assert by_name.active == ["f0", "f2", "f4", "f5", "f6", "f7", "f9"]
    assert by_name.passive == [["f1", "f8"], ["f3"]]


def test_split_shuffle_is_seeded_partition() -> None:
    splits = [D.split_columns(_COLS, 3, passive_features=6, shuffle=True, seed=s) for s in range(8)]
    for split in splits:
        assert split.active == _COLS[:4]
        assert sorted(c for part in split.passive for c in part) == _COLS[4:]
        assert sorted(len(p) for p in split.passive) == [2, 2, 2]
    assert splits[0] == D.split_columns(_COLS, 3, passive_features=6, shuffle=True, seed=0)
    assert any(s.passive != [["f4", "f5"], ["f6", "f7"], ["f8", "f9"]] for s in splits)
    whole = D.split_columns(_COLS, 1, shuffle=True, seed=4)
    assert sorted(whole.active + whole.passive[0]) == _COLS and len(whole.active) == 5


@pytest.mark.parametrize(
    ("n_passive", "passive_features", "message"),
    [
        (10, None, "cannot give each of 11 parties"),
        (0, None, "n_passive must be at least 1"),
        (1, 0, "gives 0 passive columns"),
        (1, 10, "gives 10 passive columns"),
        (1, 0.01, "gives 0 passive columns"),
        (1, 1.5, r"fraction must lie in \(0, 1\)"),
        (3, 2, "cannot serve 3 passive parties"),
        (1, _COLS, "takes every column"),
    ],
)
def test_split_errors(n_passive: int, passive_features: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        D.split_columns(_COLS, n_passive, passive_features=passive_features)  # type: ignore[arg-type]


def test_split_unknown_name_and_dict_round_trip() -> None:
    with pytest.raises(KeyError, match="unknown passive"):
        D.split_columns(_COLS, 1, passive_features=["f1", "zz"])
    split = D.split_columns(_COLS, 2, passive_features=4)
    assert D.VerticalSplit.from_dict(split.to_dict()) == split
    with pytest.raises(ValueError, match="not unique"):
        D.VerticalSplit(["f0", "f1"], [["f1"]])


# ------------------------------------------------------------------------------- party data files


def test_party_csv_round_trip_with_labels(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    ids = np.array(["a,1", "b", 'c"q', "d"])
    X = rng.normal(size=(4, 3)) * np.array([1e-9, 1.0, 1e12])
    path = tmp_path / "parties" / "active.csv"
    D.write_party_csv(path, ids, X, ["x", "y z", "w"], labels=[2, 0, 0, 2], class_names=["lo", "mid", "hi"])
    assert path.read_text().splitlines()[1] == "id,x,y z,w,label"
    data = D.read_party_csv(path)
    assert data.ids.tolist() == ids.tolist()
    np.testing.assert_array_equal(data.X, X)  # exact float round trip
    assert data.columns == ["x", "y z", "w"]
    assert data.y is not None and data.y.tolist() == [2, 0, 0, 2]
    assert data.class_names == ["lo", "mid", "hi"]  # order and count survive an absent class


def test_party_csv_without_labels_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "passive.csv"
    D.write_party_csv(path, ["s1", "s2"], np.array([[1.5], [2.5]]), ["f"])
    assert path.read_text() == "id,f\ns1,1.5\ns2,2.5\n"
    data = D.read_party_csv(path)
    assert data.y is None and data.class_names is None and data.X.tolist() == [[1.5], [2.5]]
    with pytest.raises(ValueError, match="reserved"):
        D.write_party_csv(path, ["s1"], np.ones((1, 1)), ["label"])
    with pytest.raises(ValueError, match="not unique"):
        D.write_party_csv(path, ["s1", "s1"], np.ones((2, 1)), ["f"])
    with pytest.raises(ValueError, match=r"shape \(1, 2\), expected \(2, 1\)"):
        D.write_party_csv(path, ["s1", "s2"], np.ones((1, 2)), ["f"])
    bad = tmp_path / "bad.csv"
    bad.write_text("id,f\ns1,abc\n")
    with pytest.raises(ValueError, match=r"bad\.csv"):
        D.read_party_csv(bad)
    bad.write_text("key,f\ns1,1\n")
    with pytest.raises(ValueError, match="not a party data file"):
        D.read_party_csv(bad)


# ------------------------------------------------------------------------------------- sample IDs


def test_select_ids() -> None:
    ids = np.array(["s3", "s1", "s2", "s0"])
    assert D.select_ids(ids, ["s2", "s3", "s0"]).tolist() == [2, 0, 3]
    with pytest.raises(KeyError, match="s9"):
        D.select_ids(ids, ["s1", "s9"])


def test_overlapping_id_sets_overlap_and_differ() -> None:
    ids = D.load_dataset("wine").ids
    sets = D.overlapping_id_sets(ids, 3, 0.2, seed=7)
    n_keep = len(ids) - round(0.2 * len(ids))
    assert [len(s) for s in sets] == [n_keep] * 3
    assert all(set(s) <= set(ids) and len(set(s)) == len(s) for s in sets)
    assert all(set(sets[i]) != set(sets[j]) for i in range(3) for j in range(i + 1, 3))
    common = set.intersection(*(set(s) for s in sets))
    assert 0 < len(common) < n_keep
    again = D.overlapping_id_sets(ids, 3, 0.2, seed=7)
    assert all(np.array_equal(a, b) for a, b in zip(sets, again, strict=True))
    assert list(sets[0]) == [i for i in ids if i in set(sets[0])]  # input order kept
    shuffled = D.overlapping_id_sets(ids, 1, 0.0, seed=1, shuffle=True)[0]
    assert sorted(shuffled) == sorted(ids) and list(shuffled) != list(ids)
    with pytest.raises(ValueError, match="drop_fraction"):
        D.overlapping_id_sets(ids, 2, 1.0, seed=0)


def test_train_test_split_ids_is_stratified_and_seeded() -> None:
    ds = D.load_dataset("wine")
    train, test = D.train_test_split_ids(ds.ids, ds.y, 0.25, seed=3)
    assert set(train).isdisjoint(test) and set(train) | set(test) == set(ds.ids)
    test_y = ds.y[D.select_ids(ds.ids, test)]
    for cls, count in enumerate(np.bincount(ds.y)):
        assert (test_y == cls).sum() == round(0.25 * count)
    same = D.train_test_split_ids(ds.ids, ds.y, 0.25, seed=3)
    assert np.array_equal(same[1], test)
    assert not np.array_equal(D.train_test_split_ids(ds.ids, ds.y, 0.25, seed=4)[1], test)
    with pytest.raises(ValueError, match="test_fraction"):
        D.train_test_split_ids(ds.ids, ds.y, 0.0, seed=0)
