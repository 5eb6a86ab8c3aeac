"""Encrypted matrices on the wire: ``he.EncryptedMatrix`` <-> ``vflsec.v1.EncryptedMatrix``."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np

from vflsec.services.crypto import he
from vflsec.services.errors import InvalidArgument
from vflsec.services.models import lr
from vflsec.v1 import common_pb2

BACKENDS = {common_pb2.BACKEND_CKKS: "ckks", common_pb2.BACKEND_PLAIN: "plain"}
BACKEND_ENUM = {name: value for value, name in BACKENDS.items()}


def backend_name(value: int) -> str:
    try:
        return BACKENDS[value]
    except KeyError:
        raise InvalidArgument(f"backend must be BACKEND_CKKS or BACKEND_PLAIN, got {value}") from None


def to_message(backend: he.Backend, matrix: he.EncryptedMatrix) -> common_pb2.EncryptedMatrix:
    w = he.matrix_to_wire(backend, matrix)
    rows, cols = w.shape
    return common_pb2.EncryptedMatrix(
        rows=rows, cols=cols, replicas=w.replicas, rows_per_ciphertext=w.rows_per_ct, ciphertexts=w.ciphertexts
    )


def from_message(
    backend: he.Backend,
    message: common_pb2.EncryptedMatrix,
    name: str,
    *,
    rows: int | None = None,
    cols: int | None = None,
) -> he.EncryptedMatrix:
    """Validate the layout and deserialize every ciphertext; any defect is an InvalidArgument."""
    if rows is not None and message.rows != rows:
        raise InvalidArgument(f"{name}: expected {rows} rows, got {message.rows}")
    if cols is not None and message.cols != cols:
        raise InvalidArgument(f"{name}: expected {cols} columns, got {message.cols}")
    w = he.WireMatrix(
        (message.rows, message.cols), message.replicas, message.rows_per_ciphertext, list(message.ciphertexts)
    )
    try:
        return he.matrix_from_wire(backend, w)
    except ValueError as exc:
        raise InvalidArgument(f"{name}: {exc}") from exc


def digest(blobs: Iterable[bytes]) -> bytes:
    """SHA-256 over length-prefixed blobs: one fingerprint of a list of serialized ciphertexts."""
    h = hashlib.sha256()
    for blob in blobs:
        h.update(len(blob).to_bytes(8, "little") + blob)
    return h.digest()


def optimizer_config(training: common_pb2.TrainingConfig) -> lr.OptimizerConfig:
    """The optimiser settings of a TrainingConfig, defaults filled in; bad values are an InvalidArgument."""
    try:
        return lr.OptimizerConfig(training.optimizer or "adam", training.learning_rate or 0.05, training.l2)
    except ValueError as exc:
        raise InvalidArgument(f"training: {exc}") from exc


def require_distinct_rows(sample_index: np.ndarray) -> None:
    """Every row once: a repeated row weighs a batch's sums (the batch bound counts distinct rows, and a bias
    sum over n copies of one row is n·δ_i) and repeats an inference share."""
    distinct = np.unique(sample_index).size
    if distinct != len(sample_index):
        raise InvalidArgument(
            f"sample_index repeats rows ({len(sample_index)} entries, {distinct} distinct): every row once"
        )
