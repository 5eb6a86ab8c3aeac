"""Parameter-release distortions (PPS-A, varasteh's PPS, withhold) and the passive party's risk forecast.

Attacks run through the real attack suite on exact scores of an LR trained locally; the forecast and the flip gap
are closed forms (rassouli Theorem 2, varasteh §V), so agreement between them and the measured MSE checks both.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vflsec.client.experiments.param_curve import (
    VflTask,
    measure_attacks,
    prepare_task,
    privacy_interpretability_curve,
    write_curve,
)
from vflsec.services.attacks.synthetic import lr_task
from vflsec.services.defenses.params import (
    DataStats,
    Distorted,
    Varasteh,
    flip_gap,
    forecast,
    interpretability_loss,
    make_distortion,
)
from vflsec.services.defenses.release import ParamReleaseChain, ReleaseConfigError

EPSILONS = (1e-3, 1e-2, 0.05, 0.2, 1.0)


@pytest.fixture(scope="module")
def tasks() -> dict[str, VflTask]:
    return {
        "breast_cancer": prepare_task("breast_cancer", 10),
        "wine": prepare_task("wine", 5),
        # Four mid-image pixels: d = 4 ≤ C − 1 = 9, the exactly solvable case.
        "digits": prepare_task("digits", [20, 28, 36, 44], steps=300),
    }


def synthetic(d_passive: int, n_classes: int, seed: int) -> VflTask:
    task = lr_task(3000, 4, d_passive, n_classes, seed=seed)
    obs = task.obs
    assert obs.w_active is not None and obs.w_passive is not None
    return VflTask("synthetic", obs.x_active, task.x_passive, n_classes, obs.w_active, obs.w_passive, task.bias)


def distort(task: VflTask, spec: str, seed: int = 0) -> Distorted:
    return make_distortion(spec).distort(task.w_passive, task.stats, task.n_classes, np.random.default_rng(seed))


# ------------------------------------------------------------------------------------------- statistics


def test_data_stats_match_their_definitions_and_reject_unscaled_features() -> None:
    x = np.random.default_rng(0).uniform(size=(500, 3))
    stats = DataStats.from_features(x)
    np.testing.assert_allclose(stats.k0, np.mean([np.outer(row, row) for row in x], axis=0))
    np.testing.assert_allclose(stats.k_half, np.mean([np.outer(row - 0.5, row - 0.5) for row in x], axis=0))
    np.testing.assert_allclose(stats.mu, x.mean(axis=0))
    assert stats.n == 500 and stats.d == 3
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        DataStats.from_features(x * 3.0)


# --------------------------------------------------------------------------------------------- PPS-A


def test_undefended_exact_case_is_forecast_and_measured_as_zero(tasks: dict[str, VflTask]) -> None:
    task = tasks["digits"]
    predicted = forecast(task.w_passive, task.stats, task.n_classes)
    assert predicted["rank_condition"] and predicted["zero_error"] and predicted["warnings"]
    assert measure_attacks(task)["ls"] < 1e-12


@pytest.mark.parametrize("which", ["digits", "synthetic"])
def test_flip_adds_rassoulis_gap_to_the_ls_mse(tasks: dict[str, VflTask], which: str) -> None:
    # digits: d = 4 ≤ C − 1 (A⁺A = I); synthetic: d = 6 > C − 1 = 3, so the projector A⁺A is a proper one.
    task = tasks["digits"] if which == "digits" else synthetic(6, 4, seed=5)
    flipped = distort(task, "ppsa:H=flip")
    np.testing.assert_allclose(flipped.disclosed, -task.w_passive)
    gap = measure_attacks(task, flipped)["ls"] - measure_attacks(task, None)["ls"]
    expected = flip_gap(task.w_passive, task.stats, task.n_classes)
    assert expected > 0.05
    assert gap == pytest.approx(expected, rel=0.02)


def test_theorem3_beats_every_other_orthonormal_transform_for_ls(tasks: dict[str, VflTask]) -> None:
    task = tasks["wine"]
    best = measure_attacks(task, distort(task, "ppsa:H=theorem3"))["ls"]
    others = [measure_attacks(task, distort(task, "ppsa:H=orthonormal", seed))["ls"] for seed in range(5)]
    assert best >= max(others) - 1e-12
    assert best > measure_attacks(task)["ls"]


# ---------------------------------------------------------------------------------------- the forecast


@pytest.mark.parametrize("spec", [None, "ppsa:H=orthonormal", "ppsa:H=flip"])
def test_forecast_matches_measured_attacks_on_three_datasets(tasks: dict[str, VflTask], spec: str | None) -> None:
    for task in tasks.values():
        distorted = None if spec is None else distort(task, spec)
        predicted = forecast(task.w_passive, task.stats, task.n_classes, distorted)
        measured = measure_attacks(task, distorted)  # attacks that take the disclosed block at face value
        naive = "naive_" if predicted["undone"] else ""
        for attack in ("ls", "half_star"):
            assert predicted[naive + attack] == pytest.approx(measured[attack], rel=0.05, abs=1e-9), (task.name, attack)


@pytest.mark.parametrize(
    ("spec", "which"), [("ppsa:H=flip", "wine"), ("ppsa:H=flip", "digits"), ("ppsa:H=theorem3", "digits")]
)
def test_forecast_of_an_undoable_distortion_is_the_undistorted_one(
    tasks: dict[str, VflTask], spec: str, which: str
) -> None:
    # flip announces H = −I and its offset; theorem3 with d ≤ C − 1 (digits: d = 4, C = 10) is H* = −I. A
    # Kerckhoffs attacker negates back, so the forecast is the true block's, with a warning.
    task = tasks[which]
    distorted = distort(task, spec)
    assert distorted.undoable
    predicted = forecast(task.w_passive, task.stats, task.n_classes, distorted)
    plain = forecast(task.w_passive, task.stats, task.n_classes)
    assert predicted["undone"] and not plain["undone"]
    assert (predicted["ls"], predicted["half_star"], predicted["zero_error"]) == (
        plain["ls"],
        plain["half_star"],
        plain["zero_error"],
    )
    assert predicted["naive_ls"] > predicted["ls"] + 0.01  # what the naive table used to show
    assert any("protects nothing" in warning for warning in predicted["warnings"])
    true_block = -distorted.disclosed  # the undo: negate back (H = −I)
    np.testing.assert_allclose(true_block, task.w_passive, atol=1e-9)


@pytest.mark.parametrize("spec", ["ppsa:H=orthonormal", "ppsa:H=theorem3", "varasteh:epsilon=0.05"])
def test_secret_distortions_are_not_forecast_as_undone(tasks: dict[str, VflTask], spec: str) -> None:
    task = tasks["wine"]  # d = 5 > C − 1 = 2: theorem3's H* depends on the secret K_0
    distorted = distort(task, spec)
    assert not distorted.undoable and distorted.bias_offset is None
    assert not forecast(task.w_passive, task.stats, task.n_classes, distorted)["undone"]


def test_only_public_facts_of_a_disclosure_can_reach_the_active_party(tasks: dict[str, VflTask]) -> None:
    from vflsec.services.rpc.passive import disclosed_step

    task = tasks["wine"]
    for spec in ("ppsa:H=orthonormal", "ppsa:H=theorem3", "ppsa:H=flip"):
        step = make_distortion(spec)
        assert step.public_params() == {"H": spec.split("=")[1]}  # what the released chain announces
        message = disclosed_step(step.name, distort(task, spec))
        assert "h" not in message.private or message.private["h"] == "-I"  # no secret H travels, even privately
        assert dict(message.public) == {"step": "ppsa", "H": spec.split("=")[1]}


def test_undistorted_forecast_is_rassouli_theorem2() -> None:
    task = synthetic(7, 4, seed=9)
    stats = task.stats
    a = np.hstack([-np.ones((3, 1)), np.eye(3)]) @ task.w_passive
    null_projector = np.eye(7) - np.linalg.pinv(a) @ a
    predicted = forecast(task.w_passive, stats, task.n_classes)
    assert predicted["rank"] == 3 and not predicted["rank_condition"]
    assert predicted["ls"] == pytest.approx(np.trace(null_projector @ stats.k0) / 7, rel=1e-9)
    assert predicted["half_star"] == pytest.approx(np.trace(null_projector @ stats.k_half) / 7, rel=1e-9)
    assert predicted["half"] == pytest.approx(np.trace(stats.k_half) / 7, rel=1e-12)


def test_forecast_warns_below_the_configured_fraction_of_half(tasks: dict[str, VflTask]) -> None:
    task = tasks["breast_cancer"]
    predicted = forecast(task.w_passive, task.stats, task.n_classes, warn_fraction=1.0)
    assert predicted["ls"] < predicted["half"] and any("ls MSE" in text for text in predicted["warnings"])
    assert not forecast(task.w_passive, task.stats, task.n_classes, warn_fraction=0.0)["warnings"]


# ----------------------------------------------------------------------------------------- varasteh


@pytest.mark.parametrize("name", ["breast_cancer", "wine"])
def test_varasteh_meets_epsilon_and_privacy_grows_with_it(tasks: dict[str, VflTask], name: str) -> None:
    task = tasks[name]
    undefended = measure_attacks(task)["half_star"]
    measured = []
    for epsilon in EPSILONS:
        result = distort(task, f"varasteh:epsilon={epsilon}")
        assert result.private["case"] == "i"  # d ≥ k: W_n = W_p R against Half*
        assert interpretability_loss(task.w_passive, result.disclosed) == pytest.approx(epsilon, rel=0.01)
        r = result.private["r"]
        np.testing.assert_allclose(r.T @ r, np.eye(r.shape[0]), atol=1e-9)
        half_star = measure_attacks(task, result)["half_star"]
        assert half_star == pytest.approx(result.private["forecast_mse"], rel=0.05)
        measured.append(half_star)
    assert min(measured) >= undefended - 1e-9
    assert np.mean(np.diff(measured)) > 0.0 and measured[-1] > measured[0]


def test_varasteh_case_ii_against_ls_and_the_qr_retraction(tasks: dict[str, VflTask]) -> None:
    task = prepare_task("wine", 2)  # 1 < d = 2 < k = 3: the undefended LS attack is exact
    assert measure_attacks(task)["ls"] < 1e-12
    values = []
    for retraction in ("qr", "cayley"):
        result = distort(task, f"varasteh:epsilon=0.05,retraction={retraction}")
        assert result.private["case"] == "ii"
        assert result.private["achieved_g"] == pytest.approx(0.05, rel=0.01)
        values.append(measure_attacks(task, result)["ls"])
    assert min(values) > 1e-4
    assert values[0] == pytest.approx(values[1], rel=0.05)  # both retractions reach the same optimum


def test_varasteh_case_iii_remark11_picks_the_better_sign() -> None:
    task = synthetic(1, 2, seed=2)  # one sigmoid logit, d = 1
    epsilon = 0.05
    result = distort(task, f"varasteh:epsilon={epsilon}")
    assert result.private["case"] == "iii"
    shift = result.disclosed - task.w_passive
    np.testing.assert_allclose(np.abs(shift), np.sqrt(epsilon))
    other = Distorted(task.w_passive - shift)
    assert measure_attacks(task, result)["ls"] > measure_attacks(task, other)["ls"] > 0.0


def test_varasteh_case_iii_with_many_classes_uses_trust_constr() -> None:
    task = synthetic(1, 4, seed=3)
    result = distort(task, "varasteh:epsilon=0.01")
    assert result.private["case"] == "iii"
    assert result.private["achieved_g"] == pytest.approx(0.01, rel=0.01)
    measured = measure_attacks(task, result)["ls"]
    assert measured == pytest.approx(result.private["forecast_mse"], rel=0.05)
    # Better than a random direction at the same distortion.
    rng = np.random.default_rng(0)
    step = rng.standard_normal(task.w_passive.shape)
    random_block = task.w_passive + step * np.sqrt(0.01 * step.size) / np.linalg.norm(step)
    assert measured > measure_attacks(task, Distorted(random_block))["ls"]


def test_varasteh_case_iv_is_opt_in_for_binary_tasks(tasks: dict[str, VflTask]) -> None:
    task = tasks["breast_cancer"]
    result = distort(task, "varasteh:epsilon=0.01,case=iv")
    assert result.private["case"] == "iv"
    assert result.private["achieved_g"] == pytest.approx(0.01, rel=0.01)
    assert measure_attacks(task, result)["half_star"] > measure_attacks(task)["half_star"]
    with pytest.raises(ValueError, match="case iv does not apply"):
        distort(tasks["wine"], "varasteh:epsilon=0.01,case=iv")


def test_unreachable_epsilon_is_a_clear_error(tasks: dict[str, VflTask]) -> None:
    task = tasks["wine"]
    limit = 4.0 * np.sum(task.w_passive**2) / task.w_passive.size
    with pytest.raises(ValueError, match="cannot be met"):
        distort(task, f"varasteh:epsilon={1.5 * limit}")


def test_secret_epsilon_and_hidden_presence(tasks: dict[str, VflTask]) -> None:
    task = tasks["breast_cancer"]
    result = distort(task, "varasteh:epsilon=0.05,secret_epsilon=true", seed=4)
    prime = result.private["epsilon_prime"]
    assert 0.0 < prime < 0.05
    assert result.private["achieved_g"] == pytest.approx(prime, rel=0.01)
    assert str(prime) not in " ".join(result.public.values())
    applied = [distort(task, "varasteh:epsilon=0.05,hide_presence=true", seed).private["applied"] for seed in range(8)]
    assert any(applied) and not all(applied)


def test_coordinator_check_rejects_a_block_with_another_distortion(tasks: dict[str, VflTask]) -> None:
    task = tasks["wine"]
    distortion = Varasteh(0.05)
    result = distortion.distort(task.w_passive, task.stats, task.n_classes, np.random.default_rng(0))
    distortion.check(task.w_passive, result)
    tampered = Distorted(result.disclosed * 1.1, private=result.private)
    with pytest.raises(ValueError, match="achieved g"):
        distortion.check(task.w_passive, tampered)


# -------------------------------------------------------------------------------- specs and the chain


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nosuch", "unknown parameter release step"),
        ("ppsa:H=random", "H must be one of"),
        ("ppsa:G=flip", "no parameter"),
        ("varasteh:epsilon=-1", "must be positive"),
        ("varasteh:epsilon=abc", "must be a number"),
        ("varasteh:epsilon=0.1,secret_epsilon=maybe", "true or false"),
    ],
)
def test_bad_specs_fail_with_clear_messages(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_distortion(spec)


def test_param_chain_disclosure_never_touches_the_true_blocks(tasks: dict[str, VflTask]) -> None:
    # The chain's steps in order on one block, as the passive party runs them (services/engines/passive.py).
    task = tasks["wine"]
    true_block = task.w_passive.copy()
    chain = ParamReleaseChain.from_specs(["varasteh:epsilon=0.05", "ppsa:H=flip"], family="lr")
    rng = np.random.default_rng(0)
    first = chain.steps[0].distort(task.w_passive, task.stats, task.n_classes, rng)
    second = chain.steps[1].distort(first.disclosed, task.stats, task.n_classes, rng)
    np.testing.assert_array_equal(task.w_passive, true_block)  # inference keeps (and sees) the true block
    assert first.disclosed is not None and second.disclosed is not None
    assert not np.allclose(second.disclosed, true_block)
    np.testing.assert_allclose(second.bias_offset, -second.disclosed.sum(axis=1))
    assert first.private["achieved_g"] == pytest.approx(0.05, rel=0.01)
    chain.steps[0].check(task.w_passive, first)  # the coordinator's check of each step against its input
    # Scores come from the true block, so released scores are those of the undistorted model.
    np.testing.assert_allclose(task.scores, VflTask(**{**task.__dict__, "w_passive": true_block}).scores)
    assert forecast(task.w_passive, task.stats, task.n_classes, distort(task, "withhold"))["withheld"]


def test_distortions_that_need_the_passive_statistics_say_so() -> None:
    step = make_distortion("varasteh:epsilon=0.1")
    assert step.needs_stats and not make_distortion("ppsa:H=flip").needs_stats
    with pytest.raises(ValueError, match="data statistics"):
        step.distort(np.ones((3, 4)), None, 3, np.random.default_rng(0))
    with pytest.raises(ReleaseConfigError):
        ParamReleaseChain.from_specs(["varasteh:epsilon=zero"])


def test_privacy_interpretability_curve_writes_a_figure_and_a_table(tmp_path: Path) -> None:
    task = synthetic(5, 3, seed=11)
    rows = privacy_interpretability_curve(task, [0.01, 0.1])
    assert [row["epsilon"] for row in rows] == [0.0, 0.01, 0.1]
    assert rows[1]["achieved_g"] == pytest.approx(0.01, rel=0.01)
    assert rows[2]["half_star"] > rows[0]["half_star"]
    png, table = write_curve(rows, tmp_path, "synthetic")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert table.read_text(encoding="utf-8").count("\n| ") == 4  # header + 3 rows
