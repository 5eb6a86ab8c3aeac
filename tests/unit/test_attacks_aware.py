"""Issue 10: the robust linear system and the defense-aware attackers, on trained LR over real data.

Every task trains the services' LR (Adam, 30 epochs) on the rows it does not query; the attacks see only the
held-out rows' released scores, the model, and the announced chains. Draws come from OS entropy, so every
threshold below holds with a wide margin over the figures measured (see the report of issue 10).
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from vflsec.services.attacks import NotApplicable, Observations, make_attack, mse, run_attack
from vflsec.services.attacks.aware import aware_attacks_for

from .lr_real import real_task


def clipped_mse(task, obs: Observations, name: str) -> float:
    return mse(task.x_passive, np.clip(run_attack(make_attack(name), obs).x_passive, 0.0, 1.0))


def test_robust_system_uses_the_largest_score_and_drops_zero_scores() -> None:
    task = real_task("digits", 5, n_query=100)
    exact = task.observe()
    rounded = task.observe(("rounding:decimals=3",))
    result = run_attack(make_attack("ls"), rounded)
    assert np.array_equal(result.meta["reference"], rounded.scores.argmax(axis=1))
    assert np.array_equal(result.meta["dropped"], (rounded.scores <= 0).sum(axis=1))
    assert result.meta["dropped_total"] > 0
    # On exact scores nothing is dropped and the reference choice does not change ESA's exact answer.
    clean = run_attack(make_attack("esa"), exact)
    assert clean.meta["dropped_total"] == 0
    np.testing.assert_allclose(clean.x_passive, task.x_passive, atol=1e-8)


def test_rounding_three_decimals_on_digits_the_best_attacker_is_far_below_half() -> None:
    # A moderately regularised model (l2 = 0.01); with the default l2 the top score averages 0.96 and rounding
    # zeroes 7 of 9 log-ratios per sample, which genuinely leaves less (measured in the issue-10 report).
    task = real_task("digits", 5, n_query=200, l2=1e-2)
    obs = task.observe(("rounding:decimals=3",))
    half = clipped_mse(task, obs, "half")
    figures = {name: clipped_mse(task, obs, name) for name in ("ls_clamped", "cls", "aware_ls", "aware_cls")}
    assert min(figures.values()) <= 0.01 < half
    assert figures["aware_cls"] <= figures["cls"]


@pytest.mark.parametrize("basis", ["identity", "householder"])
def test_privee_dp_aware_esa_undoes_the_per_rank_multipliers(basis: str) -> None:
    task = real_task("digits", 5, n_query=200)
    obs = task.observe((f"privee:epsilon=0.1,basis={basis}",))
    naive, aware = clipped_mse(task, obs, "ls_clamped"), clipped_mse(task, obs, "aware_ls")
    assert aware <= 0.005 < naive


def test_under_privee_on_digits_the_aware_family_is_not_beaten_by_naive_ls_clamped() -> None:
    # issue 28 item 8: with 26 of 64 pixels passive (mostly 0, far from ½), the ½-centred aware attacks lose to
    # the naive minimum-norm ls_clamped (0.108 / 0.101 against 0.058 measured); aware_ls_min_norm is their
    # minimum-norm counterpart on the de-biased evidence: as good up to PRIVEE's noise (0.0591 vs 0.0579 measured).
    task = real_task("digits", 26, n_query=200)
    obs = task.observe(("privee:epsilon=0.1",))
    naive = clipped_mse(task, obs, "ls_clamped")
    figures = {name: clipped_mse(task, obs, name) for name in ("aware_ls", "aware_cls", "aware_ls_min_norm")}
    assert figures["aware_ls_min_norm"] <= 1.05 * naive < min(figures["aware_ls"], figures["aware_cls"])
    assert naive < 0.5 * clipped_mse(task, obs, "half")  # the comparison is between attacks that learned


@pytest.mark.parametrize("transform", ["flip", "theorem3"])
def test_ppsa_announced_transform_is_undone(transform: str) -> None:
    task = real_task("wine", 2, n_query=60)  # d_p = 2 ≤ C − 1: theorem3's H* is −I
    obs = task.observe(param_release=(f"ppsa:H={transform}",))
    assert mse(task.x_passive, run_attack(make_attack("aware_ls"), obs).x_passive) <= 1e-6
    assert clipped_mse(task, obs, "ls_clamped") > 0.01


def test_ppsa_secret_rotation_is_not_applicable_with_the_reason() -> None:
    task = real_task("wine", 2, n_query=30)
    obs = task.observe(param_release=("ppsa:H=orthonormal",))
    with pytest.raises(NotApplicable, match="secret H"):
        run_attack(make_attack("aware_ls"), obs)


def test_order_only_releases_support_only_the_polytope_attack() -> None:
    task = real_task("wine", 4, n_query=60)
    obs = task.observe(("rank_only",))
    with pytest.raises(NotApplicable, match="only an order"):
        run_attack(make_attack("aware_ls"), obs)
    assert aware_attacks_for(["rank_only"], []) == ["aware_interval"]
    point = ["aware_ls", "aware_cls", "aware_rcc2"]
    assert aware_attacks_for(["pps_b"], []) == [*point, "aware_ls_min_norm"]
    assert aware_attacks_for(["rounding"], ["ppsa"]) == [*point, "aware_interval", "aware_ls_min_norm"]


DEFENSES = [
    "rounding:decimals=2",
    "gaussian:epsilon=2",
    "privee:epsilon=0.1",
    "privee:epsilon=0.1,basis=householder",
    "privee_pp",
    "pps_b:alpha=1",
    "pps_b:alpha=1,scheme=2",
    "pps_b:alpha=0.5,scheme=3",
    "label_only",
    "rank_only",
]
# The naive counterpart shares the estimator's convention: centre ½·1 (Half*), box from ½·1 (CLS), projection.
# The interval projection is the projection of ½·1 onto a set holding the truth: judged against Half.
PAIRS = {"aware_ls": "half_star", "aware_cls": "cls", "aware_rcc2": "rcc2", "aware_interval": "half"}


@pytest.mark.parametrize("defense", DEFENSES)
def test_each_aware_attack_is_never_worse_than_its_naive_counterpart(defense: str) -> None:
    # wine (C = 3) and breast_cancer (C = 2) underdetermined, digits (C = 10, d_p = 5) determined. Over eight fresh
    # OS-entropy draws the aware attack must not be worse on average beyond the sampling error of that average:
    # a one-sided paired test at 4 standard errors of the per-draw differences (exact for deterministic
    # defenses, where the differences do not vary). Where both attacks sit at Half (gaussian on breast_cancer,
    # 30 draws: aware 0.0890 ± 0.0000, naive Half* 0.0946 ± 0.0010) a plain comparison of the two sums failed
    # twice in CI by chance; at 3 standard errors the gaussian interval pairs (measured 0.8-1.1 standard errors below
    # the mean over 24 draws) still failed about once in 500 runs.
    draws = 8
    for name, d_p in (("wine", 4), ("digits", 5), ("breast_cancer", 4)):
        task = real_task(name, d_p, n_query=80)
        figures: dict[str, list[float]] = {attack: [] for attack in [*PAIRS, *PAIRS.values()]}
        for _ in range(draws):
            obs = task.observe((defense,))
            for attack, values in figures.items():
                with contextlib.suppress(NotApplicable):
                    values.append(clipped_mse(task, obs, attack))
        ran = {attack for attack, values in figures.items() if values}
        assert "aware_rcc2" in ran or "aware_interval" in ran
        for aware, naive in PAIRS.items():
            if aware in ran:
                diff = np.array(figures[aware]) - np.array(figures[naive])
                margin = 4 * diff.std(ddof=1) / np.sqrt(draws) + 1e-6  # + solver tolerance
                assert diff.mean() <= margin, (name, defense, aware, naive, diff.mean(), margin)
