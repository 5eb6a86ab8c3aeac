"""GIA and GRN against split neural networks through the one attack contract, scored on held-out rows.

The models are two-branch split networks trained centrally on real data (``synthetic.trained_splitnn_task``:
trained on half the rows, the other half queried). Half (x̂ = ½·1) is the blind baseline.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from vflsec.services.attacks import Attack, NotApplicable, Observations, Reconstruction, make_attack, mse, run_attack
from vflsec.services.attacks.aware import AwareScores
from vflsec.services.attacks.gradient import LinearScoreModel, ReleasedScoreModel, fit_target
from vflsec.services.attacks.synthetic import lr_task, trained_splitnn_task

SPLITS = range(4)


def half_mse(task) -> float:  # type: ignore[no-untyped-def]
    return mse(task.x_passive, np.full_like(task.x_passive, 0.5))


@pytest.fixture(scope="module")
def active_top():  # type: ignore[no-untyped-def]
    return trained_splitnn_task("breast_cancer", "active-top")


def test_grn_beats_half_through_a_released_coordinator_top_model() -> None:
    # digits (C = 10, 26 passive features), mean over four splits of rows and columns, as for LR. Measured per
    # split (docs/attacks.md, "Split neural networks"): GRN beats Half on each of the four, by 2-18 %; GIA only on
    # three of them (4.7 % on average), so GIA is measured, not asserted, in this topology.
    errors: dict[str, list[float]] = {"half": [], "grn": []}
    for seed in SPLITS:
        task = trained_splitnn_task("digits", seed=seed)
        obs = task.observe()
        assert obs.score_model is not None and obs.embeddings is None and obs.w_passive is None
        errors["half"].append(half_mse(task))
        errors["grn"].append(mse(task.x_passive, run_attack(make_attack("grn"), obs).x_passive))
    assert np.mean(errors["grn"]) < 0.95 * np.mean(errors["half"]), errors


def test_active_top_embeddings_with_a_released_passive_bottom_give_the_features_away(active_top) -> None:  # type: ignore[no-untyped-def]
    obs = active_top.observe()
    assert obs.embeddings is not None and obs.embeddings.shape == (len(active_top.x_passive), 12)
    half = half_mse(active_top)
    gia = run_attack(make_attack("gia"), obs)
    grn = run_attack(make_attack("grn"), obs)
    assert gia.meta["target"] == grn.meta["target"] == "embeddings"
    # z_B = W_B x_B + b with W_B of full column rank: GIA solves a convex least-squares problem per row; GRN
    # predicts held-out rows from x_act after learning on the other fold's embeddings.
    assert mse(active_top.x_passive, gia.x_passive) < 0.3 * half
    assert mse(active_top.x_passive, grn.x_passive) < 0.5 * half
    scores_only = run_attack(make_attack("gia", target="scores"), obs)
    assert scores_only.meta["target"] == "scores"
    assert mse(active_top.x_passive, gia.x_passive) < mse(active_top.x_passive, scores_only.x_passive)


@pytest.mark.parametrize("name", ["gia", "grn"])
def test_active_top_without_the_passive_bottom_is_not_applicable(active_top, name: str) -> None:  # type: ignore[no-untyped-def]
    obs = active_top.observe(passive_bottom=False)
    assert obs.embeddings is not None and obs.score_model is None and obs.passive_bottom is None
    with pytest.raises(NotApplicable, match="unknown W_B"):
        run_attack(make_attack(name), obs)
    with pytest.raises(NotApplicable, match="passive bottom model was not released"):
        run_attack(make_attack(name, target="embeddings"), obs)


@pytest.mark.parametrize("name", ["gia", "grn"])
def test_a_withheld_model_or_missing_recordings_are_not_applicable(name: str) -> None:
    task = lr_task(20, 3, 4, 3, seed=1)
    bare = Observations(x_active=task.obs.x_active, scores=task.obs.scores, n_classes=3, d_passive=4)
    with pytest.raises(NotApplicable, match="released model"):
        run_attack(make_attack(name), bare)
    with pytest.raises(NotApplicable, match="no passive embeddings"):
        run_attack(make_attack(name, target="embeddings"), task.obs)
    with pytest.raises(NotApplicable, match="needs scores"):
        run_attack(make_attack(name), dataclasses.replace(task.obs, scores=None))


def test_the_lr_blocks_and_the_same_model_as_a_score_model_are_one_attack() -> None:
    # The LR path is unchanged (LinearScoreModel from the blocks); handing the same LR over as a score_model
    # gives the same scores, so a released model of any family goes through the same GIA and GRN.
    task = lr_task(30, 3, 4, 3, seed=2)
    w_active, w_passive, bias = (
        torch.tensor(np.asarray(v), dtype=torch.float32) for v in (task.obs.w_active, task.obs.w_passive, task.obs.bias)
    )

    class Lr(torch.nn.Module):
        def forward(self, x_active: torch.Tensor, x_passive: torch.Tensor) -> torch.Tensor:
            return torch.softmax(x_active @ w_active.T + x_passive @ w_passive.T + bias, dim=1)

    as_model = dataclasses.replace(task.obs, score_model=Lr())
    blocks, released = fit_target(task.obs, "gia"), fit_target(as_model, "gia")
    assert isinstance(blocks.model, LinearScoreModel) and isinstance(released.model, ReleasedScoreModel)
    x = torch.rand(30, 4)
    torch.testing.assert_close(blocks.model(x), released.model(x), atol=1e-5, rtol=1e-5)
    rows = torch.tensor([3, 7])
    torch.testing.assert_close(blocks.model(x[rows], rows), released.model(x[rows], rows), atol=1e-5, rtol=1e-5)
    lr_gia = run_attack(make_attack("gia", steps=100), task.obs).x_passive
    np.testing.assert_allclose(run_attack(make_attack("gia", steps=100), as_model).x_passive, lr_gia, atol=1e-3)


def test_the_attack_leaves_the_released_model_untouched(active_top) -> None:  # type: ignore[no-untyped-def]
    model = active_top.model.train()  # as a caller might hand it over: training mode, gradients on
    model.requires_grad_(True).zero_grad(set_to_none=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        obs = dataclasses.replace(active_top.observe(), embeddings=None, passive_bottom=None)
        run_attack(make_attack("gia", steps=5), obs)
        assert all(p.grad is None for p in model.parameters())
        assert model.training
        for key, value in model.state_dict().items():
            torch.testing.assert_close(value, before[key], rtol=0, atol=0)
    finally:
        model.eval().requires_grad_(False)


class _Recorder(Attack):
    """Records the scores it is handed (the aware wrapper's de-biased estimate) and returns Half."""

    def reconstruct(self, obs: Observations) -> Reconstruction:
        self.scores = np.asarray(obs.scores)
        return Reconstruction(np.full((obs.n_samples, obs.d_passive), 0.5))


class _AwareRecorder(AwareScores, _Recorder):
    """The aware wrapper around the recorder: what it records is the de-biased estimate."""


def test_privee_keeps_the_argmax_of_split_nn_scores_and_the_aware_attacks_undo_its_bias() -> None:
    task = trained_splitnn_task("breast_cancer")
    exact = task.observe().scores
    defended = task.observe(("privee:epsilon=0.1",))
    np.testing.assert_array_equal(defended.scores.argmax(axis=1), exact.argmax(axis=1))
    recorder = _AwareRecorder()
    run_attack(recorder, defended)
    # The de-biased estimate is a distribution and far closer to the true scores than the released ones
    # (measured mean absolute error 0.003-0.004 against 5.4 over three draws).
    np.testing.assert_allclose(recorder.scores.sum(axis=1), 1.0, rtol=1e-9)
    assert np.abs(recorder.scores - exact).mean() < 0.01 * np.abs(defended.scores - exact).mean()
    assert run_attack(make_attack("aware_gia", steps=5), defended).meta["defense"] == ["privee"]
    with pytest.raises(NotApplicable, match="no score defense"):
        run_attack(make_attack("aware_grn"), task.observe())
    with pytest.raises(NotApplicable, match="only an order"):
        run_attack(make_attack("aware_gia"), task.observe(("label_only",)))
