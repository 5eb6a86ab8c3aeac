"""Party plugin hooks: every message the active party receives is offered to its plugins; a passive party offers
what it receives in training (services/kinds.py) to its own, under the same contract.

A plugin is any object with ``observe(observation)`` (and optionally ``close()``), loaded from a party's
config by dotted path (``"package.module:Factory"``) or by entry-point name (group
``vflsec.plugins``); the factory receives the config's ``options`` as keyword arguments.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol

import numpy as np

# Observation kinds, one per kind of message a party receives (defined in services/kinds.py).
from vflsec.services.kinds import (  # noqa: F401  (re-exported: plugins.GRADIENT, ...)
    BLOCK_GRADIENT,
    EMBEDDINGS,
    ENCRYPTED_SCORES,
    GRADIENT,
    NODE_ROWS,
    OWN_MODEL,
    OWN_SPLIT,
    PUBLIC_CONTEXT,
    RELEASED_MODEL,
    RELEASED_SCORES,
    SESSION,
    TRAINING_DATA,
)


@dataclass(frozen=True)
class Observation:
    kind: str
    session_id: str
    arrays: Mapping[str, np.ndarray] = field(default_factory=dict)
    blobs: Mapping[str, Sequence[bytes]] = field(default_factory=dict)
    sample_ids: tuple[str, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""  # the party the message came from
    received_at: float = field(default_factory=time.time)


class ActivePlugin(Protocol):
    def observe(self, observation: Observation) -> None: ...


class PluginError(RuntimeError):
    pass


def load_plugin(path: str, options: Mapping[str, Any] | None = None) -> ActivePlugin:
    options = dict(options or {})
    if ":" in path:
        module_name, _, attr = path.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise PluginError(f"cannot load plugin {path!r}: {exc}") from exc
    else:
        matches = [ep for ep in entry_points(group="vflsec.plugins") if ep.name == path]
        if not matches:
            raise PluginError(f"no plugin entry point named {path!r} in group 'vflsec.plugins'")
        factory = matches[0].load()
    plugin = factory(**options)
    if not callable(getattr(plugin, "observe", None)):
        raise PluginError(f"plugin {path!r} has no observe(observation) method")
    return plugin


class PluginHub:
    """Fans observations out to plugins. A failing plugin is logged, never allowed to break the protocol."""

    def __init__(self, plugins: Sequence[ActivePlugin] = ()) -> None:
        self.plugins = list(plugins)
        self.failures: list[str] = []

    def emit(self, observation: Observation) -> None:
        for plugin in self.plugins:
            try:
                plugin.observe(observation)
            except Exception as exc:  # a plugin bug must not stop training
                self.failures.append(f"{type(plugin).__name__}: {exc!r}")

    @property
    def active(self) -> bool:
        return bool(self.plugins)

    def close(self) -> None:
        for plugin in self.plugins:
            close = getattr(plugin, "close", None)
            if callable(close):
                close()


class Recorder:
    """Minimal transcript recorder: one JSON line per observation plus its arrays and blobs on disk.

    It exists to prove what the active party sees (tests, audits); the curious plugin is the real store.
    """

    def __init__(self, dir: str) -> None:
        self.dir = Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._count = 0
        self._index = (self.dir / "transcript.jsonl").open("a", encoding="utf-8")

    def observe(self, observation: Observation) -> None:
        with self._lock:
            n = self._count
            self._count += 1
            entry: dict[str, Any] = {
                "n": n,
                "kind": observation.kind,
                "session_id": observation.session_id,
                "source": observation.source,
                "received_at": observation.received_at,
                "sample_ids": list(observation.sample_ids),
                "meta": jsonable(observation.meta),
                "arrays": {k: list(np.shape(v)) for k, v in observation.arrays.items()},
                "blobs": {},
            }
            if observation.arrays:
                np.savez(self.dir / f"{n:06d}.npz", **{k: np.asarray(v) for k, v in observation.arrays.items()})
            for name, items in observation.blobs.items():
                digests = []
                for i, blob in enumerate(items):
                    (self.dir / f"{n:06d}.{name}.{i}.bin").write_bytes(blob)
                    digests.append(hashlib.sha256(blob).hexdigest())
                entry["blobs"][name] = digests
            self._index.write(json.dumps(entry) + "\n")
            self._index.flush()

    def close(self) -> None:
        self._index.close()


def jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value
