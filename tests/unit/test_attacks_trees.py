"""PRA and GRN on released trees and forests, and the exact attack on a released linear passive bottom.

Trees are scikit-learn's (DT depth 5, RF 100 × depth 3) trained on half of a real dataset's rows
(``synthetic.trained_tree_task``); every figure is on the other, held-out half. Random draws (PRA's path
choice, the baselines) come from fresh OS entropy: the margins asserted are many standard errors wide
(docs/attacks.md, "Trees", has the measured spreads).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from vflsec.services.attacks import NotApplicable, Observations, make_attack, mse, run_attack
from vflsec.services.attacks.released import ReleasedTree, TreeNode, from_sklearn
from vflsec.services.attacks.synthetic import trained_splitnn_task, trained_tree_task
from vflsec.services.attacks.trees import correct_branching_rate, random_path_cbr, vote_fractions

TRIALS = 10


@pytest.fixture(scope="module")
def digits_tree():  # type: ignore[no-untyped-def]
    return trained_tree_task("digits", "tree")


def _welch_z(a: list[float], b: list[float]) -> float:
    se = np.sqrt(np.var(a, ddof=1) / len(a) + np.var(b, ddof=1) / len(b))
    return float((np.mean(a) - np.mean(b)) / max(se, 1e-12))


# luo's Fig. 2 in small: the active root (x_a ≤ 0.5) leads to a passive node (x_p ≤ 0.3) or straight to class 1.
SMALL = ReleasedTree(
    (
        TreeNode("active", 0, 0.5, 1, 4),
        TreeNode("passive", 0, 0.3, 2, 3),
        TreeNode(value=(1.0, 0.0)),
        TreeNode(value=(0.0, 1.0)),
        TreeNode(value=(0.0, 1.0)),
    )
)


def test_pra_and_cbr_on_a_hand_built_tree() -> None:
    x_active, x_true = np.array([[0.2], [0.8], [0.2]]), np.array([[0.9], [0.7], [0.1]])
    obs = Observations(x_active, np.eye(2)[[1, 1, 0]], n_classes=2, d_passive=1, released_trees=(SMALL,))
    result = run_attack(make_attack("pra"), obs)
    # Row 0: class 1 below the active split leaves only x_p > 0.3 → midpoint of (0.3, 1]; row 1: the path tests no
    # passive feature → Half; row 2: class 0 → x_p ≤ 0.3 → midpoint of [0, 0.3].
    assert np.allclose(result.x_passive[:, 0], [0.65, 0.5, 0.15])
    assert list(result.meta["n_candidates"]) == [1, 1, 1]
    assert correct_branching_rate((SMALL,), x_active, x_true, result.x_passive) == 1.0  # 2 of 2 passive branchings
    assert correct_branching_rate((SMALL,), x_active, x_true, np.array([[0.1], [0.5], [0.9]])) == 0.0
    assert np.isnan(correct_branching_rate((SMALL,), x_active[1:2], x_true[1:2], x_true[1:2]))
    # Random path: leaf 2 agrees with x_p = 0.1, leaf 3 does not, leaf 4 tests nothing → 1/2 in expectation.
    rate = random_path_cbr(SMALL, np.full((4000, 1), 0.1), np.random.default_rng())
    assert abs(rate - 0.5) < 0.05  # 4000 draws: one standard error is 0.01
    with pytest.raises(NotApplicable, match="withheld"):
        run_attack(make_attack("pra"), dataclasses.replace(obs, released_trees=(SMALL.withheld(),)))


@pytest.mark.parametrize("dataset", ["digits", "breast_cancer"])
def test_pra_beats_the_random_path_baseline(dataset: str) -> None:
    task = trained_tree_task(dataset, "tree")
    obs = task.observe()
    pra, baseline = [], []
    for _ in range(TRIALS):
        x_hat = run_attack(make_attack("pra"), obs).x_passive
        pra.append(correct_branching_rate(task.trees, task.x_active, task.x_passive, x_hat))
        baseline.append(random_path_cbr(task.trees[0], task.x_passive, np.random.default_rng()))
    # Measured on this split over 10 draws: digits 0.816 ± 0.008 vs 0.549 ± 0.005, breast_cancer 0.800 ± 0.022 vs
    # 0.564 ± 0.014 (over 10 splits: docs/attacks.md, "Trees").
    assert np.mean(pra) > np.mean(baseline) + 0.1, (pra, baseline)
    assert _welch_z(pra, baseline) > 5, (pra, baseline)


def test_pra_estimate_follows_a_candidate_path_of_the_released_class(digits_tree) -> None:  # type: ignore[no-untyped-def]
    obs = digits_tree.observe()
    result = run_attack(make_attack("pra"), obs)
    tree = digits_tree.trees[0]
    leaf = tree.route(digits_tree.x_active, result.x_passive)
    assert np.array_equal(leaf, result.meta["leaf"])  # the midpoints satisfy every constraint of the chosen path
    assert not result.meta["no_candidate"].any()
    assert np.array_equal(vote_fractions((tree,), digits_tree.x_active, result.x_passive, 10), obs.scores)
    assert (result.meta["n_candidates"] >= 1).all() and (result.x_passive >= 0).all() and (result.x_passive <= 1).all()


def test_pra_and_grn_rf_are_not_applicable_when_passive_thresholds_are_withheld(digits_tree) -> None:  # type: ignore[no-untyped-def]
    obs = digits_tree.observe(withhold=True)
    assert any(n.owner == "passive" for n in obs.released_trees[0].nodes)  # there was something to withhold
    for name in ("pra", "grn_rf"):
        with pytest.raises(NotApplicable, match="withheld"):
            run_attack(make_attack(name), obs)
    with pytest.raises(NotApplicable, match="released_trees"):
        run_attack(make_attack("pra"), dataclasses.replace(obs, released_trees=None))


def test_pra_refers_forests_to_grn_rf() -> None:
    with pytest.raises(NotApplicable, match="grn_rf"):
        run_attack(make_attack("pra"), trained_tree_task("wine", "forest").observe())


def test_released_trees_predict_as_scikit_learn() -> None:
    from sklearn.datasets import load_wine
    from sklearn.ensemble import RandomForestClassifier

    x, y = load_wine(return_X_y=True)
    forest = RandomForestClassifier(n_estimators=7, max_depth=3, random_state=1).fit(x, y)
    trees = from_sklearn(forest, d_active=6)
    votes = vote_fractions(trees, x[:, :6], x[:, 6:], 3)
    expected = np.mean([np.eye(3)[e.predict(x).astype(int)] for e in forest.estimators_], axis=0)
    assert np.allclose(votes, expected)
    assert {n.owner for t in trees for n in t.nodes} == {None, "active", "passive"}


def test_grn_rf_beats_its_random_baselines() -> None:
    task = trained_tree_task("breast_cancer", "forest")
    result = run_attack(make_attack("grn_rf", dummy=5000, epochs=10, grn_epochs=20), task.observe())
    assert result.meta["surrogate_agreement"] > 0.9

    def cbr(x_hat: np.ndarray) -> float:
        return correct_branching_rate(task.trees, task.x_active, task.x_passive, x_hat)

    rng = np.random.default_rng()
    uniform = [cbr(rng.uniform(size=task.x_passive.shape)) for _ in range(TRIALS)]
    half = cbr(np.full_like(task.x_passive, 0.5))
    # Measured on this split: 0.718 at this budget (0.689 at the default) against U(0, 1) 0.55 ± 0.01 and Half 0.56
    # (docs/attacks.md, "Trees": 0.665 ± 0.024 over two splits at the default budget).
    assert cbr(result.x_passive) > max(np.mean(uniform) + 10 * np.std(uniform), half + 0.05), (uniform, half)


def test_embedding_ls_is_exact_on_a_released_linear_bottom() -> None:
    task = trained_splitnn_task("breast_cancer", "active-top")
    obs = task.observe()
    result = run_attack(make_attack("embedding_ls"), obs)
    half = mse(task.x_passive, np.full_like(task.x_passive, 0.5))
    assert mse(task.x_passive, result.x_passive) < 1e-9 * half
    assert result.meta["rank"] == obs.d_passive and result.meta["exact"]
    wrapped = dataclasses.replace(obs, passive_bottom=nn.Sequential(obs.passive_bottom))
    assert np.allclose(run_attack(make_attack("embedding_ls"), wrapped).x_passive, result.x_passive)
    with pytest.raises(NotApplicable, match="passive_bottom"):
        run_attack(make_attack("embedding_ls"), task.observe(passive_bottom=False))


def test_embedding_ls_on_a_narrow_bottom_and_not_on_a_nonlinear_one() -> None:
    x_passive = np.random.default_rng().uniform(size=(20, 6))
    narrow, nonlinear = nn.Linear(6, 4), nn.Sequential(nn.Linear(6, 8), nn.ReLU())

    def observe(bottom: nn.Module) -> Observations:
        with torch.no_grad():
            z = bottom(torch.from_numpy(x_passive).float()).double().numpy()
        return Observations(np.zeros((20, 2)), None, n_classes=2, d_passive=6, embeddings=z, passive_bottom=bottom)

    # Width 4 < d_B = 6: the embeddings are matched exactly, x_B only up to W_B's two-dimensional null space.
    result = run_attack(make_attack("embedding_ls"), observe(narrow))
    assert result.meta["rank"] == 4 and not result.meta["exact"]
    assert np.max(result.meta["residual"]) < 1e-5
    assert mse(x_passive, result.x_passive) > 1e-4
    with pytest.raises(NotApplicable, match="not a single linear layer"):
        run_attack(make_attack("embedding_ls"), observe(nonlinear))


def test_the_tree_familys_released_forest_reads_as_the_attacks_view() -> None:
    from vflsec.services.attacks.released import from_family
    from vflsec.services.attacks.trees import vote_fractions
    from vflsec.services.models.tree import TreeConfig, TreeData, simulate

    data = TreeData.load("wine", n_passive=2)
    federation = simulate(TreeConfig.forest(n_trees=5, seed=1), data, "plain").federation
    x_active, x_passive = data.test[0], np.hstack(data.test[1:])
    widths = [block.shape[1] for block in data.test[1:]]
    trees = from_family(federation.released("full"), widths)
    votes = vote_fractions(trees, x_active, x_passive, data.n_classes)
    np.testing.assert_allclose(votes, federation.predict(data.test))  # the same paths, hence the same votes
    withheld = from_family(federation.released("withhold"), widths)
    assert any(t.withholds_passive for t in withheld)
    assert all(n.threshold is None for t in withheld for n in t.nodes if n.owner == "passive")
