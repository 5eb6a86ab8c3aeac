"""A list of fixed-width values put in a uniformly random secret order on disk, in bounded memory: the OPRF sender's
values (services/crypto/oprf.py), 16 bytes each with the row each stands for, 3 per own ID.

Each value is written, as it is made, to one of ``buckets`` files drawn uniformly at random; :meth:`Shuffle.seal`
then shuffles each bucket in memory (a fresh uniform permutation) and concatenates them. Given the bucket sizes,
which values share a bucket is uniform over every split with those sizes, and each bucket's order uniform: every
order of the whole list is equally likely, as if it were permuted in memory (the scatter-then-shuffle method of
Rao and Sandelius). Memory is one bucket (about BUCKET_VALUES values); the rows in their final order (4 bytes each,
which the caller keeps) go to a :class:`Column`; disk is the list twice at most, in a directory of its own (mode
0700, files 0600) that :meth:`close` removes, as does the garbage collector if no one called it, and :func:`sweep`
at the next start if the process was killed. What sits there is what the party held in memory before: its own
values, never sent or received data (but see below).

:class:`Parts`, :class:`Column` and :class:`Ranges` keep other per-ID state on disk in the same way, cut into parts
read back one at a time: P's (ID, bin) slots by bin range, its secret order in blocks, A's bins, and A's outputs and
a passive party's values by value range
(the one place received values are written: A's, matched range by range and removed when the match ends). Every
such folder is a :class:`_Folder`: locked while it lives, its files opened through its descriptor, swept after a kill.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import stat
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from vflsec.services.crypto import entropy

BUCKET_VALUES = 1 << 19  # values per bucket, on average: about 10 MB of a bucket in memory at a time (16-byte values)
RANGE_VALUES = 1 << 17  # a list's values per range of Ranges, on average (uniform values): about 2.5 MB a range
COLUMN_BLOCK = 1 << 21  # records of a Column read at once: 8 MB of int32
_PREFIX = "vflsec-psi-"
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL

log = logging.getLogger(__name__)


class _Folder:
    """A folder of our own (mode 0700) in ``directory``, the system's temporary one by default. Held open while it
    lives and every file opened through its descriptor, so whoever can rename entries of the parent cannot swap it
    under us (review 19); locked before its first file, which tells :func:`sweep` it is in use (a kill releases the
    lock). :meth:`remove` (idempotent) removes it, as does the garbage collector if no one called it."""

    def __init__(self, directory: str | Path | None) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=_PREFIX, dir=directory))
        self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        self.remove = weakref.finalize(self, _remove, self.path, self.fd)

    def open(self, name: str, flags: int = _NEW) -> BinaryIO:
        """A file of the folder: a new one by default, never a link."""
        fd = os.open(name, flags | os.O_NOFOLLOW, 0o600, dir_fd=self.fd)
        return open(fd, "rb" if flags == os.O_RDONLY else "ab" if flags & os.O_APPEND else "wb")

    def unlink(self, name: str) -> None:
        os.unlink(name, dir_fd=self.fd)


class Shuffle:
    """``total`` values of ``width`` bytes, each with an int32 row: :meth:`add` them in any order, :meth:`seal`
    once all came (the rows in the secret order), then :meth:`chunks` streams the values in that order."""

    def __init__(self, total: int, width: int, directory: str | Path | None = None) -> None:
        self._total, self._width, self._added, self._directory = total, width, 0, directory
        self._record = np.dtype([("row", "<i4"), ("value", f"S{width}")])
        self._buckets = max(1, -(-total // BUCKET_VALUES))
        self._folder = _Folder(directory)
        self.path = self._folder.path
        self._files = [self._folder.open(f"bucket-{b}") for b in range(self._buckets)]
        self._sealed = False
        self.rows: Column | None = None

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

    def seal(self) -> Column:
        """Shuffle each bucket, one at a time, into the final order: the row of each value in that order (-1 or
        whatever the caller tagged), on disk as a :class:`Column` of its own, also kept as ``rows`` until
        :meth:`close` (which leaves it to whoever else holds it: it outlives the values, with the session)."""
        if self._sealed:
            return self.rows
        if self._added != self._total:
            raise ValueError(f"{self._added} values added, {self._total} announced")
        self.rows = Column(np.int32, self._directory)
        with self._folder.open("sealed") as out:
            for b, bucket in enumerate(self._files):
                bucket.close()
                with self._folder.open(f"bucket-{b}", os.O_RDONLY) as fh:
                    records = np.fromfile(fh, dtype=self._record)
                self._folder.unlink(f"bucket-{b}")
                shuffled = entropy.os_entropy().permutation(len(records))
                self.rows.add(records["row"][shuffled])  # each field gathered alone: no shuffled copy of the records
                out.write(records["value"][shuffled])
                del records, shuffled
        self._files, self._sealed = [], True
        return self.rows

    def chunks(self, per_chunk: int) -> Iterator[bytes]:
        """The values in the sealed order, ``per_chunk`` at a time (read from disk as they go)."""
        if not self._sealed:
            raise ValueError("no value before the order is sealed")
        with self._folder.open("sealed", os.O_RDONLY) as sealed:
            while data := sealed.read(per_chunk * self._width):
                yield data

    def close(self) -> None:
        """Remove the files; idempotent. The sealed order is dropped, not removed: it goes once no one holds it."""
        for bucket in self._files:
            bucket.close()
        self._files, self.rows = [], None
        self._folder.remove()

    def __enter__(self) -> Shuffle:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class Parts:
    """Records (a numpy structured ``dtype``) on disk cut into ``count`` parts, a file each, appended to as they come
    and read back a part at a time. Files as :class:`Shuffle`'s: a :class:`_Folder` (0700, files 0600) that
    :meth:`close` removes, as does the garbage collector if no one called it, and :func:`sweep` after a kill."""

    def __init__(self, count: int, dtype: np.dtype, directory: str | Path | None = None) -> None:
        if count < 1:
            raise ValueError(f"{count} parts: at least one")
        self.count, self.dtype, self.size = count, np.dtype(dtype), 0
        self._folder = _Folder(directory)
        self.path = self._folder.path
        for r in range(count):
            self._folder.open(f"part-{r}").close()

    def append(self, which: np.ndarray, records: np.ndarray) -> None:
        """Each record to the end of part ``which[i]``'s file (in [0, count))."""
        by_part = np.argsort(which, kind="stable")
        bounds = np.searchsorted(which[by_part], np.arange(self.count + 1))
        for r in np.flatnonzero(bounds[1:] > bounds[:-1]):  # opened per call, not held: no descriptor per part
            with self._folder.open(f"part-{r}", os.O_WRONLY | os.O_APPEND) as out:
                out.write(records[by_part[bounds[r] : bounds[r + 1]]].tobytes())
        self.size += len(records)

    def records(self, r: int, start: int = 0, count: int = -1) -> np.ndarray:
        """Part r's records in the order appended: ``count`` of them (-1: all) from the ``start``-th."""
        with self._folder.open(f"part-{r}", os.O_RDONLY) as fh:
            return np.fromfile(fh, dtype=self.dtype, count=count, offset=start * self.dtype.itemsize)

    def close(self) -> None:
        """Remove the files; idempotent."""
        self._folder.remove()

    def __enter__(self) -> Parts:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def blocks(values: np.ndarray | Column, per_block: int) -> Iterator[tuple[int, np.ndarray]]:
    """(start, values start..start + per_block), in order, whether ``values`` is in memory or a :class:`Column`."""
    if isinstance(values, Column):
        yield from values.blocks(per_block)
    else:
        for start in range(0, len(values), per_block):
            yield start, values[start : start + per_block]


class Column(Parts):
    """Fixed-width records in the order added, in one file, read back a block at a time: per-ID state kept for later
    rather than held (P's secret order: the row of each value it sent, 4 bytes a value, which the session keeps until
    it closes). Removed by :meth:`close`, or by the garbage collector once no one holds it."""

    def __init__(self, dtype: np.dtype, directory: str | Path | None = None) -> None:
        super().__init__(1, dtype, directory)

    def add(self, records: np.ndarray) -> None:
        """More records, at the end."""
        with self._folder.open("part-0", os.O_WRONLY | os.O_APPEND) as out:
            out.write(np.ascontiguousarray(records, dtype=self.dtype))
        self.size += len(records)

    def __len__(self) -> int:
        return self.size

    def blocks(self, per_block: int = COLUMN_BLOCK) -> Iterator[tuple[int, np.ndarray]]:
        """(start, records start..start + per_block), in order: one block in memory at a time."""
        with self._folder.open("part-0", os.O_RDONLY) as fh:
            for start in range(0, self.size, per_block):
                yield start, np.fromfile(fh, dtype=self.dtype, count=min(per_block, self.size - start))

    def __array__(self, dtype: np.dtype | None = None, copy: bool | None = None) -> np.ndarray:
        """Every record in memory (small lists: tests)."""
        records = self.records(0)
        return records if dtype is None else records.astype(dtype)


class Ranges(Parts):
    """Uniformly random values of ``width`` bytes (OPRF outputs), each with an int32 tag, cut into ``count`` value
    ranges: range r holds the values whose first 4 bytes, read big-endian, fall in the r-th of ``count`` equal
    slices of [0, 2^32). Equal values share a range, so two lists cut alike match range by range, one range in
    memory at a time."""

    def __init__(self, count: int, width: int, directory: str | Path | None = None) -> None:
        super().__init__(count, np.dtype([("tag", "<i4"), ("value", f"S{width}")]), directory)
        self.width = width

    @staticmethod
    def count_for(n: int) -> int:
        """Ranges for a list of about ``n`` values: RANGE_VALUES each on average."""
        return max(1, -(-n // RANGE_VALUES))

    def add(self, tags: np.ndarray, values: np.ndarray) -> None:
        """More values (an S``width`` array) with their tags, each to its range."""
        records = np.empty(len(values), dtype=self.dtype)
        records["tag"], records["value"] = tags, values
        prefix = records.view(np.uint8).reshape(-1, self.dtype.itemsize)[:, 4:8]  # the value's first 4 bytes
        ranges = (prefix.copy().view(">u4").ravel().astype(np.uint64) * np.uint64(self.count)) >> np.uint64(32)
        self.append(ranges, records)

    def part(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        """(tags, values) of range r, in the order added."""
        records = self.records(r)
        return records["tag"].copy(), records["value"].copy()


def sweep(directory: str | Path | None = None) -> list[str]:
    """Remove the folders shuffles of a killed process left in ``directory`` (the system's temporary one by default):
    ours (this user's, not a link) that no live folder locks and that hold a file. A _Folder is locked before
    its first file, so an empty one may be one being made: it stays. The names of the folders removed (and logged)."""
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
        except OSError:  # locked: a live folder's
            pass
        finally:
            os.close(fd)
    if removed:
        log.info("removed %d PSI spill folder(s) a killed process left: %s", len(removed), ", ".join(removed))
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
