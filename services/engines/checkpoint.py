"""Durable session state: one file per session, replaced atomically, so a party killed at any point restarts
from its last completed step.

A checkpoint is a ``.npz`` of named arrays plus a JSON document (stored as the ``__meta__`` byte array).
It is written to a temporary file in the same folder, flushed to disk, then renamed over the old one.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def valid_session_id(session_id: str) -> bool:
    """Session IDs name checkpoint files, so they are restricted to a safe alphabet."""
    return bool(_NAME.match(session_id)) and ".." not in session_id


class StateDir:
    """A folder of session checkpoints; ``None`` keeps state in memory only."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        if path is not None:
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
            # A kill between mkstemp and os.replace leaves a temporary file (which may hold a secret key):
            # nothing reads it, so it goes at start-up. Only this class writes ".<name>.<random>.tmp" here.
            for leftover in path.glob(".*.tmp"):
                leftover.unlink(missing_ok=True)

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def save(self, name: str, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        payload = {k: np.asarray(v) for k, v in arrays.items()}
        payload["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        self._write(f"{name}.npz", lambda fh: np.savez(fh, **payload))

    def save_bytes(self, name: str, data: bytes) -> None:
        """A write-once companion file (e.g. the coordinator's keys), kept out of the per-step checkpoint."""
        self._write(f"{name}.bin", lambda fh: fh.write(data))

    def load_bytes(self, name: str) -> bytes:
        assert self.path is not None
        return (self.path / f"{name}.bin").read_bytes()

    def _write(self, filename: str, write: Callable[[BinaryIO], object]) -> None:
        if self.path is None:
            return
        if not valid_session_id(filename):
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

    def load_all(self) -> dict[str, tuple[dict[str, np.ndarray], dict[str, Any]]]:
        if self.path is None:
            return {}
        states = {}
        for file in sorted(self.path.glob("*.npz")):
            with np.load(file) as data:
                arrays = {k: data[k] for k in data.files if k != "__meta__"}
                meta = json.loads(bytes(data["__meta__"]).decode())
            states[file.stem] = (arrays, meta)
        return states

    def remove(self, name: str) -> None:
        if self.path is not None and valid_session_id(name):
            for suffix in (".npz", ".bin"):
                (self.path / f"{name}{suffix}").unlink(missing_ok=True)


def as_bytes(array: np.ndarray) -> bytes:
    return np.asarray(array, dtype=np.uint8).tobytes()


def from_bytes(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8)
