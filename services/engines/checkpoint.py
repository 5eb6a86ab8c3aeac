"""Durable session state: one file per session, replaced atomically, so a party killed at any point restarts
from its last completed step.

A checkpoint is a ``.npz`` of named arrays plus a JSON document (stored as the ``__meta__`` byte array).
It is written to a temporary file in the same folder, flushed to disk, then renamed over the old one.

Arrays a session sets once and never changes in place (the aligned rows, an epoch's batch order, the public
context) go to a companion ``<name>.<tag>.fixed`` file that the checkpoint names, rewritten only when one of
them is a new object: a training step then writes O(model) bytes, not O(rows) — at a million rows rewriting
them at every step made an epoch quadratic in the rows. The companion is durable before the checkpoint
that names it, and the one it replaces is deleted only after.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import struct
import tempfile
import zipfile
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from vflsec.services.crypto.entropy import KEY_BYTES, new_key

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")  # a file name here (a session's, with its suffix)
_FIXED = re.compile(r"^(?P<name>.+)\.[0-9a-f]{16}\.fixed$")  # a companion file: <session>.<random tag>.fixed
# A session ID leaves room under _NAME's 128 characters for the longest suffix a file adds to it: a companion's
# ".<16 hex>.fixed" (23) or a training-key epoch's ".e<epoch>.bin".
MAX_SESSION_ID = 100


def _valid_name(name: str) -> bool:
    return bool(_NAME.match(name)) and ".." not in name


def valid_session_id(session_id: str) -> bool:
    """Session IDs name checkpoint files, so they are restricted to a safe alphabet and leave room for suffixes."""
    return len(session_id) <= MAX_SESSION_ID and _valid_name(session_id)


class StateInUse(OSError):
    """Another process holds this state folder (two processes on one folder would each keep their own budgets)."""


def _claim(path: Path) -> int:
    fd = os.open(path / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StateInUse(f"state folder {path} is held by another running vflsec party (one per folder)") from None
    return fd


class StateDir:
    """A folder of session checkpoints; ``None`` keeps state in memory only.

    ``exclusive``: a party's own folder is held by one process at a time (an flock on ``.lock``, taken before
    anything is read or swept and kept until :meth:`release`): a second process on the same folder would delete
    the first one's temporary files at start and keep its own count of every query budget."""

    def __init__(self, path: Path | None, *, exclusive: bool = False) -> None:
        self.path = path
        self._lock: int | None = None
        if path is not None:
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
            if exclusive:
                self._lock = _claim(path)
            # A kill between mkstemp and os.replace leaves a temporary file (which may hold a secret key):
            # nothing reads it, so it goes at start-up. Only this class writes ".<name>.<random>.tmp" here.
            for leftover in path.glob(".*.tmp"):
                leftover.unlink(missing_ok=True)
        # Per checkpoint: its companion file and the objects last written there (held, so no id is reused).
        self._fixed: dict[str, tuple[str | None, dict[str, tuple]]] = {}
        # Checkpoints load_all could not read (name -> why): left on disk, untouched, for the operator.
        self.unreadable: dict[str, str] = {}

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def release(self) -> None:
        """Let another process take the folder (the party stopped)."""
        if self._lock is not None:
            os.close(self._lock)  # closing the descriptor drops its flock
            self._lock = None

    def save(
        self, name: str, arrays: dict[str, np.ndarray], meta: dict[str, Any], *, fixed: Collection[str] = ()
    ) -> None:
        """Replace ``name``'s checkpoint. Arrays keyed in ``fixed`` are never changed in place once saved: they
        are rewritten (to a new companion file) only when one of them is another object than last time."""
        if self.path is None:
            return
        if not _valid_name(name):  # new sessions' IDs are shorter (valid_session_id); restored ones may not be
            raise ValueError(f"invalid checkpoint name {name!r}")
        held = {k: v for k, v in arrays.items() if k in fixed}
        identities = {k: _identity(v) for k, v in held.items()}
        previous, written = self._fixed.get(name, (None, {}))
        companion = previous
        if identities.keys() != written.keys() or any(not _same(written[k], i) for k, i in identities.items()):
            companion = f"{name}.{secrets.token_hex(8)}.fixed" if held else None
            if companion is not None:
                self._write(companion, lambda fh: _savez(fh, held))
        payload = {k: np.asarray(v) for k, v in arrays.items() if k not in held}
        payload["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        if companion is not None:
            payload["__fixed__"] = np.frombuffer(companion.encode(), dtype=np.uint8)
        try:
            self._write(f"{name}.npz", lambda fh: np.savez(fh, **payload))
        except BaseException:
            if companion is not None and companion != previous:
                (self.path / companion).unlink(missing_ok=True)
            raise
        self._fixed[name] = (companion, identities)
        if previous is not None and previous != companion:
            (self.path / previous).unlink(missing_ok=True)  # only now that no checkpoint names it

    def save_bytes(self, name: str, data: bytes) -> None:
        """A write-once companion file (e.g. the coordinator's keys), kept out of the per-step checkpoint."""
        self._write(f"{name}.bin", lambda fh: fh.write(data))

    def load_bytes(self, name: str) -> bytes:
        assert self.path is not None
        return (self.path / f"{name}.bin").read_bytes()

    def secret(self, name: str) -> bytes | None:
        """This party's long-term secret ``name``: 32 bytes of OS entropy made on first use, kept in
        ``secrets/<name>.bin`` here (mode 0600, written atomically) and the same after every restart; None without a
        folder. Its own subfolder: closing a session removes that session's ``<id>.bin``, and an id may be ``name``."""
        if self.path is None:
            return None
        folder = StateDir(self.path / "secrets")
        file = self.path / "secrets" / f"{name}.bin"
        if not file.exists():
            folder.save_bytes(name, new_key())
        secret = file.read_bytes()
        if len(secret) != KEY_BYTES:
            raise ValueError(
                f"{file} holds {len(secret)} bytes, not a {KEY_BYTES}-byte secret: restore it from a backup (removing "
                "it makes a new secret, and the party's later sessions no longer share what the old one gave them)"
            )
        return secret

    def long_term_array(
        self,
        name: str,
        make: Callable[[], np.ndarray] | None,
        check: Callable[[np.ndarray], str | None] = lambda a: None,
    ) -> np.ndarray | None:
        """This party's long-term array ``name`` (e.g. masquerade's K): ``make()`` on first use, kept beside the
        secrets in ``secrets/<name>.npy`` (mode 0600, written atomically) and loaded as stored after every restart,
        also when what ``make`` reads changed since; without a folder ``make()``, for the process. ``make=None``:
        the stored array, if any. ``check`` returns why a stored array no longer fits (a ValueError naming the
        file), or None."""
        if self.path is None:
            return make() if make is not None else None
        file = self.path / "secrets" / f"{name}.npy"
        if not file.exists():
            if make is None:
                return None
            array = np.asarray(make())
            StateDir(file.parent)._write(file.name, lambda fh: np.save(fh, array, allow_pickle=False))
        try:
            array = np.load(file, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{file} cannot be read ({exc}): restore it from a backup") from exc
        problem = check(array)
        if problem is not None:
            raise ValueError(f"{file}: {problem}")
        return array

    def _write(self, filename: str, write: Callable[[BinaryIO], object]) -> None:
        if self.path is None:
            return
        if not _valid_name(filename) and not _FIXED.match(filename):
            raise ValueError(f"invalid checkpoint name {filename!r}")
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=f".{filename}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o600)  # the coordinator's checkpoint holds the secret key
            os.replace(tmp, self.path / filename)
            dir_fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def load_all(self, *, skip_unreadable: bool = False) -> dict[str, tuple[dict[str, np.ndarray], dict[str, Any]]]:
        """Every checkpoint. One that cannot be read (e.g. its companion is missing or not its own) is a ValueError
        naming it, or with ``skip_unreadable`` (sessions) logged and skipped, its files kept: the party starts with
        every other session. A ledger skips nothing: a budget must not restart from zero."""
        if self.path is None:
            return {}
        states = {}
        kept: set[str] = set()  # companions of unreadable checkpoints: not orphans
        for file in sorted(self.path.glob("*.npz")):
            companion = None
            try:
                with np.load(file) as data:
                    arrays = {k: data[k] for k in data.files if k not in ("__meta__", "__fixed__")}
                    meta = json.loads(bytes(data["__meta__"]).decode())
                    companion = bytes(data["__fixed__"]).decode() if "__fixed__" in data.files else None
                if companion is not None:
                    if not _own_companion(companion, file.stem):
                        raise ValueError(f"it names {companion!r}, not a companion of its own")
                    with np.load(self.path / companion) as data:
                        arrays.update({k: data[k] for k in data.files})
            except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
                if not skip_unreadable:
                    raise ValueError(f"checkpoint {file.stem!r} cannot be read: {file.name}: {exc}") from exc
                if companion is not None and _own_companion(companion, file.stem):
                    kept.add(companion)
                self.set_aside(file.stem, f"{file.name}: {exc}")
                continue
            self._fixed[file.stem] = (companion, {})  # the next save writes a fresh companion
            states[file.stem] = (arrays, meta)
        # A kill between a companion's write and its checkpoint's (or the old companion's removal) leaves one
        # no checkpoint names: drop it.
        named = {companion for companion, _ in self._fixed.values()} | kept
        for file in self.path.glob("*.fixed"):
            if file.name not in named:
                file.unlink(missing_ok=True)
        return states

    def set_aside(self, name: str, why: str) -> None:
        """Checkpoint ``name`` is not restored (``why`` names its file and the reason): logged once and listed in
        :attr:`unreadable`, its files left on disk, untouched, for the operator."""
        if name not in self.unreadable:
            log.error("session %r not restored: %s (its files stay in %s)", name, why, self.path)
        self.unreadable[name] = why

    def remove(self, name: str) -> None:
        if self.path is not None and _valid_name(name):
            for suffix in (".npz", ".bin"):
                (self.path / f"{name}{suffix}").unlink(missing_ok=True)
            companion, _ = self._fixed.pop(name, (None, {}))
            if companion is not None:
                (self.path / companion).unlink(missing_ok=True)


class CountLedger:
    """Each owner's count (the coordinator's samples admitted per owner: its query budget), durable: ``save`` returns
    only once the disk holds the new count. ``None`` keeps the counts in memory only.

    One file per owner, ``<owner>.count``: two slots, each (sequence number, count, checksum) in its own 4 KB page.
    A save writes the slot that does not hold the latest count in place and flushes it with one ``fdatasync`` (the
    file's size and blocks never change, so no metadata is flushed); a load takes the valid slot with the higher
    sequence number. A write torn by a crash spoils only the slot it was writing, whose count was not yet durable,
    so no release can have depended on it; the other slot still holds the last durable count. Rewriting a whole file
    through a temporary one (the npz checkpoints) took two fsyncs, a rename and ~1 ms of CPU per Predict round.
    A file is created, and an earlier release's ``<owner>.npz`` ledger taken over, through StateDir's atomic write;
    ``<owner>.npz`` then holds a marker on which such a release refuses to start (a rollback would reset the budget)."""

    SUFFIX = ".count"
    _SLOT = struct.Struct("<8sQQ")  # magic, sequence number, count; then an 8-byte BLAKE2b checksum of those
    _MAGIC = b"vflsecL1"
    PAGE = 4096  # slot i at offset i * PAGE: a write to one slot never rewrites a byte of the other's page
    # What our <owner>.npz marker names as its companion: an earlier release reads that as "not a companion of its own"
    _MOVED = "moved to <owner>.count: this ledger needs vflsec with CountLedger (review 19); do not roll back past it"

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._dir = StateDir(path)  # creates the folder; removes temporary files a kill left there
        self._seq: dict[str, tuple[int, int]] = {}  # per owner, its file's latest durable (sequence number, slot)

    def load_all(self) -> dict[str, int]:
        """Every owner's count. A file with no valid slot is a ValueError naming it: a budget must not restart from
        zero. Counts of an earlier release's npz ledger are taken over (the larger of the two when both are there: a
        count only grows), and its file replaced by a marker that such a release refuses to start on."""
        if self.path is None:
            return {}
        counts: dict[str, int] = {}
        for file in sorted(self.path.glob(f"*{self.SUFFIX}")):
            owner = file.name[: -len(self.SUFFIX)]
            seq, counts[owner], slot = self._read(file)
            self._seq[owner] = (seq, slot)
        for file in sorted(self.path.glob("*.npz")):  # owners/<owner>.npz, as written before
            legacy = self._legacy(file)
            if legacy is not None and legacy > counts.get(file.stem, -1):
                self.save(file.stem, legacy)
                counts[file.stem] = legacy
        for owner in counts:  # only once the count file holds at least the npz's count
            self._mark(owner)
        return counts

    def _legacy(self, file: Path) -> int | None:
        """The count of an earlier release's npz ledger; None for our marker."""
        try:
            with np.load(file) as data:
                if "__fixed__" in data.files and bytes(data["__fixed__"]).decode() == self._MOVED:
                    return None
                return int(json.loads(bytes(data["__meta__"]).decode())["scored"])
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            raise ValueError(f"ledger {file} cannot be read ({exc}): restore it from a backup") from exc

    def _mark(self, owner: str) -> None:
        """Put our marker at ``<owner>.npz`` (unless there): an earlier release, which reads its ledger from there
        only, refuses to start on it, naming this release, instead of restarting the owner's budget from zero after
        a rollback (review 19)."""
        file = self.path / f"{owner}.npz"
        if not file.exists() or self._legacy(file) is not None:
            marker = {"__meta__": np.frombuffer(b"{}", np.uint8)}
            marker["__fixed__"] = np.frombuffer(self._MOVED.encode(), np.uint8)
            self._dir._write(file.name, lambda fh: np.savez(fh, **marker))

    def save(self, owner: str, count: int) -> None:
        """Make ``count`` the owner's durable count (never less than the last: the caller's counts only grow)."""
        if self.path is None:
            return
        filename = f"{owner}{self.SUFFIX}"
        if not _valid_name(filename):
            raise ValueError(f"invalid ledger owner {owner!r}")
        latest, held = self._seq.get(owner, (0, 1))
        seq, slot = latest + 1, 1 - held  # the slot that does not hold the latest count, wherever that one lies
        if latest == 0:  # a new file, whole (no holes: later writes allocate nothing), renamed into place
            image = self._slot(seq, count) + bytes(2 * self.PAGE - self._SLOT.size - 8)
            self._dir._write(filename, lambda fh: fh.write(image))
            self._mark(owner)
        else:
            data = self._slot(seq, count)
            fd = os.open(self.path / filename, os.O_WRONLY)
            try:
                if os.pwrite(fd, data, slot * self.PAGE) != len(data):  # a short write is not a count (review 19)
                    raise OSError(f"ledger {filename}: short write")
                os.fdatasync(fd)
            finally:
                os.close(fd)
        self._seq[owner] = (seq, slot)  # only now: after a failed write the next rewrites that slot, not the durable

    def _slot(self, seq: int, count: int) -> bytes:
        body = self._SLOT.pack(self._MAGIC, seq, count)
        return body + hashlib.blake2b(body, digest_size=8).digest()

    def _read(self, file: Path) -> tuple[int, int, int]:
        """(sequence number, count, slot) of the file's latest valid slot."""
        data = file.read_bytes()
        if len(data) != 2 * self.PAGE:
            raise ValueError(f"ledger {file} holds {len(data)} bytes, not {2 * self.PAGE}: restore it from a backup")
        valid = []
        for slot, offset in enumerate((0, self.PAGE)):
            body = data[offset : offset + self._SLOT.size]
            digest = data[offset + self._SLOT.size : offset + self._SLOT.size + 8]
            magic, seq, count = self._SLOT.unpack(body)
            if magic == self._MAGIC and hashlib.blake2b(body, digest_size=8).digest() == digest:
                valid.append((seq, count, slot))
        if not valid:
            raise ValueError(f"ledger {file} has no readable count: restore it from a backup")
        return max(valid)


def _own_companion(companion: str, name: str) -> bool:
    """``companion`` is a companion file name of checkpoint ``name`` (so it lies in the folder, and is its own)."""
    match = _FIXED.fullmatch(companion)
    return match is not None and match["name"] == name


def _savez(fh: BinaryIO, arrays: dict[str, Any]) -> None:
    """np.savez's file (stored, not compressed: np.load reads it alike), but an array kept on disk (one with
    ``blocks()``, e.g. spill.Column: P's secret order) is copied in block by block rather than read whole."""
    with zipfile.ZipFile(fh, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for key, value in arrays.items():
            with archive.open(f"{key}.npy", mode="w", force_zip64=True) as out:
                if not hasattr(value, "blocks"):
                    np.lib.format.write_array(out, np.asarray(value))
                    continue
                header = {"descr": np.lib.format.dtype_to_descr(value.dtype), "fortran_order": False}
                np.lib.format.write_array_header_1_0(out, {**header, "shape": (len(value),)})
                for _, block in value.blocks():
                    out.write(block.tobytes())


def _identity(value: Any) -> tuple:
    """(owner of the memory, address, shape, dtype): an array rebuilt at every save from the same unchanged
    attribute (a view of a bytes object) is recognised as written already. The owner is held, so its id is
    never reused while compared. An array on disk (``blocks()``) is itself the owner: it is never read for this."""
    if hasattr(value, "blocks"):
        return value, 0, (len(value),), value.dtype.str
    array = np.asarray(value)
    owner: Any = array
    while isinstance(owner, np.ndarray) and owner.base is not None:
        owner = owner.base
    return owner, array.__array_interface__["data"][0], array.shape, array.dtype.str


def _same(a: tuple, b: tuple) -> bool:
    return a[0] is b[0] and a[1:] == b[1:]


def as_bytes(array: np.ndarray) -> bytes:
    return np.asarray(array, dtype=np.uint8).tobytes()


def from_bytes(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8)
