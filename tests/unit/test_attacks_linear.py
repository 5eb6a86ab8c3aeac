"""White-box LR attacks: luo's worked example, ESA exactness, rassouli's Theorems 1–2 and the RCC solvers."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest
from scipy.special import softmax

from vflsec.services.attacks import Observations, make_attack, mse, mse_per_feature, run_attack
from vflsec.services.attacks.linear import passive_system
from vflsec.services.attacks.synthetic import lr_task


def test_luo_worked_example_recovers_target_features() -> None:
    # luo §IV-A Example 1: 3 classes, x = (age 25, income 2K | 8K, 3), no bias.
    theta = np.array([[0.08, 0.0002, 0.0005, 0.09], [0.06, 0.0005, 0.0002, 0.08], [0.01, 0.0001, 0.0004, 0.05]])
    x = np.array([25.0, 2000.0, 8000.0, 3.0])
    scores = softmax(theta @ x)[None, :]
    np.testing.assert_allclose(scores[0], [0.867, 0.084, 0.049], atol=5e-4)  # the paper's printed v
    obs = Observations(
        x_active=x[None, :2],
        scores=scores,
        n_classes=3,
        d_passive=2,
        w_active=theta[:, :2],
        bias=np.zeros(3),
        w_passive=theta[:, 2:],
    )
    result = run_attack(make_attack("esa"), obs)
    np.testing.assert_allclose(result.x_passive[0], [8000.0, 3.0], atol=1e-6)
    assert result.meta["exact"]


@pytest.mark.parametrize(("n_classes", "d_passive"), [(2, 1), (5, 4), (5, 2), (7, 6)])
def test_esa_exact_when_passive_features_fit_in_the_equations(n_classes: int, d_passive: int) -> None:
    task = lr_task(300, 5, d_passive, n_classes, seed=n_classes + d_passive)
    result = run_attack(make_attack("esa"), task.obs)
    assert result.meta["exact"]
    np.testing.assert_allclose(result.x_passive, task.x_passive, atol=1e-7)


def test_esa_not_exact_when_underdetermined() -> None:
    task = lr_task(300, 5, 4, 3, seed=1)
    result = run_attack(make_attack("ls"), task.obs)
    assert not result.meta["exact"] and result.meta["rank"] == 2
    assert mse(task.x_passive, result.x_passive) > 1e-3


def test_random_guess_costs_one_twelfth_more_than_half() -> None:
    # rassouli Lemma 1: E(X − U)² − E(X − ½)² = Var(U) = 1/12, whatever the distribution of X.
    task = lr_task(5000, 4, 6, 2, rho=0.6, seed=3)
    gap = mse(task.x_passive, run_attack(make_attack("rg", seed=7), task.obs).x_passive) - mse(
        task.x_passive, run_attack(make_attack("half"), task.obs).x_passive
    )
    assert gap == pytest.approx(1 / 12, abs=0.005)


@pytest.mark.parametrize(("n_classes", "d_passive"), [(2, 2), (4, 7)])
def test_theorem1_per_sample_rcc2_le_halfstar_le_half(n_classes: int, d_passive: int) -> None:
    task = lr_task(2000, 4, d_passive, n_classes, rho=0.0, seed=11)
    x = task.x_passive
    dist = {
        name: np.linalg.norm(x - run_attack(make_attack(name), task.obs).x_passive, axis=1)
        for name in ("rcc2", "half_star", "half")
    }
    # Exact scores: the true x is always in S_F, so the inequalities (44) and (48) hold sample by sample.
    assert np.all(dist["rcc2"] <= dist["half_star"] + 1e-9)
    assert np.all(dist["half_star"] <= dist["half"] + 1e-9)
    # Not vacuous: for some samples Half* leaves the cube and the projection strictly improves on it.
    assert np.mean(dist["rcc2"] < dist["half_star"] - 1e-6) > 0.01


def test_theorem2_closed_forms_match_empirical_mse() -> None:
    # X_i = (U_i + U_0) / 2 with U iid Uniform[0, 1]: mean ½, Var X_i = 1/24, Cov(X_i, X_j) = 1/48.
    rng = np.random.default_rng(5)
    n, d_a, d_p, c = 200_000, 3, 6, 3
    u = rng.uniform(size=(n, d_a + d_p + 1))
    x = 0.5 * (u[:, 1:] + u[:, :1])
    weights, bias = rng.normal(scale=2.0, size=(c, d_a + d_p)), rng.normal(size=c)
    obs = Observations(
        x_active=x[:, :d_a],
        scores=softmax(x @ weights.T + bias, axis=1),
        n_classes=c,
        d_passive=d_p,
        w_active=weights[:, :d_a],
        bias=bias,
        w_passive=weights[:, d_a:],
    )
    system, _ = passive_system(obs)
    null_projector = system.null_basis @ system.null_basis.T  # I − A⁺A
    k_half = (np.eye(d_p) + np.ones((d_p, d_p))) / 48
    k_zero = k_half + 0.25 * np.ones((d_p, d_p))
    x_p = x[:, d_a:]
    ls = mse(x_p, run_attack(make_attack("ls"), obs).x_passive)
    half_star = mse(x_p, run_attack(make_attack("half_star"), obs).x_passive)
    assert ls == pytest.approx(np.trace(null_projector @ k_zero) / d_p, rel=0.01)
    assert half_star == pytest.approx(np.trace(null_projector @ k_half) / d_p, rel=0.01)


def _reference_projection(obs: Observations, rows: range) -> np.ndarray:
    """RCC2 by Remark 2 — the point of S_F nearest to ½·1 — solved independently with cvxpy."""
    system, b = passive_system(obs)
    out = []
    for i in rows:
        x = cp.Variable(obs.d_passive)
        problem = cp.Problem(cp.Minimize(cp.sum_squares(x - 0.5)), [system.a @ x == b[i], x >= 0, x <= 1])
        problem.solve(solver="CLARABEL")
        out.append(x.value)
    return np.array(out)


def test_rcc2_matches_independent_qp_solution() -> None:
    task = lr_task(40, 4, 6, 3, rho=0.3, seed=2)
    result = run_attack(make_attack("rcc2"), task.obs)
    assert result.meta["feasible"].all()
    np.testing.assert_allclose(result.x_passive, _reference_projection(task.obs, range(40)), atol=1e-6)


def test_rcc1_and_cls_stay_in_the_feasible_set() -> None:
    task = lr_task(40, 4, 6, 3, rho=0.3, seed=2)
    system, b = passive_system(task.obs)
    for name in ("rcc1", "cls"):
        x_hat = run_attack(make_attack(name), task.obs).x_passive
        assert x_hat.min() >= 0.0 and x_hat.max() <= 1.0
        np.testing.assert_allclose(x_hat @ system.a.T, b, atol=1e-4)
    rcc1 = run_attack(make_attack("rcc1"), task.obs)
    assert rcc1.meta["feasible"].all()
    assert set(rcc1.meta["solver"]) == {"CLARABEL"}
    # The fallback solver alone (SCS, first order) reaches the same relaxed centre to its accuracy.
    scs = run_attack(make_attack("rcc1", solver="SCS", fallback_solver="SCS"), task.obs)
    np.testing.assert_allclose(scs.x_passive[scs.meta["feasible"]], rcc1.x_passive[scs.meta["feasible"]], atol=2e-3)
    assert scs.meta["feasible"].mean() > 0.9
    # The Chebyshev-centre estimates beat the blind centre of the cube on this task.
    assert mse(task.x_passive, rcc1.x_passive) < mse(task.x_passive, np.full_like(task.x_passive, 0.5))


def test_empty_null_space_reduces_feasible_attacks_to_ls() -> None:
    task = lr_task(30, 4, 3, 5, seed=8)
    for name in ("rcc1", "rcc2", "half_star", "cls"):
        x_hat = run_attack(make_attack(name), task.obs).x_passive
        np.testing.assert_allclose(x_hat, task.x_passive, atol=1e-6, err_msg=name)


def test_infeasible_defended_scores_fall_back_inside_the_cube() -> None:
    task = lr_task(60, 4, 6, 3, seed=9)
    rng = np.random.default_rng(0)
    noisy = np.clip(task.obs.scores + rng.normal(scale=0.2, size=task.obs.scores.shape), 0.0, None)
    noisy_obs = Observations(**{**task.obs.__dict__, "scores": noisy})
    for name in ("rcc2", "rcc1"):
        result = run_attack(make_attack(name), noisy_obs)
        assert 0 < result.meta["feasible"].sum() < 60, name  # some planes still cut the cube, some miss
        assert np.all((result.x_passive >= 0) & (result.x_passive <= 1))
        fallback = np.clip(run_attack(make_attack("half_star"), noisy_obs).x_passive, 0, 1)
        missed = ~result.meta["feasible"]
        np.testing.assert_allclose(result.x_passive[missed], fallback[missed])


def test_zero_scores_from_rounding_do_not_produce_nan() -> None:
    task = lr_task(200, 4, 2, 3, seed=4)
    rounded = np.floor(task.obs.scores * 10) / 10  # luo §VII: round down to one decimal
    assert (rounded == 0).any()
    obs = Observations(**{**task.obs.__dict__, "scores": rounded})
    for name in ("esa", "ls_clamped", "half_star", "rcc2"):
        assert np.isfinite(run_attack(make_attack(name), obs).x_passive).all(), name


def test_mse_helpers() -> None:
    truth = np.array([[0.0, 1.0], [1.0, 1.0]])
    guess = np.array([[0.5, 1.0], [0.5, 0.0]])
    np.testing.assert_allclose(mse_per_feature(truth, guess), [0.25, 0.5])
    assert mse(truth, guess) == pytest.approx(0.375)
    with pytest.raises(ValueError):
        mse(truth, guess[:1])
