"""Crash recovery: SIGKILL the passive party, then the active party, then the coordinator in the middle of
training; each restarts from its checkpoints and the session ends with the model of an uninterrupted run."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import zipfile

import grpc
import numpy as np
import pytest

from vflsec.client.federation.launcher import FederationSpec, run_in_process, run_processes, wait_for, write_federation
from vflsec.client.federation.operator import Operator
from vflsec.services.data import datasets

EPOCHS, BATCH = 5, 32  # ~85 steps on breast_cancer


def _spec(store) -> FederationSpec:
    plugin = {"path": "vflsec.services.plugins.curious:CuriousPlugin", "options": {"store": str(store)}}
    ds = datasets.load_dataset("breast_cancer")
    # Training keys rotate every 10 steps (instead of the derived 66), so the kills land in different key epochs.
    limits = {"key_rotation_steps": 10}
    return FederationSpec(ds, n_passive=1, seed=0, plugins=[plugin], allow_plain=True, limits=limits)


def _session(operator: Operator, backend: str) -> tuple[str, list[str]]:
    info = operator.create_session(backend, batch_size=BATCH, seed=11, session_id="faults")
    return info.session_id, sorted(operator.align(info.session_id))


def _model(operator: Operator, session_id: str) -> list[np.ndarray]:
    model = operator.fetch_model(session_id)
    return [model.active_weights, model.bias, model.passive["passive-1"]]


def _completed_step(layout, session_id: str) -> int:
    """The last training step the active party has checkpointed (-1 before its first checkpoint)."""
    try:
        with np.load(layout.workdir / "active" / "state" / f"{session_id}.npz") as data:
            return json.loads(bytes(data["__meta__"]))["step"]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return -1


def _rows(store) -> list[tuple]:
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
        return db.execute("SELECT id, kind, sample_ids, meta FROM observations ORDER BY id").fetchall()


@pytest.mark.slow
# plain is exact; under ckks each run floods its block sums with its own fresh noise (he.BLOCK_SUM_FLOODING), and
# Adam turns that noise on near-zero gradient components into steps of up to the learning rate, so the two runs
# agree only roughly (measured: up to 5.05 % of the largest weight; 5 % failed once). The plain case checks that a
# resume is exact; under ckks a replay that were refused or decrypted anew would fail the run itself.
@pytest.mark.parametrize(("backend", "tolerance"), [("plain", 1e-6), ("ckks", 0.2)])
def test_killed_parties_resume_to_the_uninterrupted_model(tmp_path, backend: str, tolerance: float) -> None:
    baseline_layout = write_federation(_spec(tmp_path / "baseline.sqlite"), tmp_path / "baseline")
    with run_in_process(baseline_layout), baseline_layout.operator_channel() as channel:
        operator = Operator(channel)
        session_id, ids = _session(operator, backend)
        steps = list(operator.train(session_id, ids, EPOCHS))
        expected = _model(operator, session_id)
    total_steps = steps[-1].step
    assert total_steps >= 40

    store = tmp_path / "curious.sqlite"
    layout = write_federation(_spec(store), tmp_path / "faulty")
    # Kills follow the active party's real progress (its checkpoint), not the progress stream, which may lag
    # behind on a busy machine; the last one leaves more than half of the training to go.
    kills = [
        (15 * total_steps // 100, "passive-1"),
        (30 * total_steps // 100, "active"),
        (45 * total_steps // 100, "coordinator"),
    ]
    killed: list[tuple[str, int]] = []
    acknowledged: list[tuple] = []
    with run_processes(layout) as fed, layout.operator_channel() as channel:
        operator = Operator(channel)
        session_id, ids = _session(operator, backend)

        finished = threading.Event()

        def chaos() -> None:
            for threshold, victim in kills:
                while (step := _completed_step(layout, session_id)) < threshold:
                    if finished.wait(0.002):
                        return  # training ended first: the assertions below report the missing kills
                if victim == "active":
                    acknowledged.extend(_rows(store))  # committed rows before the crash
                fed.kill(victim)
                killed.append((victim, step))
                time.sleep(0.5)
                fed.start(victim)  # its peers retry until it is back; no need to wait here

        monkey = threading.Thread(target=chaos, daemon=True)
        monkey.start()
        done, attempts = False, 0
        while not done:
            attempts += 1
            try:
                for progress in operator.train(session_id, ids, EPOCHS):
                    done = progress.done
            except grpc.RpcError as exc:
                # Only the active party's death breaks the operator's stream: it resumes with the same request.
                assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                assert attempts < 3
                wait_for(channel, "active", 60)
        finished.set()
        monkey.join(60)
        assert [victim for victim, _ in killed] == ["passive-1", "active", "coordinator"]
        assert all(step < total_steps for _, step in killed), killed  # every kill landed mid-training
        assert attempts == 2  # the active party's crash cost one Train call; the others were retried inside
        actual = _model(operator, session_id)
    # Keys rotated through the crashes, and only the last step's epoch is still kept.
    state = layout.workdir / "coordinator" / "state"
    with np.load(state / f"{session_id}.npz") as data:
        meta = json.loads(bytes(data["__meta__"]))
    assert meta["rotation"] == 10 and meta["epochs"] == [total_steps // 10]
    assert [f.name for f in (state / "epochs").iterdir()] == [f"{session_id}.e{total_steps // 10}.bin"]

    for got, want in zip(actual, expected, strict=True):
        scale = 1.0 if backend == "plain" else np.abs(want).max()
        np.testing.assert_allclose(got, want, atol=tolerance * scale, rtol=0)
    # The curious store lost no row it had committed before the active party was killed.
    after = _rows(store)
    assert acknowledged and after[: len(acknowledged)] == acknowledged
    # The passive party's and the coordinator's crashes were ridden out by retries with backoff.
    logs = {party: (fed.log_dir / f"{party}.log").read_text() for party in ("active", "passive-1")}
    assert "passive-1 unavailable" in logs["active"]
    assert "coordinator unavailable" in logs["active"] + logs["passive-1"]
