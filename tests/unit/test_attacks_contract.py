"""The attack contract: registry, applicability checks and observation validation."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

from vflsec.services.attacks import ATTACKS, NotApplicable, Observations, make_attack, run_attack
from vflsec.services.attacks.synthetic import lr_task

WHITE_BOX = [
    "esa", "ls", "ls_clamped", "cls", "half_star", "rcc1", "rcc2", "gia",
    "grn", "grn_noise_only", "grn_xadv_only", "grn_no_reg", "grn_direct", "am", "ram",
]  # fmt: skip
BLIND = ["half", "zero", "rg"]


def test_registry_holds_every_attack() -> None:
    assert set(WHITE_BOX + BLIND + ["sign_only"]) <= set(ATTACKS)
    assert make_attack("grn_no_reg").name == "grn_no_reg"
    with pytest.raises(ValueError, match="unknown attack"):
        make_attack("nope")


@pytest.mark.parametrize("name", WHITE_BOX)
def test_white_box_attacks_refuse_withheld_passive_weights(name: str) -> None:
    task = lr_task(20, 3, 4, 3, n_train=50, seed=1)
    withheld = dataclasses.replace(task.obs, w_passive=None)
    with pytest.raises(NotApplicable, match="w_passive") as info:
        run_attack(make_attack(name), withheld)
    assert "w_passive" in info.value.reason


@pytest.mark.parametrize("name", BLIND)
def test_blind_attacks_need_nothing(name: str) -> None:
    task = lr_task(20, 3, 4, 3, seed=1)
    bare = Observations(x_active=task.obs.x_active, scores=None, n_classes=3, d_passive=4)
    x_hat = run_attack(make_attack(name), bare).x_passive
    assert x_hat.shape == (20, 4) and np.all((x_hat >= 0) & (x_hat <= 1))


def test_agnostic_attacks_need_the_active_training_rows() -> None:
    task = lr_task(20, 3, 4, 3, seed=1)  # no training rows
    with pytest.raises(NotApplicable, match="train_x_active"):
        run_attack(make_attack("am"), task.obs)


def test_ram_needs_delivered_scores_but_am_does_not() -> None:
    task = lr_task(20, 3, 2, 3, n_train=200, seed=1)
    no_scores = dataclasses.replace(task.obs, scores=None)
    assert run_attack(make_attack("am"), no_scores).x_passive.shape == (20, 2)
    with pytest.raises(NotApplicable, match="scores"):
        run_attack(make_attack("ram"), no_scores)


def test_random_guess_is_seeded() -> None:
    task = lr_task(20, 3, 4, 3, seed=1)
    first = run_attack(make_attack("rg", seed=3), task.obs).x_passive
    np.testing.assert_array_equal(first, run_attack(make_attack("rg", seed=3), task.obs).x_passive)
    assert not np.array_equal(first, run_attack(make_attack("rg", seed=4), task.obs).x_passive)


def test_observations_validate_shapes() -> None:
    x = np.zeros((5, 3))
    with pytest.raises(ValueError, match="scores"):
        Observations(x_active=x, scores=np.zeros((5, 2)), n_classes=3, d_passive=2)
    with pytest.raises(ValueError, match="w_passive"):
        Observations(x_active=x, scores=None, n_classes=3, d_passive=2, w_passive=np.zeros((3, 4)))
    with pytest.raises(ValueError, match="together"):
        Observations(x_active=x, scores=None, n_classes=3, d_passive=2, train_x_active=x)
    sigmoid = Observations(x_active=x, scores=None, n_classes=2, d_passive=2, w_active=np.zeros((1, 3)))
    assert sigmoid.k_logits == 1


@pytest.mark.parametrize("name", ["esa", "rcc2", "am", "ram", "gia", "grn"])
def test_attacks_accept_read_only_recordings(name: str) -> None:
    # The curious plugin's store hands out read-only arrays; torch warns (and may misbehave) on those.
    task = lr_task(50, 3, 2, 3, n_train=100, seed=2)

    def frozen(values: np.ndarray) -> np.ndarray:
        out = np.array(values)
        out.setflags(write=False)
        return out

    obs = dataclasses.replace(
        task.obs,
        x_active=frozen(task.obs.x_active),
        scores=frozen(task.obs.scores),
        train_x_active=frozen(task.obs.train_x_active),
        train_y=frozen(task.obs.train_y),
    )
    options = {"grn": {"epochs": 1, "hidden": (8,)}, "gia": {"steps": 5}}.get(name, {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isfinite(run_attack(make_attack(name, **options), obs).x_passive).all()
