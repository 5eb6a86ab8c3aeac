"""The curious plugin: a durable, append-only record of everything a party receives (the active party; a passive
party for the label attacks: the same store and contract), and the bridge from those recordings to the attack
contract (:class:`vflsec.services.attacks.Observations`: :func:`observations` for the active party's feature
attacks, :func:`label_observations` for a passive party's label attacks).

Store: SQLite in WAL mode, one row per observation, arrays as blobs with dtype and shape, keyed by session.
A row is acknowledged once its transaction has committed; by default (``durability="process"``) that
survives any crash or restart of the active party, and ``durability="power"`` adds an fsync per commit so
that it survives a power cut too. Ciphertexts are useless to the attacks and large (~330 KB each), so by default
only their count and sizes are kept; ``ciphertexts="digest"`` adds their SHA-256, ``"full"`` the bytes.
"""

from __future__ import annotations

import hashlib
import json
import queue
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vflsec.services import plugins
from vflsec.services.attacks import Observations
from vflsec.services.attacks.gradient import PassiveBottoms, ReleasedSplitNN, released_splitnn
from vflsec.services.attacks.released import released_trees_of
from vflsec.services.registry import parse_spec

SCHEMA = """
CREATE TABLE IF NOT EXISTS observations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    source TEXT NOT NULL,
    received_at REAL NOT NULL,
    sample_ids TEXT NOT NULL,
    meta TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS observations_by_session ON observations (session_id, kind, id);
CREATE TABLE IF NOT EXISTS arrays (
    observation_id INTEGER NOT NULL REFERENCES observations (id),
    name TEXT NOT NULL,
    dtype TEXT NOT NULL,
    shape TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (observation_id, name)
);
CREATE TABLE IF NOT EXISTS blobs (
    observation_id INTEGER NOT NULL REFERENCES observations (id),
    name TEXT NOT NULL,
    position INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    size INTEGER NOT NULL,
    data BLOB,
    PRIMARY KEY (observation_id, name, position)
);
"""


# "process": a committed row survives any crash of the active party (WAL, synchronous=NORMAL: the commit is in
# the operating system before it is acknowledged); "power": it also survives a power cut (an fsync per commit).
_SYNCHRONOUS = {"process": "NORMAL", "power": "FULL"}


@dataclass(frozen=True)
class Recorded:
    id: int
    session_id: str
    kind: str
    source: str
    received_at: float
    sample_ids: list[str]
    meta: dict[str, Any]
    arrays: dict[str, np.ndarray]


class ObservationStore:
    def __init__(self, path: str | Path, *, ciphertexts: str = "size", durability: str = "process") -> None:
        if ciphertexts not in ("size", "digest", "full"):
            raise ValueError(f"ciphertexts must be 'size', 'digest' or 'full', got {ciphertexts!r}")
        if durability not in _SYNCHRONOUS:
            raise ValueError(f"durability must be one of {sorted(_SYNCHRONOUS)}, got {durability!r}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.ciphertexts = ciphertexts
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={_SYNCHRONOUS[durability]}")
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()

    def append(self, obs: plugins.Observation) -> int:
        """Store one observation atomically; returns its id once it is durable."""
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                cur.execute(
                    "INSERT INTO observations (session_id, kind, source, received_at, sample_ids, meta)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        obs.session_id,
                        obs.kind,
                        obs.source,
                        obs.received_at,
                        json.dumps(list(obs.sample_ids)),
                        json.dumps(plugins.jsonable(obs.meta)),
                    ),
                )
                oid = int(cur.lastrowid)
                cur.executemany(
                    "INSERT INTO arrays VALUES (?, ?, ?, ?, ?)",
                    [_array_row(oid, name, value) for name, value in obs.arrays.items()],
                )
                cur.executemany(
                    "INSERT INTO blobs VALUES (?, ?, ?, ?, ?, ?)",
                    [
                        (
                            oid,
                            name,
                            i,
                            "" if self.ciphertexts == "size" else hashlib.sha256(blob).hexdigest(),
                            len(blob),
                            blob if self.ciphertexts == "full" else None,
                        )
                        for name, items in obs.blobs.items()
                        for i, blob in enumerate(items)
                    ],
                )
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise
        return oid

    def sessions(self) -> list[str]:
        rows = self._db.execute("SELECT session_id FROM observations GROUP BY session_id ORDER BY MIN(id)")
        return [r[0] for r in rows]

    def count(self, session_id: str | None = None, kind: str | None = None) -> int:
        query, args = _filter("SELECT COUNT(*) FROM observations", session_id, kind)
        return int(self._db.execute(query, args).fetchone()[0])

    def read(self, session_id: str | None = None, kind: str | None = None) -> Iterator[Recorded]:
        query, args = _filter(
            "SELECT id, session_id, kind, source, received_at, sample_ids, meta FROM observations", session_id, kind
        )
        for oid, sid, k, source, at, ids, meta in self._db.execute(query + " ORDER BY id", args).fetchall():
            arrays = {
                name: np.frombuffer(data, dtype=np.dtype(dtype)).reshape(json.loads(shape))
                for name, dtype, shape, data in self._db.execute(
                    "SELECT name, dtype, shape, data FROM arrays WHERE observation_id = ?", (oid,)
                )
            }
            yield Recorded(oid, sid, k, source, at, json.loads(ids), json.loads(meta), arrays)

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _filter(query: str, session_id: str | None, kind: str | None) -> tuple[str, list[str]]:
    clauses, args = [], []
    if session_id is not None:
        clauses.append("session_id = ?")
        args.append(session_id)
    if kind is not None:
        clauses.append("kind = ?")
        args.append(kind)
    return (query + (" WHERE " + " AND ".join(clauses) if clauses else "")), args


def _array_row(oid: int, name: str, value: np.ndarray) -> tuple[int, str, str, str, bytes]:
    array = np.ascontiguousarray(value)
    return oid, name, array.dtype.str, json.dumps(list(array.shape)), array.tobytes()


class CuriousPlugin:
    """A party's plugin (the active party's, or a passive party's):
    ``[[plugins]] path = "vflsec.services.plugins.curious:CuriousPlugin"``, ``options = { store = "curious.sqlite" }``.

    Observations are written by a background thread so that recording stays off the protocol's critical
    path; the queue is bounded (``max_pending``), so a slow disk applies back-pressure instead of growing
    memory. A row counts as recorded once its transaction has committed; ``flush()`` waits for that.
    """

    def __init__(
        self, store: str, ciphertexts: str = "size", durability: str = "process", max_pending: int = 256
    ) -> None:
        self.store = ObservationStore(store, ciphertexts=ciphertexts, durability=durability)
        self._queue: queue.Queue[plugins.Observation | None] = queue.Queue(maxsize=max_pending)
        self.errors: list[str] = []
        self._writer = threading.Thread(target=self._write, name="curious-writer", daemon=True)
        self._writer.start()

    def observe(self, observation: plugins.Observation) -> None:
        self._queue.put(observation)

    def _write(self) -> None:
        while (observation := self._queue.get()) is not None:
            try:
                self.store.append(observation)
            except Exception as exc:  # keep recording the rest; the failure is reported, not hidden
                self.errors.append(f"{observation.kind}: {exc!r}")
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def flush(self) -> None:
        self._queue.join()

    def close(self) -> None:
        self._queue.put(None)
        self._writer.join()
        self.store.close()


def observations(store: ObservationStore, session_id: str) -> tuple[Observations, list[str]]:
    """Everything the active party received in a session, as the attack contract's input.

    Rows are the released score vectors in the order received (with the active party's own features at that
    moment); the model is the last one released; the passive blocks are concatenated in party order and count
    as withheld if any party's block was withheld. Returns the observations and the queried sample IDs.
    """
    schema = _session(store, session_id)
    released = _recorded(store, session_id, plugins.RELEASED_SCORES, "has no released scores recorded")
    x_active = np.vstack([r.arrays["own_features"] for r in released])
    scores = np.vstack([r.arrays["scores"] for r in released])
    sample_ids = [i for r in released for i in r.sample_ids]
    passive_parties = list(schema["passive_features"])
    announced = schema.get("embedding_release", {})  # the passive parties' embedding defenses (Kerckhoffs)
    model: dict[str, Any] = {}
    models = list(store.read(session_id, plugins.RELEASED_MODEL))
    if models:
        last = models[-1]
        model["param_chain"] = tuple((name, params) for name, params in last.meta.get("steps", ()))
        if "w_active" in last.arrays:  # LR's blocks; other families release named tensors of their own
            model["w_active"], model["bias"] = last.arrays["w_active"], last.arrays["bias"]
            blocks = [last.arrays.get(f"w_passive/{party}") for party in passive_parties]
            if all(b is not None for b in blocks):
                model["w_passive"] = np.hstack(blocks)
        elif "tree/nodes" in last.arrays:  # a tree or forest: passive thresholds are None where withheld
            widths = [int(schema["passive_features"][party]) for party in passive_parties]
            model["released_trees"] = released_trees_of(last.arrays, widths)
        elif schema.get("family") == "splitnn":  # every bottom and the top, unless a bottom was withheld
            features = [len(schema["active_features"]), *(int(schema["passive_features"][p]) for p in passive_parties)]
            network = released_splitnn(last.arrays, schema["settings"], features, int(schema["n_classes"]))
            if network is not None:
                model["score_model"] = ReleasedSplitNN(network)
                if network.config.topology == "active-top":
                    # one passive party: its bottom itself, so that embedding_ls can read a single linear layer
                    single = len(passive_parties) == 1
                    model["passive_bottom"] = network.bottoms[1] if single else PassiveBottoms(network)
    embeddings = _embeddings(store, session_id, passive_parties, sample_ids)
    if embeddings is not None:
        model["embeddings"] = embeddings
    training = list(store.read(session_id, plugins.TRAINING_DATA))
    if training:
        model["train_x_active"] = training[-1].arrays["features"]
        model["train_y"] = training[-1].arrays["labels"]
    obs = Observations(
        x_active=x_active,
        scores=scores,
        n_classes=int(schema["n_classes"]),
        d_passive=int(sum(schema["passive_features"].values())),
        release=tuple(released[-1].meta.get("chain", ())),
        score_chain=tuple((name, params) for name, params in released[-1].meta.get("steps", ())),
        embedding_chain=tuple(
            (name, params) for party in passive_parties for name, params in announced.get(party, ())
        ),
        **model,
    )
    return obs, sample_ids


def _embeddings(
    store: ObservationStore, session_id: str, parties: list[str], sample_ids: list[str]
) -> np.ndarray | None:
    """The passive outputs z_p received in the clear at inference (split-NN active-top), one row per queried sample,
    the parties' columns side by side in party order; None unless every queried row has every party's."""
    received: dict[str, dict[str, np.ndarray]] = {party: {} for party in parties}
    for r in store.read(session_id, plugins.EMBEDDINGS):
        if r.meta.get("step") == 0 and r.source in received:
            received[r.source].update(zip(r.sample_ids, r.arrays["z"], strict=True))
    if not sample_ids or not all(set(sample_ids) <= set(rows) for rows in received.values()):
        return None
    return np.hstack([np.vstack([received[party][i] for i in sample_ids]) for party in parties])


def label_observations(store: ObservationStore, session_id: str) -> tuple[Observations, list[str]]:
    """Everything a curious passive party received in a session's training, and what it holds of its own, as the attack
    contract's input for the label attacks. Its rows are its training rows under its own IDs: split-NN, those it was
    sent ∂L/∂h for, in the order first seen (each gradient row tied to its row and step); LR, its training rows, with
    its own gradient of each step and the step's rows; trees, its training rows in the order the nodes name them, with
    the rows of every node it saw. Beside them its own features and, once the model is finished, its own model's
    output on them. Returns the observations and those sample IDs."""
    joined = _session(store, session_id)
    family = joined.get("family", "splitnn")
    training = list(store.read(session_id, plugins.TRAINING_DATA))
    own: dict[str, np.ndarray] = {}
    for r in training:  # its own rows (the tree's own list comes first: the nodes' positions refer to its order)
        own.update(zip(r.sample_ids, r.arrays["features"], strict=True))
    fields: dict[str, Any] = {}
    if family == "splitnn":
        received = _recorded(
            store, session_id, plugins.GRADIENT, "has no gradients recorded (a split-NN session trains with them)"
        )
        ids = _first_seen(i for r in received for i in r.sample_ids)
        position = {sample: i for i, sample in enumerate(ids)}
        fields = {
            "gradients": np.vstack([r.arrays["gradient"] for r in received]),
            "gradient_rows": np.array([position[i] for r in received for i in r.sample_ids], dtype=np.int64),
            "gradient_steps": np.concatenate([np.full(len(r.sample_ids), int(r.meta["step"])) for r in received]),
            # the active party's gradient defenses, as the session's settings name them (Kerckhoffs)
            "gradient_chain": tuple(parse_spec(s) for s in joined.get("settings", {}).get("gradient_defense", ())),
        }
    elif family == "lr":
        received = _recorded(store, session_id, plugins.BLOCK_GRADIENT, "has no gradients of its own block recorded")
        ids = _first_seen([*(i for r in received for i in r.sample_ids), *own])
        position = {sample: i for i, sample in enumerate(ids)}
        fields = {
            "block_gradients": np.stack([r.arrays["gradient"] for r in received]),
            "block_rows": tuple(np.array([position[i] for i in r.sample_ids], dtype=np.int64) for r in received),
        }
    else:  # trees: the nodes name training positions of the party's own list of training rows
        tree_rows = [r for r in training if r.meta.get("tree_rows")]
        if not tree_rows:
            raise LookupError(f"session {session_id!r} has no tree training rows recorded at this party")
        ids = list(tree_rows[-1].sample_ids)
        searched = list(store.read(session_id, plugins.NODE_ROWS))
        partitions = [r.arrays["rows"] for r in searched]
        nodes = [(int(r.meta["tree"]), int(r.meta["node_id"])) for r in searched]
        for r in store.read(session_id, plugins.OWN_SPLIT):
            left = r.arrays["goes_left"].astype(bool)
            partitions += [r.arrays["rows"][left], r.arrays["rows"][~left]]
            tree, node = int(r.meta["tree"]), int(r.meta["node_id"])
            nodes += [(tree, 2 * node + 1), (tree, 2 * node + 2)]  # its sides are the node's children
        kept = [i for i, p in enumerate(partitions) if len(p)]
        fields = {
            "partitions": tuple(np.asarray(partitions[i], dtype=np.int64) for i in kept),
            "partition_nodes": tuple(nodes[i] for i in kept),
            # the session's public tree settings, the partition defense included (Kerckhoffs)
            "tree_settings": {**joined.get("settings", {}), "kind": family},
        }
    x_own = np.vstack([own[i] for i in ids]) if ids and all(i in own for i in ids) else None
    outputs: dict[str, np.ndarray] = {}
    for r in store.read(session_id, plugins.OWN_MODEL):
        outputs = dict(zip(r.sample_ids, r.arrays["outputs"], strict=True))  # the last finished model's
    obs = Observations(
        x_active=np.zeros((len(ids), 0)),  # a passive attacker holds no active features
        scores=None,
        n_classes=int(joined["n_classes"]),
        d_passive=int(joined["n_features"]),
        x_own=x_own,
        own_outputs=np.vstack([outputs[i] for i in ids]) if ids and all(i in outputs for i in ids) else None,
        **fields,
    )
    return obs, ids


def _first_seen(ids: Iterable[str]) -> list[str]:
    """Distinct IDs in the order first seen."""
    return list(dict.fromkeys(ids))


def _session(store: ObservationStore, session_id: str) -> dict[str, Any]:
    """The meta of the session's last SESSION observation, else LookupError."""
    sessions = list(store.read(session_id, plugins.SESSION))
    if not sessions:
        raise LookupError(f"no recorded session {session_id!r} in {store.path}")
    return sessions[-1].meta


def _recorded(store: ObservationStore, session_id: str, kind: str, missing: str) -> list[Any]:
    """Every recorded observation of ``kind`` in the session, oldest first; LookupError naming what is missing."""
    found = list(store.read(session_id, kind))
    if not found:
        raise LookupError(f"session {session_id!r} {missing}")
    return found
