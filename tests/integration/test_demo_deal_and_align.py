"""The demo deals shards chunk by chunk (each party's file holds exactly its dealt rows of the table) and aligns
once: the dealer knows the training rows, so the training session itself runs the only PSI exchange."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from vflsec.client.cli import app
from vflsec.client.experiments import runs
from vflsec.client.federation import demo
from vflsec.client.federation import launcher as federation
from vflsec.client.federation.operator import Operator
from vflsec.services.data import datasets


def test_shards_dealt_in_chunks_hold_exactly_each_partys_rows(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(federation, "SHARD_CHUNK_ROWS", 50)  # breast_cancer's ~540 rows per party: 11 chunks
    spec = federation.FederationSpec("breast_cancer", n_passive=2, seed=3)
    written: list[int] = []
    layout = federation.write_federation(spec, tmp_path, on_rows=written.append)
    ds = spec.data
    assert sum(written) == sum(len(rows) for rows in spec.party_rows) and max(written) == 50
    parties = ["active", "passive-1", "passive-2"]
    for party, rows, ids, columns in zip(parties, spec.party_rows, spec.id_sets(), spec.split.parties, strict=True):
        shard = datasets.read_party_csv(layout.configs[party].parent / "data.csv")
        assert shard.ids.tolist() == ds.ids[rows].tolist() == ids.tolist()
        np.testing.assert_array_equal(shard.X, ds.X[np.ix_(rows, ds.column_indices(columns))])
        assert (shard.y is None) == (party != "active")


def test_the_demo_aligns_once(monkeypatch) -> None:
    monkeypatch.setattr(demo, "run_processes", runs.run_in_process)
    aligned: list[str] = []
    real_align = Operator.align

    def counting_align(self: Operator, session_id: str, progress=None) -> list[str]:  # type: ignore[no-untyped-def]
        aligned.append(session_id)
        return real_align(self, session_id, progress)

    monkeypatch.setattr(Operator, "align", counting_align)
    result = CliRunner().invoke(app, ["demo", "--dataset", "wine", "--backend", "plain", "--epochs", "2", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert len(aligned) == 1 and report["n_train"] > 0 and report["accuracy"] > 0.5


def test_a_held_out_split_beyond_the_query_cap_is_predicted_in_queries_under_it() -> None:
    from vflsec.client.federation.operator import Released
    from vflsec.services.config import ServiceConfig

    cap = ServiceConfig.__dataclass_fields__["max_query_rows"].default
    asked: list[int] = []

    class Coordinator:  # the coordinator's bound as it enforces it, and one score row per asked row
        def predict(self, session_id: str, ids: list[str]) -> Released:
            assert len(ids) <= cap, f"{len(ids)} rows in one query; the limit is {cap}"
            asked.append(len(ids))
            return Released(list(ids), np.zeros((len(ids), 2)), [("none", {})], 1)

    ids = [f"s{i}" for i in range(2 * cap + 7)]
    done: list[int] = []
    released = demo.predict_all(Coordinator(), "s", ids, done.append)  # type: ignore[arg-type]
    assert asked == [cap, cap, 7] and done == asked and released.sample_ids == ids
    assert released.scores.shape == (len(ids), 2) and released.argmax_changed == 3


def test_run_aligns_once_with_an_explicit_batch_and_counts_the_rows_first_without(tmp_path: Path, monkeypatch) -> None:
    layout = federation.write_federation(federation.FederationSpec("wine", backend="plain"), tmp_path)
    labels_file = layout.configs["active"].parent / "data.csv"
    aligned: list[str] = []
    real_align = Operator.align
    monkeypatch.setattr(
        Operator, "align", lambda self, sid, progress=None: aligned.append(sid) or real_align(self, sid, progress)
    )
    with runs.run_in_process(layout), layout.operator_channel() as channel:
        for batch, exchanges in ((0, 2), (64, 1)):  # `vflsec run`: the spec names the labels file, nothing dealt
            aligned.clear()
            spec = federation.FederationSpec(str(labels_file), backend="plain", epochs=1, batch_size=batch)
            report = demo.evaluate(channel, demo.operator_labels(labels_file), spec)
            assert len(aligned) == exchanges and report["batch_size"] == (batch or 64)
