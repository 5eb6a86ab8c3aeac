"""Li et al.'s label attacks (norm and direction scoring) through the one attack contract, on synthetic split-NN
gradients built as a cross-entropy's ∂L/∂h: ground truth stays here and is read only to score the AUC."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from vflsec.services.attacks import NotApplicable, Observations, auc, make_attack, run_attack

WIDTH = 16


def binary_gradients(
    rng: np.random.Generator, *, steps: int = 20, batch: int = 128, rare: float = 0.1, informative: bool = True
) -> tuple[Observations, np.ndarray]:
    """Observations of a passive party that received ∂L/∂h for ``steps`` batches over n rows (each row once per
    epoch), and the rows' true labels. ∂L/∂h_i = (p_i − y_i)·J_i: p_i a model that has learnt a little beyond the
    prior, J_i = ∂logit/∂h_i a shared direction plus per-row variation (a nonlinear top model). Without label
    information the rows get gradients of the same law whatever their label."""
    n = 512
    y = (rng.random(n) < rare).astype(int)
    x = rng.normal(size=n)  # a feature the model uses a little
    axis = rng.normal(size=WIDTH)
    gradients, rows, step_of = [], [], []
    for step in range(1, steps + 1):
        index = rng.permutation(n)[:batch]
        logit = np.log(rare / (1 - rare)) + 0.5 * x[index] + 0.2 * rng.normal(size=batch)
        p = 1 / (1 + np.exp(-logit))
        jacobian = axis + 0.5 * rng.normal(size=(batch, WIDTH))
        residual = p - y[index] if informative else p - (rng.random(batch) < rare)
        gradients.append(residual[:, None] * jacobian)
        rows.append(index)
        step_of.append(np.full(batch, step))
    obs = Observations(
        x_active=np.zeros((n, 0)),
        scores=None,
        n_classes=2,
        d_passive=3,
        gradients=np.vstack(gradients),
        gradient_rows=np.concatenate(rows),
        gradient_steps=np.concatenate(step_of),
    )
    return obs, y


@pytest.mark.parametrize("name", ["norm", "cosine"])
def test_gradient_label_attacks_find_the_rare_class(name: str) -> None:
    obs, y = binary_gradients(np.random.default_rng(1))
    result = run_attack(make_attack(name, family="splitnn"), obs)
    seen = np.bincount(obs.gradient_rows, minlength=obs.n_samples) > 0
    # Li et al. report near-perfect AUC on imbalanced data; these gradients carry the label in both size and sign
    assert auc(y[seen], result.label_scores[seen]) > 0.9
    # the attacker who takes the wrong class for the rarer one ranks them upside down: the same leak, read backwards
    flipped = run_attack(make_attack(name, family="splitnn", positive=0), obs)
    assert auc(y[seen], flipped.label_scores[seen]) < 0.1


@pytest.mark.parametrize("name", ["norm", "cosine"])
def test_gradients_without_label_information_leave_the_attacks_blind(name: str) -> None:
    obs, y = binary_gradients(np.random.default_rng(2), steps=60, rare=0.3, informative=False)
    result = run_attack(make_attack(name, family="splitnn"), obs)
    seen = np.bincount(obs.gradient_rows, minlength=obs.n_samples) > 0
    assert abs(auc(y[seen], result.label_scores[seen]) - 0.5) < 0.08  # ~3 standard errors at ~150 of 512 rows


def test_label_attacks_need_gradients_and_two_classes() -> None:
    obs, _ = binary_gradients(np.random.default_rng(3), steps=2)
    with pytest.raises(NotApplicable, match="gradients"):
        run_attack(make_attack("norm"), dataclasses.replace(obs, gradients=None))
    with pytest.raises(NotApplicable, match="binary labels"):
        run_attack(make_attack("cosine"), dataclasses.replace(obs, n_classes=3))
    with pytest.raises(ValueError, match="gradient_rows"):
        dataclasses.replace(obs, gradient_rows=obs.gradient_rows[:-1])
    with pytest.raises(ValueError, match="positive"):
        make_attack("norm", positive=2)


def test_auc_counts_ties_half_and_reads_rankings() -> None:
    y = np.array([0, 0, 1, 1])
    assert auc(y, np.array([0.1, 0.2, 0.3, 0.4])) == 1.0
    assert auc(y, np.array([0.4, 0.3, 0.2, 0.1])) == 0.0
    assert auc(y, np.ones(4)) == 0.5
    assert auc(y, np.array([0.1, 0.3, 0.3, 0.4])) == 0.875
    with pytest.raises(ValueError, match="both classes"):
        auc(np.ones(3), np.arange(3.0))


def test_the_rarer_cluster_is_found_without_labels() -> None:
    from vflsec.services.attacks.labels import larger_cluster_above

    rng = np.random.default_rng(4)
    few_high = np.concatenate([rng.normal(0.2, 0.05, 90), rng.normal(0.8, 0.05, 10)])  # both above 0: no sign rule
    assert not larger_cluster_above(few_high) and larger_cluster_above(-few_high)
