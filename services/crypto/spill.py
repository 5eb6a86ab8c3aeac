"""A list of fixed-width values put in a uniformly random secret order on disk, in bounded memory: the OPRF sender's
values (services/crypto/oprf.py), 16 bytes each with the row each stands for, 3 per own ID.

Each value is written, as it is made, to one of ``buckets`` files drawn uniformly at random; :meth:`Shuffle.seal`
then shuffles each bucket in memory (a fresh uniform permutation) and concatenates them. Given the bucket sizes,
which values share a bucket is uniform over every split with those sizes, and each bucket's order uniform: every
order of the whole list is equally likely, as if it were permuted in memory (the scatter-then-shuffle method of
Rao and Sandelius). Memory is one bucket (about BUCKET_VALUES values) and the rows in their final order (4 bytes
each, which the caller keeps); disk is the list twice at most, in a directory of its own (mode 0700, files 0600)
that :meth:`close` removes, as does the garbage collector if no one called it. What sits there is what the party
held in memory before: its own values, never sent or received data.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from vflsec.services.crypto import entropy

BUCKET_VALUES = 1 << 20  # values per bucket, on average: about 20 MB of a bucket in memory at a time (16-byte values)
_PREFIX = "vflsec-psi-"


class Shuffle:
    """``total`` values of ``width`` bytes, each with an int32 row: :meth:`add` them in any order, :meth:`seal`
    once all came (the rows in the secret order), then :meth:`chunks` streams the values in that order."""

    def __init__(self, total: int, width: int, directory: str | Path | None = None) -> None:
        self._total, self._width, self._added = total, width, 0
        self._record = np.dtype([("row", "<i4"), ("value", f"S{width}")])
        self._buckets = max(1, -(-total // BUCKET_VALUES))
        self.path = Path(tempfile.mkdtemp(prefix=_PREFIX, dir=directory))  # mode 0700
        self._close = weakref.finalize(self, shutil.rmtree, self.path, True)
        self._files = [_open(self.path / f"bucket-{b}") for b in range(self._buckets)]
        self._sealed = False
        self.rows: np.ndarray | None = None

    def add(self, rows: np.ndarray, values: np.ndarray) -> None:
        """More values (an S``width`` array) and their rows, each to a bucket drawn at random."""
        if self._sealed:
            raise ValueError("values added after the order was sealed")
        if self._added + len(values) > self._total:
            raise ValueError(f"{self._added + len(values)} values added, {self._total} announced")
        records = np.empty(len(values), dtype=self._record)
        records["row"], records["value"] = rows, values
        # uniform up to a bias below buckets / 2^64
        buckets = np.frombuffer(entropy.os_entropy().bytes(8 * len(values)), np.uint64) % np.uint64(self._buckets)
        by_bucket = np.argsort(buckets, kind="stable")
        bounds = np.searchsorted(buckets[by_bucket], np.arange(self._buckets + 1))
        for b in range(self._buckets):
            if bounds[b] < bounds[b + 1]:
                self._files[b].write(records[by_bucket[bounds[b] : bounds[b + 1]]].tobytes())
        self._added += len(values)

    def seal(self) -> np.ndarray:
        """Shuffle each bucket, one at a time, into the final order: the row of each value in that order (-1 or
        whatever the caller tagged), also kept as ``rows``."""
        if self._sealed:
            return self.rows
        if self._added != self._total:
            raise ValueError(f"{self._added} values added, {self._total} announced")
        self.rows, filled = np.empty(self._total, dtype=np.int32), 0
        with _open(self.path / "sealed") as out:
            for b, bucket in enumerate(self._files):
                bucket.close()
                records = np.fromfile(self.path / f"bucket-{b}", dtype=self._record)
                os.unlink(self.path / f"bucket-{b}")
                records = records[entropy.os_entropy().permutation(len(records))]
                self.rows[filled : filled + len(records)] = records["row"]
                out.write(np.ascontiguousarray(records["value"]).tobytes())
                filled += len(records)
        self._files, self._sealed = [], True
        return self.rows

    def chunks(self, per_chunk: int) -> Iterator[bytes]:
        """The values in the sealed order, ``per_chunk`` at a time (read from disk as they go)."""
        if not self._sealed:
            raise ValueError("no value before the order is sealed")
        with open(self.path / "sealed", "rb") as sealed:
            while data := sealed.read(per_chunk * self._width):
                yield data

    def close(self) -> None:
        """Remove the files; idempotent."""
        for bucket in self._files:
            bucket.close()
        self._files = []
        self._close()

    def __enter__(self) -> Shuffle:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _open(path: Path) -> BinaryIO:
    return open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb")
