"""A list of fixed-width values put in a uniformly random secret order on disk, in bounded memory: the OPRF sender's
values (services/crypto/oprf.py), 16 bytes each with the row each stands for, 3 per own ID.

Each value is written, as it is made, to one of ``buckets`` files drawn uniformly at random; :meth:`Shuffle.seal`
then shuffles each bucket in memory (a fresh uniform permutation) and concatenates them. Given the bucket sizes,
which values share a bucket is uniform over every split with those sizes, and each bucket's order uniform: every
order of the whole list is equally likely, as if it were permuted in memory (the scatter-then-shuffle method of
Rao and Sandelius). Memory is one bucket (about BUCKET_VALUES values) and the rows in their final order (4 bytes
each, which the caller keeps); disk is the list twice at most, in a directory of its own (mode 0700, files 0600)
that :meth:`close` removes, as does the garbage collector if no one called it, and :func:`sweep` at the next start
if the process was killed. What sits there is what the party held in memory before: its own values, never sent or
received data.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
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
        # Held while the shuffle lives: every file is opened through it, so whoever can rename entries of the parent
        # cannot swap the folder under us (review 19), and its lock, taken before the first file, tells sweep() that
        # the folder is in use. A kill releases the lock.
        self._dir = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        fcntl.flock(self._dir, fcntl.LOCK_EX)
        self._close = weakref.finalize(self, _remove, self.path, self._dir)
        self._files = [self._open(f"bucket-{b}") for b in range(self._buckets)]
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
        with self._open("sealed") as out:
            for b, bucket in enumerate(self._files):
                bucket.close()
                with self._open(f"bucket-{b}", os.O_RDONLY) as fh:
                    records = np.fromfile(fh, dtype=self._record)
                os.unlink(f"bucket-{b}", dir_fd=self._dir)
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
        with self._open("sealed", os.O_RDONLY) as sealed:
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


    def _open(self, name: str, flags: int = os.O_WRONLY | os.O_CREAT | os.O_EXCL) -> BinaryIO:
        """A file of our folder, through its descriptor (a new one: never an existing name or a link)."""
        fd = os.open(name, flags | os.O_NOFOLLOW, 0o600, dir_fd=self._dir)
        return open(fd, "rb" if flags == os.O_RDONLY else "wb")


def sweep(directory: str | Path | None = None) -> list[str]:
    """Remove the folders shuffles of a killed process left in ``directory`` (the system's temporary one by default):
    ours (this user's, not a link) that no live shuffle locks and that hold a file. A shuffle locks its folder before
    its first file, so an empty one may be one being made: it stays. The names of the folders removed."""
    removed = []
    for path in sorted(Path(directory if directory is not None else tempfile.gettempdir()).glob(f"{_PREFIX}*")):
        try:
            found = path.lstat()
            if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid():
                continue
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.listdir(fd):
                _remove(path, fd, close=False)
                removed.append(path.name)
        except OSError:  # locked: a live shuffle's
            pass
        finally:
            os.close(fd)
    return removed


def _remove(path: Path, fd: int, close: bool = True) -> None:
    """Our folder's files, through its descriptor ``fd``, then the folder (if ``path`` still names an empty one)."""
    try:
        with contextlib.suppress(OSError):
            for name in os.listdir(fd):
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=fd)
        with contextlib.suppress(OSError):
            os.rmdir(path)
    finally:
        if close:
            os.close(fd)
