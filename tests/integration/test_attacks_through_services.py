"""The curious plugin and the LR attack suite against recordings made through the real services (ckks)."""

from __future__ import annotations

import dataclasses

import pytest

from vflsec.client.experiments.harness import AttackScenario, evaluate_attacks, run_scenario, true_passive_features
from vflsec.client.federation.launcher import FederationSpec
from vflsec.services import attacks
from vflsec.services.plugins import curious


def record(tmp_path, **options):
    """Run a scenario through the services; return the recorded observations and the matching truth. Options
    that are AttackScenario fields go to the scenario, the rest to its FederationSpec."""
    scenario_fields = {f.name for f in dataclasses.fields(AttackScenario)}
    spec = FederationSpec(**{"epochs": 10, **{k: v for k, v in options.items() if k not in scenario_fields}})
    scenario = {k: v for k, v in options.items() if k in scenario_fields}
    run = run_scenario(AttackScenario(spec, in_process=True, **scenario), tmp_path)
    store = curious.ObservationStore(run.store_path)
    obs, ids = curious.observations(store, run.session_id)
    store.close()
    assert ids == run.queried
    return obs, true_passive_features(run.layout, ids)[0], run


def mse_of(obs, truth, *names: str, **options) -> dict[str, float]:
    results = evaluate_attacks(obs, truth, names, options)
    return {name: r["mse"] for name, r in results.items()}


def first(obs: attacks.Observations, n: int) -> attacks.Observations:
    """The same recording, as if the active party had queried only its first n samples."""
    return dataclasses.replace(obs, x_active=obs.x_active[:n], scores=obs.scores[:n])


@pytest.mark.slow
def test_digits_five_passive_features_esa_is_exact(tmp_path) -> None:
    obs, truth, _ = record(tmp_path, dataset="digits", passive_features=5, predictions=300)
    assert obs.n_classes == 10 and obs.d_passive == 5 and obs.w_passive is not None
    result = mse_of(obs, truth, "esa", "half")
    assert result["esa"] < 1e-6 < result["half"]


@pytest.mark.slow
def test_digits_thirty_passive_features(tmp_path) -> None:
    obs, truth, _ = record(tmp_path, dataset="digits", passive_features=30, predictions=600)
    m = mse_of(obs, truth, "half", "half_star", "rcc2", "rg", "am", "ram", "gia", "grn")
    assert m["half_star"] < m["half"]
    assert m["rcc2"] <= m["half_star"]
    assert m["ram"] <= m["am"]
    assert m["gia"] < m["rg"] and m["grn"] < m["rg"]


@pytest.mark.slow
def test_sign_only_improves_with_more_predictions(tmp_path) -> None:
    obs, truth, _ = record(tmp_path, dataset="breast_cancer", passive_features=1, predictions=1000)
    # The scenario queries every row it holds out of training (half of the aligned rows); sign-only sees growing
    # prefixes of that recording.
    sizes = [10, 100, obs.n_samples]
    assert obs.n_samples >= 250
    curve = [mse_of(first(obs, n), truth[:n], "sign_only")["sign_only"] for n in sizes]
    assert curve[2] < curve[0] and curve[2] <= curve[1] + 1e-9
    # Against the blind baseline on the same rows: since queries are held out of training (issue 31) the scenario
    # queries ~257 rows, not 569, and sign-only reads 0.018 there against Half's 0.113 (the former bound, 0.01, was
    # the full recording's).
    assert curve[2] < mse_of(obs, truth, "half")["half"] / 4


@pytest.mark.slow
def test_withheld_model_makes_white_box_attacks_not_applicable(tmp_path) -> None:
    obs, truth, _ = record(tmp_path, dataset="wine", passive_features=4, predictions=100, release_model=False)
    assert obs.w_active is None and obs.w_passive is None
    results = evaluate_attacks(obs, truth, ["esa", "half_star", "rcc2", "half"])
    assert all("not_applicable" in results[n] for n in ("esa", "half_star", "rcc2"))
    assert "mse" in results["half"]


@pytest.mark.slow
@pytest.mark.parametrize("defense", ["privee:epsilon=0.1", "rounding:decimals=1"])
def test_score_defenses_raise_attack_error(tmp_path, defense: str) -> None:
    """Same model and queries as the exact-ESA case, scores released through a defense: the attacks only
    see the defended scores (the store holds nothing else), and their error rises."""
    obs, truth, run = record(tmp_path, dataset="digits", passive_features=5, predictions=300, score_release=[defense])
    assert obs.release == (defense.split(":")[0],)
    m = mse_of(obs, truth, "esa", "ls_clamped", "half_star", "half")
    assert m["esa"] > 1e-3 and m["ls_clamped"] > 1e-3 and m["half_star"] > 1e-3
    if defense.startswith("privee"):  # order-preserving: no accuracy lost
        assert run.accuracy >= 0.9
