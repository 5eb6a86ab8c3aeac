"""Datasets: loading, encoding, per-party scaling, vertical splits and the party data files.

Shared by the party services (each party reads its own data file) and the operator CLI (the demo splits a
dataset vertically and writes one data file per party). This module is the one name callers import; the work lives
in its siblings, by concern:

    * tables.py — :class:`Dataset`, the encoding vocabulary and the checks every loader runs;
    * encoding.py — columns into features and class labels (the rules below), target encoding;
    * readers.py — CSV and Parquet files (:func:`load_csv`);
    * catalog.py — the named datasets (:func:`load_dataset`, :func:`available_datasets`);
    * splitter.py — per-party scaling, the vertical split and the rows by sample ID;
    * party_files.py — the party data files.

Sources
    * scikit-learn's bundled datasets (``breast_cancer``, ``wine``, ``digits``, ``iris``), always present;
    * the raw UCI / Kaggle files in ``shared/datasets`` (see :func:`shared_datasets_dir`), read in their
      published formats (CRLF, ``;`` or whitespace separators, junk banner lines, ``.``-suffixed test labels);
    * any CSV or Parquet file through :func:`load_csv`: pyarrow's multi-threaded reader, column by column
      (no Python object per row); the csv module reads only whitespace-separated files, each file's first
      record (names, header detection) and a file Arrow's dialect would read differently (see
      readers.py ``_arrow_cells``).

Encoding rules (:func:`load_csv` and the UCI loaders)
    * A column is *numeric* when every non-missing cell parses as a float; otherwise it is *categorical*.
      Numerically coded categories (e.g. ``SEX`` = 1/2 in the credit data) therefore stay numeric.
    * ``categorical="onehot"``: one 0/1 column per category, named ``column=category`` (``job=admin.``);
      a two-category column becomes a single indicator of its second category (``Fever=Yes``), since the
      second column would be redundant. ``categorical="ordinal"``: one column of category codes 0..k-1.
      Categories are ordered numbers-first (numerically), then strings (lexicographically).
    * Missing values: a cell is missing when, after stripping whitespace, it equals one of
      ``missing_values`` (default ``"?"`` and the empty string), or when a numeric cell is NaN/infinite.
      With ``missing="impute"`` (default) a numeric cell gets the mean of the observed cells of its column
      (0 if none) and a categorical cell gets its own category ``<missing>`` (sorted last). With
      ``missing="drop"`` every row with a missing feature is removed. A missing *label* is always an error.
    * Labels are mapped to class indices in the same category order (``class_names[i]`` is class ``i``).
    * Rows without an ID column get IDs ``s000000``, ``s000001``, ... (row index, zero-padded).

Dataset-specific choices (from the PROVENANCE files and the papers in ``shared/papers``)
    * ``bank``: ``duration`` is dropped. The dataset's description says it "highly affects the output
      target ... should be discarded if the intention is to have a realistic predictive model", and the
      Rassouli and Varasteh papers drop it too (19 features, 41188 records).
    * ``grid``: ``stab`` is dropped because it determines the label ``stabf`` exactly.
    * ``credit``: ``ID`` becomes the sample IDs, not a feature.
    * ``adult``: ``adult.data`` and ``adult.test`` are concatenated (48842 rows); the test file's banner
      line is skipped and the trailing ``.`` of its labels removed.
    * ``satellite`` and ``pendigits``: the published train and test files are concatenated.
    * ``covid``: kept as published, including its duplicate rows and two constant columns.
"""

from __future__ import annotations

from .catalog import (
    SKLEARN_DATASET_NAMES,
    UCI_DATASET_NAMES,
    available_datasets,
    load_dataset,
    load_uci,
    shared_datasets_dir,
)
from .encoding import (
    ColumnNotFound,
    target_encode,
)
from .party_files import (
    PartyData,
    read_party_csv,
    write_party_csv,
    write_party_csv_chunks,
)
from .readers import (
    load_csv,
    release_freed_memory,
)
from .splitter import (
    IdIndex,
    PassiveFeatures,
    RandomColumns,
    Scaler,
    VerticalSplit,
    overlapping_id_sets,
    overlapping_rows,
    select_ids,
    split_columns,
    train_test_split_ids,
)
from .tables import (
    DATASETS_ENV_VAR,
    DEFAULT_MISSING_VALUES,
    MAX_CLASSES,
    MAX_LEVELS,
    MISSING_CATEGORY,
    NA_SPELLINGS,
    NOTE_LEVELS,
    WHITESPACE,
    CategoricalEncoding,
    ColumnRef,
    Dataset,
    Encoding,
    MissingPolicy,
    ScalerKind,
)

__all__ = [
    "DATASETS_ENV_VAR",
    "DEFAULT_MISSING_VALUES",
    "MAX_CLASSES",
    "MAX_LEVELS",
    "MISSING_CATEGORY",
    "NA_SPELLINGS",
    "NOTE_LEVELS",
    "SKLEARN_DATASET_NAMES",
    "UCI_DATASET_NAMES",
    "WHITESPACE",
    "CategoricalEncoding",
    "ColumnNotFound",
    "ColumnRef",
    "Dataset",
    "Encoding",
    "IdIndex",
    "MissingPolicy",
    "PartyData",
    "PassiveFeatures",
    "RandomColumns",
    "Scaler",
    "ScalerKind",
    "VerticalSplit",
    "available_datasets",
    "load_csv",
    "load_dataset",
    "load_uci",
    "overlapping_id_sets",
    "overlapping_rows",
    "read_party_csv",
    "release_freed_memory",
    "select_ids",
    "shared_datasets_dir",
    "split_columns",
    "target_encode",
    "train_test_split_ids",
    "write_party_csv",
    "write_party_csv_chunks",
]
