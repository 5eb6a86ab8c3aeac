"""Attacks that learn from many predictions: sign-only black box, agnostic AM/RAM, GIA and GRN."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from scipy.special import expit

from vflsec.services.attacks import NotApplicable, Observations, make_attack, mse, run_attack
from vflsec.services.attacks.synthetic import lr_task


def _black_box_obs(n: int, omega: float, offset: float, seed: int) -> tuple[Observations, np.ndarray]:
    """Binary LR with one passive feature; neither w_passive (ω) nor the bias (b) is released."""
    rng = np.random.default_rng(seed)
    x_act, x_pas = rng.uniform(size=(n, 3)), rng.beta(2.0, 3.0, size=(n, 1))
    w_act = rng.normal(size=(1, 3))
    p = expit(x_act @ w_act.T + omega * x_pas + offset)[:, 0]
    obs = Observations(x_active=x_act, scores=np.stack([1 - p, p], 1), n_classes=2, d_passive=1, w_active=w_act)
    return obs, x_pas


def _sign_only_mse(n: int, omega: float, offset: float, relation: str, trials: int = 30) -> float:
    attack = make_attack("sign_only", sign_relation=relation)
    errors = []
    for trial in range(trials):
        obs, x_pas = _black_box_obs(n, omega, offset, seed=1000 * n + trial)
        errors.append(mse(x_pas, run_attack(attack, obs).x_passive))
    return float(np.mean(errors))


@pytest.mark.parametrize(
    ("omega", "offset", "relation"),
    [(1.5, 2.0, "same"), (-1.5, -0.5, "same"), (-1.5, 3.0, "opposite")],  # cases 2, 2 and 3.1
)
def test_sign_only_error_shrinks_with_more_predictions(omega: float, offset: float, relation: str) -> None:
    errors = [_sign_only_mse(n, omega, offset, relation) for n in (10, 100, 1000)]
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 0.005  # converges towards 0 (rassouli §VI), far below Half's 1/12


def test_sign_only_mixed_signs_fall_back_to_half() -> None:
    obs, _ = _black_box_obs(500, 3.0, -1.5, seed=2)  # ωb < 0 and v changes sign: case 3.2
    result = run_attack(make_attack("sign_only", sign_relation="opposite"), obs)
    assert result.meta["case"] == "3.2"
    np.testing.assert_array_equal(result.x_passive, 0.5)


def test_sign_only_with_known_bias_uses_case_one() -> None:
    task = lr_task(2000, 3, 1, 2, seed=5)
    result = run_attack(make_attack("sign_only"), dataclasses.replace(task.obs, w_passive=None))
    assert result.meta["case"] == "1"
    assert mse(task.x_passive, result.x_passive) < 1e-3


def test_sign_only_needs_one_passive_feature() -> None:
    task = lr_task(50, 3, 2, 2, seed=5)
    with pytest.raises(NotApplicable, match="one passive feature"):
        run_attack(make_attack("sign_only"), task.obs)


@pytest.mark.parametrize(("n_classes", "d_passive"), [(4, 2), (3, 5)])
def test_refined_adversary_model_beats_plain_one(n_classes: int, d_passive: int) -> None:
    task = lr_task(1000, 8, d_passive, n_classes, rho=0.5, n_train=4000, seed=21)
    am = run_attack(make_attack("am"), task.obs)
    ram = run_attack(make_attack("ram", n_refine=200), task.obs)
    assert am.meta["method"] == ("ls" if d_passive < n_classes else "half_star")
    assert ram.meta["n_refine"] == 200
    assert mse(task.x_passive, ram.x_passive) <= mse(task.x_passive, am.x_passive)
    for result in (am, ram):
        assert np.all((result.x_passive >= 0) & (result.x_passive <= 1))


@pytest.fixture(scope="module")
def correlated_task():  # type: ignore[no-untyped-def]
    return lr_task(1500, 8, 4, 3, rho=0.7, seed=13)


def test_gia_beats_random_guess_and_fits_the_scores(correlated_task) -> None:  # type: ignore[no-untyped-def]
    task = correlated_task
    gia = run_attack(make_attack("gia"), task.obs)
    rg = run_attack(make_attack("rg"), task.obs)
    assert mse(task.x_passive, gia.x_passive) < mse(task.x_passive, rg.x_passive)
    assert np.all((gia.x_passive >= 0) & (gia.x_passive <= 1))
    start = run_attack(make_attack("gia", steps=0), task.obs)  # the divergence at the ½·1 start
    assert np.mean(gia.meta["loss"]) < 0.5 * np.mean(start.meta["loss"])


def test_grn_beats_random_guess_and_learns(correlated_task) -> None:  # type: ignore[no-untyped-def]
    task = correlated_task
    grn = run_attack(make_attack("grn", epochs=15), task.obs)
    rg = run_attack(make_attack("rg"), task.obs)
    assert mse(task.x_passive, grn.x_passive) < mse(task.x_passive, rg.x_passive)
    history = grn.meta["loss_history"]
    assert history[-1] < history[0]
    again = run_attack(make_attack("grn", epochs=15), task.obs)
    np.testing.assert_allclose(again.x_passive, grn.x_passive)  # seeded end to end


@pytest.mark.parametrize("name", ["grn_noise_only", "grn_xadv_only", "grn_no_reg", "grn_direct"])
def test_grn_ablations_run_and_respect_the_range(name: str, correlated_task) -> None:  # type: ignore[no-untyped-def]
    result = run_attack(make_attack(name, epochs=2, hidden=(32,)), correlated_task.obs)
    assert np.all((result.x_passive >= 0) & (result.x_passive <= 1))
    assert np.isfinite(result.meta["loss_history"]).all()


@pytest.mark.parametrize("prefix", ["grn", "grn_luo"])
def test_each_grn_ablation_removes_what_it_is_named_for(prefix: str) -> None:
    """luo Table III's cases, checked on the estimator itself (a smoke run cannot tell them apart)."""
    x_adv, other = torch.rand(6, 4), torch.rand(6, 4)
    rows = torch.arange(6)

    def outputs(name: str, x: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(0)  # the same generator weights and the same noise draw for both inputs
        estimate, _ = make_attack(f"{prefix}_{name}", hidden=(8,))._estimator(x, 3)
        with torch.no_grad():
            return estimate(rows)

    # case 1, noise only: x_adv does not reach the generator; the full GRN's output depends on it
    torch.testing.assert_close(outputs("noise_only", x_adv), outputs("noise_only", other))
    torch.manual_seed(0)
    full, _ = make_attack(prefix, hidden=(8,))._estimator(x_adv, 3)
    torch.manual_seed(0)
    full_other, _ = make_attack(prefix, hidden=(8,))._estimator(other, 3)
    torch.manual_seed(1)
    with torch.no_grad():
        a = full(rows)
    torch.manual_seed(1)
    with torch.no_grad():
        assert not torch.allclose(a, full_other(rows))
    # case 2, x_adv only: no noise, so two evaluations agree; the full GRN's differ (fresh noise per call)
    estimate, _ = make_attack(f"{prefix}_xadv_only", hidden=(8,))._estimator(x_adv, 3)
    with torch.no_grad():
        torch.testing.assert_close(estimate(rows), estimate(rows))
        assert not torch.allclose(full(rows), full(rows))
    # case 3, no regulariser; case 4, direct: x̂ itself is the parameter, one row of d_p values per queried row
    assert make_attack(f"{prefix}_no_reg").variance_weight == 0.0 < make_attack(prefix).variance_weight
    _, parameters = make_attack(f"{prefix}_direct")._estimator(x_adv, 3)
    assert [tuple(p.shape) for p in parameters] == [(6, 3)]


@pytest.mark.parametrize("prefix", ["grn", "grn_luo"])
def test_no_reg_drops_the_variance_term_from_the_loss_the_full_grn_pays(prefix: str, correlated_task) -> None:  # type: ignore[no-untyped-def]
    """Case 3 removes the regulariser from the loss itself (an attribute alone would pass with a loss that ignored
    it): with lr 0 the generator stays at its seeded start, so the two losses differ by the variance term only."""
    options = {"epochs": 1, "hidden": (8,), "lr": 0.0}
    full, no_reg = (run_attack(make_attack(name, **options), correlated_task.obs)
                    for name in (prefix, f"{prefix}_no_reg"))  # fmt: skip
    np.testing.assert_array_equal(full.x_passive, no_reg.x_passive)  # the same x̂: only the loss tells them apart
    full, no_reg = np.asarray(full.meta["loss_history"]), np.asarray(no_reg.meta["loss_history"])
    assert np.all(full > no_reg + 1e-6), (full, no_reg)
