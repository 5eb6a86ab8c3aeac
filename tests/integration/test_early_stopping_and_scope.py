"""Early stopping and the MSE scope (issue 16) through the real services: plain backend, parties in-process,
the CLI's ``attack`` and ``demo``, the curious plugin's recordings and the coordinator's query budget."""

from __future__ import annotations

import json

import grpc
import pytest
from typer.testing import CliRunner

from vflsec.client.cli import app
from vflsec.client.experiments import harness, runs
from vflsec.client.federation import demo
from vflsec.client.federation.launcher import FederationSpec
from vflsec.services import attacks
from vflsec.services.plugins import curious

EPOCHS, PATIENCE, PREDICTIONS = 20, 2, 100


def invoke(monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str]:
    monkeypatch.setattr(runs, "run_processes", runs.run_in_process)  # same services, one process
    monkeypatch.setattr(demo, "run_processes", runs.run_in_process)
    result = CliRunner().invoke(app, [*args, "--backend", "plain", "--dataset", "breast_cancer", "--json"])
    return result.exit_code, result.output


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def check_rule(record: dict) -> None:
    """The record obeys the rule: best = first maximum; stopped exactly PATIENCE epochs after it, or ran out."""
    accuracy = record["validation_accuracy"]
    assert len(accuracy) == record["epochs_trained"]
    assert record["best_epoch"] == accuracy.index(max(accuracy)) + 1
    assert record["epochs_trained"] == min(record["epochs"], record["best_epoch"] + record["patience"])
    assert record["stopped_early"] == (record["epochs_trained"] < record["epochs"])


def test_attack_stops_early_and_keeps_validation_rows_out_of_training_and_of_the_attack(monkeypatch) -> None:
    code, out = invoke(
        monkeypatch, "attack", "--epochs", str(EPOCHS), "--predictions", str(PREDICTIONS), "--attacks", "esa,am",
        "--early-stopping-patience", str(PATIENCE), "--validation-fraction", "0.25",
    )  # fmt: skip
    assert code == 0, out
    report = last_json(out)
    record = report["early_stopping"]
    check_rule(record)
    assert record["patience"] == PATIENCE and report["epochs_trained"] == record["epochs_trained"]
    spec = FederationSpec("breast_cancer", queries=PREDICTIONS, early_stopping_patience=PATIENCE,
                          validation_fraction=0.25)  # fmt: skip
    train_ids, validation, _ = spec.dealt_sets()
    assert record["validation_rows"] == len(validation) > 0 and report["n_train"] == len(train_ids)
    assert report["n_samples"] == PREDICTIONS  # the attack's rows are the queried ones only
    assert "early stopping (patience 2" in out and f"the model kept is epoch {record['epochs_trained']}'s" in out
    assert report["mse_scope"] == "queried" and "MSE scope queried: over the queried rows (100 samples)" in out


def test_validation_scoring_goes_through_the_release_and_only_the_last_query_is_attacked(tmp_path) -> None:
    spec = FederationSpec("breast_cancer", backend="plain", epochs=6, early_stopping_patience=50)
    scenario = harness.AttackScenario(spec, attacks=("esa",), predictions=PREDICTIONS, in_process=True)
    run = harness.run_scenario(scenario, tmp_path)
    assert run.training is not None and run.training.epochs_trained == 6 and not run.training.stopped_early
    _, train_ids, validation, queried, _ = runs.session_plan(scenario)
    store = curious.ObservationStore(run.store_path)
    try:
        obs, sample_ids = curious.observations(store, run.session_id)
        trained = {i for r in store.read(run.session_id, "training_data") for i in r.sample_ids}
    finally:
        store.close()
    # Every epoch's validation scores were released by the coordinator (and recorded), then the attack's query.
    assert sample_ids == [*validation * 6, *queried] and trained == set(train_ids)
    assert not set(validation) & (trained | set(queried))
    only, ids = harness.last_query(obs, sample_ids, queried)
    assert ids == queried and only.scores.shape == (PREDICTIONS, 2)
    assert (only.scores == obs.scores[-PREDICTIONS:]).all()
    report = harness.score_run(scenario, run)
    assert report["n_samples"] == PREDICTIONS and report["early_stopping"]["validation_accuracy"][-1] > 0.8


def test_validation_scoring_is_charged_to_the_query_budget(tmp_path) -> None:
    spec = FederationSpec("breast_cancer", backend="plain", epochs=5, early_stopping_patience=5)
    scenario = harness.AttackScenario(spec, predictions=PREDICTIONS, in_process=True)
    n_validation = len(runs.session_plan(scenario)[2])
    budget = {"query_budget": 2 * n_validation + 10}  # two epochs' validation, not a third
    scenario = scenario.with_spec(query_policy=budget)
    with pytest.raises(grpc.RpcError) as refused:
        harness.run_scenario(scenario, tmp_path)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"query budget exhausted: {2 * n_validation} of {budget['query_budget']} samples scored" in str(
        refused.value.details()
    )


def test_demo_stops_early_and_reports_the_epoch_kept(monkeypatch) -> None:
    code, out = invoke(monkeypatch, "demo", "--epochs", str(EPOCHS), "--early-stopping-patience", "1")
    assert code == 0, out
    result = last_json(out)
    check_rule(result["early_stopping"])
    assert result["epochs_trained"] == result["early_stopping"]["epochs_trained"]
    assert result["n_train"] + result["early_stopping"]["validation_rows"] + result["n_test"] == result["n_common"]


def test_mse_scope_all_scores_training_and_queried_rows(monkeypatch) -> None:
    code, out = invoke(
        monkeypatch, "attack", "--epochs", "5", "--predictions", str(PREDICTIONS), "--attacks", "am,ram,esa",
        "--mse-scope", "all", "--attack-option", "ram.folds=3",
    )  # fmt: skip
    assert code == 0, out
    report = last_json(out)
    assert report["mse_scope"] == "all" and report["n_samples"] == report["n_train"] + PREDICTIONS
    assert 0.8 < report["accuracy"] <= 1.0  # still the prediction rows' accuracy, not the training rows'
    assert f"MSE scope all: over the training and the queried rows ({report['n_samples']} samples)" in out
    # AM/RAM fit the training rows in-sample (varasteh's average over time); an explicit option is kept.
    assert report["attacks"]["am"]["options"]["held_out"] is False
    ram = report["attacks"]["ram"]["options"]
    assert ram["held_out"] is False and ram["folds"] == 3
    assert all(len(v) == report["d_passive"] for v in report["mse_per_feature"].values())


def test_an_unknown_mse_scope_is_refused(monkeypatch) -> None:
    code, out = invoke(monkeypatch, "attack", "--mse-scope", "some")
    assert code != 0 and "--mse-scope must be one of queried, all, got 'some'" in out


def test_am_held_out_drops_the_attacked_rows_from_its_training_set() -> None:
    from vflsec.services.data import datasets

    ds = datasets.load_dataset("breast_cancer")
    x, d_a = ds.X[:200], 20
    obs = attacks.Observations(
        x_active=x[:50, :d_a], scores=None, n_classes=2, d_passive=x.shape[1] - d_a,
        w_active=0.1 * ds.X[:1, :d_a], bias=[0.0], w_passive=0.1 * ds.X[1:2, d_a:],
        train_x_active=x[:, :d_a], train_y=ds.y[:200],
    )  # fmt: skip
    held = attacks.run_attack(attacks.make_attack("am"), obs).meta["n_train_excluded"]
    in_sample = attacks.run_attack(attacks.make_attack("am", held_out=False), obs).meta["n_train_excluded"]
    assert (held, in_sample) == (50, 0)
