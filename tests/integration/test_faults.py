"""Crash recovery: SIGKILL the passive party, then the active party, then the coordinator in the middle of
training; each restarts from its checkpoints and the session ends with the model of an uninterrupted run."""

from __future__ import annotations

import sqlite3
import threading
import time

import grpc
import numpy as np
import pytest

from vflsec.client.federation import FederationSpec, run_in_process, run_processes, write_federation
from vflsec.client.operator import Operator
from vflsec.services import datasets

EPOCHS, BATCH = 4, 32  # ~60 steps on breast_cancer


def _spec(store) -> FederationSpec:
    plugin = {"path": "vflsec.services.curious:CuriousPlugin", "options": {"store": str(store)}}
    return FederationSpec(datasets.load_dataset("breast_cancer"), n_passive=1, seed=0, plugins=[plugin])


def _session(operator: Operator) -> tuple[str, list[str]]:
    info = operator.create_session("plain", batch_size=BATCH, seed=11, session_id="faults")
    return info.session_id, sorted(operator.align(info.session_id))


def _model(operator: Operator, session_id: str) -> list[np.ndarray]:
    model = operator.fetch_model(session_id)
    return [model.active_weights, model.bias, model.passive["passive-1"]]


def _rows(store) -> list[tuple]:
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
        return db.execute("SELECT id, kind, sample_ids, meta FROM observations ORDER BY id").fetchall()


@pytest.mark.slow
def test_killed_parties_resume_to_the_uninterrupted_model(tmp_path) -> None:
    baseline_layout = write_federation(_spec(tmp_path / "baseline.sqlite"), tmp_path / "baseline")
    with run_in_process(baseline_layout), baseline_layout.operator_channel() as channel:
        operator = Operator(channel)
        session_id, ids = _session(operator)
        steps = list(operator.train(session_id, ids, EPOCHS))
        expected = _model(operator, session_id)
    total_steps = steps[-1].step
    assert total_steps >= 40

    store = tmp_path / "curious.sqlite"
    layout = write_federation(_spec(store), tmp_path / "faulty")
    kills = {total_steps // 5: "passive-1", 2 * total_steps // 5: "active", 3 * total_steps // 5: "coordinator"}
    with run_processes(layout) as fed, layout.operator_channel() as channel:
        operator = Operator(channel)
        session_id, ids = _session(operator)
        acknowledged: list[tuple] = []
        done, attempts = False, 0
        while not done:
            attempts += 1
            try:
                for progress in operator.train(session_id, ids, EPOCHS):
                    done = progress.done
                    victim = kills.pop(progress.step, None)
                    if victim is None:
                        continue
                    if victim == "active":
                        acknowledged = _rows(store)  # committed rows before the crash
                    # Kill a moment later, in the middle of the next step, then bring the party back.
                    killer = threading.Timer(0.005, fed.kill, args=(victim,))
                    killer.start()
                    killer.join()
                    time.sleep(0.5)
                    fed.restart(victim)
            except grpc.RpcError as exc:
                # Only the active party's death breaks the operator's stream: it resumes with the same request.
                assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                assert attempts < 5
        assert not kills, f"training ended before the kills at steps {sorted(kills)}"
        assert attempts == 2  # the active party's crash cost one Train call; the others were retried inside
        actual = _model(operator, session_id)

    for got, want in zip(actual, expected, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    # The curious store lost no row it had committed before the active party was killed.
    after = _rows(store)
    assert acknowledged and after[: len(acknowledged)] == acknowledged
    # The passive party's and the coordinator's crashes were ridden out by retries with backoff.
    logs = {party: (fed.log_dir / f"{party}.log").read_text() for party in ("active", "passive-1")}
    assert "passive-1 unavailable" in logs["active"]
    assert "coordinator unavailable" in logs["active"] + logs["passive-1"]
