"""The named datasets: scikit-learn's bundled ones and the raw UCI / Kaggle files in ``shared/datasets``
(dataset-specific choices: datasets.py), loaded by name through :func:`load_dataset`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass

from .encoding import _encode_table
from .readers import _read_table, load_csv
from .tables import (
    DATASETS_ENV_VAR,
    DEFAULT_MISSING_VALUES,
    WHITESPACE,
    CategoricalEncoding,
    ColumnRef,
    Dataset,
    MissingPolicy,
    _row_ids,
)


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
