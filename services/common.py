"""Plain values the engines share with the link layer, kept free of gRPC and protobuf so that importing an engine
loads neither: the parties' certificate roles, the row check every batch passes, the fingerprint of serialized
ciphertexts."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np

from vflsec.services.errors import InvalidArgument

# Certificate roles (the identity a party's certificate names; services/transport/tls.py issues and checks them).
COORDINATOR = "coordinator"
ACTIVE = "active"
PASSIVE = "passive"
OPERATOR = "operator"
ROLES: frozenset[str] = frozenset({COORDINATOR, ACTIVE, PASSIVE, OPERATOR})


def digest(blobs: Iterable[bytes]) -> bytes:
    """SHA-256 over length-prefixed blobs: one fingerprint of a list of serialized ciphertexts."""
    h = hashlib.sha256()
    for blob in blobs:
        h.update(len(blob).to_bytes(8, "little") + blob)
    return h.digest()


def require_distinct_rows(sample_index: np.ndarray) -> None:
    """Every row once: a repeated row weighs a batch's sums (the batch bound counts distinct rows, and a bias
    sum over n copies of one row is n·δ_i) and repeats an inference share."""
    distinct = np.unique(sample_index).size
    if distinct != len(sample_index):
        raise InvalidArgument(
            f"sample_index repeats rows ({len(sample_index)} entries, {distinct} distinct): every row once"
        )
