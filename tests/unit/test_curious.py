"""The curious plugin's store: exact round trips, durability across a killed process, and the bridge to the
attack contract."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from vflsec.services import plugins
from vflsec.services.plugins import curious


def _session(store_or_plugin, sid: str = "s1", passive: dict | None = None) -> None:
    meta = {"n_classes": 3, "passive_features": passive or {"passive-1": 2, "passive-2": 1}}
    store_or_plugin.append(plugins.Observation(kind=plugins.SESSION, session_id=sid, meta=meta))


def test_round_trip_keeps_dtype_shape_ids_and_meta(tmp_path) -> None:
    store = curious.ObservationStore(tmp_path / "s.sqlite")
    arrays = {
        "scores": np.random.default_rng(0).random((4, 3)),
        "labels": np.arange(4, dtype=np.int64),
        "f32": np.ones((2, 2), dtype=np.float32),
    }
    oid = store.append(
        plugins.Observation(
            kind=plugins.RELEASED_SCORES,
            session_id="s1",
            arrays=arrays,
            sample_ids=("a", "b", "c", "d"),
            meta={"chain": ["privee"], "n": np.int64(3)},
            blobs={"ciphertexts": [b"x" * 10, b"y"]},
            source="coordinator",
        )
    )
    store.append(plugins.Observation(kind=plugins.GRADIENT, session_id="s2"))
    (rec,) = store.read("s1")
    assert rec.id == oid and rec.kind == plugins.RELEASED_SCORES and rec.source == "coordinator"
    assert rec.sample_ids == ["a", "b", "c", "d"] and rec.meta == {"chain": ["privee"], "n": 3}
    for name, value in arrays.items():
        assert rec.arrays[name].dtype == value.dtype
        np.testing.assert_array_equal(rec.arrays[name], value)
    assert store.sessions() == ["s1", "s2"] and store.count() == 2 and store.count("s2", plugins.GRADIENT) == 1
    # Ciphertexts are kept as sizes by default: no digest, no bytes.
    sizes = store._db.execute("SELECT size, sha256, data FROM blobs ORDER BY position").fetchall()
    assert sizes == [(10, "", None), (1, "", None)]
    store.close()


def test_ciphertext_recording_levels(tmp_path) -> None:
    blobs = {"ciphertexts": [b"abc"]}
    for level, data in (("digest", None), ("full", b"abc")):
        store = curious.ObservationStore(tmp_path / f"{level}.sqlite", ciphertexts=level)
        store.append(plugins.Observation(kind=plugins.ENCRYPTED_SCORES, session_id="s", blobs=blobs))
        ((sha, stored),) = store._db.execute("SELECT sha256, data FROM blobs").fetchall()
        assert sha == hashlib.sha256(b"abc").hexdigest() and stored == data
        store.close()
    with pytest.raises(ValueError, match="ciphertexts"):
        curious.ObservationStore(tmp_path / "x.sqlite", ciphertexts="everything")
    with pytest.raises(ValueError, match="durability"):
        curious.ObservationStore(tmp_path / "y.sqlite", durability="eventually")


def test_acknowledged_rows_survive_a_killed_writer(tmp_path) -> None:
    path = tmp_path / "s.sqlite"
    script = textwrap.dedent(f"""
        import os, signal, sys
        import numpy as np
        from vflsec.services.plugins import curious
        from vflsec.services import plugins
        plugin = curious.CuriousPlugin(store={str(path)!r})
        for i in range(25):
            plugin.observe(plugins.Observation(kind="released_scores", session_id="s",
                                               arrays={{"scores": np.full((8, 3), float(i))}}, sample_ids=(str(i),)))
            if i % 5 == 4:
                plugin.flush()
                print(i + 1, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == -9
    acknowledged = int(done.stdout.split()[-1])
    store = curious.ObservationStore(path)  # the active party restarts and reopens its store
    rows = list(store.read("s"))
    assert len(rows) >= acknowledged == 25
    assert [r.sample_ids for r in rows[:acknowledged]] == [[str(i)] for i in range(acknowledged)]
    np.testing.assert_array_equal(rows[7].arrays["scores"], np.full((8, 3), 7.0))
    store.close()


def test_observations_follow_what_was_released(tmp_path) -> None:
    store = curious.ObservationStore(tmp_path / "s.sqlite")
    _session(store)
    rng = np.random.default_rng(1)
    for ids in (("a", "b"), ("c",)):
        store.append(
            plugins.Observation(
                kind=plugins.RELEASED_SCORES,
                session_id="s1",
                sample_ids=ids,
                meta={"chain": ["rounding"]},
                arrays={"scores": rng.dirichlet(np.ones(3), len(ids)), "own_features": rng.random((len(ids), 4))},
            )
        )
    w1, w2 = rng.random((3, 2)), rng.random((3, 1))
    store.append(
        plugins.Observation(
            kind=plugins.RELEASED_MODEL,
            session_id="s1",
            arrays={
                "w_active": rng.random((3, 4)),
                "bias": rng.random(3),
                "w_passive/passive-1": w1,
                "w_passive/passive-2": w2,
            },
        )
    )
    obs, ids = curious.observations(store, "s1")
    assert ids == ["a", "b", "c"] and obs.x_active.shape == (3, 4) and obs.scores.shape == (3, 3)
    assert obs.d_passive == 3 and obs.release == ("rounding",) and obs.train_x_active is None
    np.testing.assert_array_equal(obs.w_passive, np.hstack([w1, w2]))
    # A later release that withholds one block: the passive model counts as withheld.
    store.append(
        plugins.Observation(
            kind=plugins.RELEASED_MODEL,
            session_id="s1",
            arrays={
                "w_active": rng.random((3, 4)),
                "bias": rng.random(3),
                "w_passive/passive-1": w1,
            },
        )
    )
    obs, _ = curious.observations(store, "s1")
    assert obs.w_passive is None and obs.w_active is not None
    with pytest.raises(LookupError):
        curious.observations(store, "no-such-session")
    store.close()


def test_a_failing_plugin_never_breaks_the_protocol() -> None:
    class Broken:
        def observe(self, observation: plugins.Observation) -> None:
            raise RuntimeError("disk full")

    seen: list[str] = []

    class Good:
        def observe(self, observation: plugins.Observation) -> None:
            seen.append(observation.kind)

    hub = plugins.PluginHub([Broken(), Good()])
    hub.emit(plugins.Observation(kind=plugins.GRADIENT, session_id="s"))
    assert seen == [plugins.GRADIENT] and "disk full" in hub.failures[0]


def test_plugins_load_by_dotted_path_and_reject_bad_ones(tmp_path) -> None:
    plugin = plugins.load_plugin("vflsec.services.plugins.curious:CuriousPlugin", {"store": str(tmp_path / "c.sqlite")})
    assert isinstance(plugin, curious.CuriousPlugin)
    plugin.close()
    with pytest.raises(plugins.PluginError):
        plugins.load_plugin("vflsec.services.plugins.curious:Nope")
    with pytest.raises(plugins.PluginError):
        plugins.load_plugin("no-such-entry-point")


def test_a_passive_partys_tree_and_lr_recordings_become_label_observations(tmp_path) -> None:
    """Trees: nodes name positions in the party's own list of training rows (sent at Begin), each side of its own split
    counts as a node seen. LR: each step's own gradient with its rows; the trained model's outputs by sample ID."""
    store = curious.ObservationStore(tmp_path / "passive.sqlite")
    obs = plugins.Observation
    session = {"family": "tree", "n_classes": 2, "n_features": 3}
    store.append(obs(plugins.SESSION, "t", meta=session))
    ids = ("c", "a", "b", "d")
    x = np.arange(12.0).reshape(4, 3)
    store.append(obs(plugins.TRAINING_DATA, "t", sample_ids=ids, arrays={"features": x}, meta={"tree_rows": True}))
    root = {"tree": 0, "node_id": 0, "depth": 0}
    store.append(obs(plugins.NODE_ROWS, "t", arrays={"rows": np.arange(4), "weights": np.ones(4)}, meta=root))
    split = {"rows": np.array([0, 2, 3]), "goes_left": np.array([1, 0, 1])}
    store.append(obs(plugins.OWN_SPLIT, "t", arrays=split, meta={"tree": 0, "node_id": 1}))
    trees, rows = curious.label_observations(store, "t")
    assert rows == list(ids) and np.array_equal(trees.x_own, x)
    assert [p.tolist() for p in trees.partitions] == [[0, 1, 2, 3], [0, 3], [2]]
    assert trees.partition_nodes == ((0, 0), (0, 3), (0, 4))  # a split's sides are its node's children
    assert trees.tree_settings == {"kind": "tree"}  # the session's public settings (none announced here)
    assert trees.gradients is None and trees.own_outputs is None

    store.append(obs(plugins.SESSION, "l", meta={**session, "family": "lr"}))
    for step, batch in ((1, ("b", "a")), (2, ("c", "b"))):
        store.append(obs(plugins.BLOCK_GRADIENT, "l", sample_ids=batch, arrays={"gradient": np.full((1, 3), step)}))
    store.append(obs(plugins.TRAINING_DATA, "l", sample_ids=("a", "b", "c"), arrays={"features": x[:3]}))
    outputs = {"outputs": np.array([[3.0], [1.0], [2.0]])}
    store.append(obs(plugins.OWN_MODEL, "l", sample_ids=("c", "a", "b"), arrays=outputs))
    lr, rows = curious.label_observations(store, "l")
    assert rows == ["b", "a", "c"]  # first seen in the gradients
    assert [r.tolist() for r in lr.block_rows] == [[0, 1], [2, 0]] and lr.block_gradients.shape == (2, 1, 3)
    assert np.array_equal(lr.x_own, x[[1, 0, 2]]) and lr.own_outputs.ravel().tolist() == [2.0, 1.0, 3.0]
    store.close()
