"""The passive party's label attacks of services/attacks/label_completion.py on synthetic observations whose labels
are known here (and only here): each must read the labels where the observations carry them, scored on rows it was
not given, and fall to the blind baseline where they do not."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.unit.test_attacks_labels import binary_gradients
from vflsec.services.attacks import NotApplicable, Observations, Reconstruction, auc, make_attack, run_attack


def passive_obs(n: int, n_classes: int = 2, **fields: object) -> Observations:
    return Observations(x_active=np.zeros((n, 0)), scores=None, n_classes=n_classes, d_passive=4, **fields)


def given(obs: Observations, y: np.ndarray, k: int, seed: int = 0) -> tuple[Observations, np.ndarray]:
    """``obs`` with the labels of k rows (the harness's draw), and the other rows' positions."""
    rows = np.sort(np.random.default_rng(seed).choice(obs.n_samples, size=k, replace=False))
    return dataclasses.replace(obs, labelled_rows=rows, labelled_labels=y[rows]), np.setdiff1d(
        np.arange(obs.n_samples), rows
    )


def majority(y: np.ndarray) -> float:
    return float(np.bincount(y).max() / len(y))


def test_model_completion_reads_the_labels_off_a_trained_bottom_on_rows_it_was_not_given() -> None:
    rng = np.random.default_rng(0)
    n, c = 1500, 3
    y = rng.integers(0, c, n)
    x_own = rng.normal(size=(n, 4))  # raw features: the class shows only through the bottom's nonlinearity
    centres = 3.0 * rng.normal(size=(c, 6))
    outputs = centres[y] + rng.normal(size=(n, 6))  # a trained bottom separates the classes
    obs, scored = given(passive_obs(n, c, x_own=x_own, own_outputs=outputs), y, 50)
    result = run_attack(make_attack("completion", family="splitnn"), obs)
    accuracy = np.mean(result.label_predictions[scored] == y[scored])
    assert accuracy > 0.9 > majority(y[scored]) + 0.4
    # the same head on the raw features with the same 50 labels: no better than the prior
    own = result.meta["own_features"].label_predictions[scored]
    assert np.mean(own == y[scored]) < majority(y[scored]) + 0.1
    # an uninformative bottom gives nothing either: the attack can fail
    blind = dataclasses.replace(obs, own_outputs=rng.normal(size=(n, 6)))
    assert np.mean(run_attack(make_attack("completion"), blind).label_predictions[scored] == y[scored]) < 0.45


def test_model_completion_on_tree_partitions_and_binary_auc() -> None:
    rng = np.random.default_rng(1)
    n = 1200
    y = (rng.random(n) < 0.2).astype(int)
    # nodes of mostly one class (a tree's splits are chosen for purity), each a random fifth of its class plus 5 % noise
    partitions = []
    for _ in range(40):
        label = rng.integers(0, 2)
        members = np.flatnonzero((y == label) & (rng.random(n) < 0.2) | (rng.random(n) < 0.01))
        partitions.append(members)
    obs, scored = given(passive_obs(n, x_own=rng.normal(size=(n, 4)), partitions=tuple(partitions)), y, 50)
    result = run_attack(make_attack("completion", family="tree"), obs)
    assert result.meta["features"] == "partitions"
    assert auc(y[scored], result.label_scores[scored]) > 0.9
    assert abs(auc(y[scored], result.meta["own_features"].label_scores[scored]) - 0.5) < 0.1
    # the default k is a few labelled rows: at most half of them
    assert make_attack("completion").auxiliary_rows(60) == 30 and make_attack("completion").auxiliary_rows(10**4) == 50
    with pytest.raises(NotApplicable, match="labelled rows"):
        run_attack(make_attack("completion"), dataclasses.replace(obs, labelled_rows=None, labelled_labels=None))


def test_direct_label_inference_needs_gradients_of_the_logits() -> None:
    rng = np.random.default_rng(2)
    n, c = 300, 4
    y = rng.integers(0, c, n)
    logits = rng.normal(size=(n, c))
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    g = p - np.eye(c)[y]  # ∂L/∂logits of softmax cross-entropy
    fields = {"gradients": g, "gradient_rows": np.arange(n), "gradient_steps": np.ones(n, int)}
    result = run_attack(make_attack("direct", family="splitnn"), passive_obs(n, c, **fields))
    assert np.array_equal(result.label_predictions, y)
    # ∂L/∂h below a top model: not of that form, and the attack says so
    below = {**fields, "gradients": g @ rng.normal(size=(c, 8))}
    with pytest.raises(NotApplicable, match="not ∂L/∂logits"):
        run_attack(make_attack("direct"), passive_obs(n, c, **below))


def test_gradient_clustering_separates_the_classes_and_names_the_rarer_one() -> None:
    obs, y = binary_gradients(np.random.default_rng(3))
    seen = np.bincount(obs.gradient_rows, minlength=obs.n_samples) > 0
    obs = dataclasses.replace(
        obs,
        gradient_rows=np.concatenate([obs.gradient_rows, np.flatnonzero(~seen)]),
        gradient_steps=np.concatenate([obs.gradient_steps, np.full((~seen).sum(), obs.gradient_steps.max() + 1)]),
        gradients=np.vstack([obs.gradients, (0.9 - y[~seen])[:, None] * np.ones((1, obs.gradients.shape[1]))]),
    )
    result = run_attack(make_attack("clustering", family="splitnn"), obs)
    assert auc(y, result.label_scores) > 0.9
    # named the other way (class 0 taken for the rarer), the same clusters read upside down
    assert auc(y, run_attack(make_attack("clustering", positive=0), obs).label_scores) < 0.1
    # gradients of the same law whatever the label: blind
    blind, y_blind = binary_gradients(np.random.default_rng(3), informative=False, steps=40)
    seen = np.bincount(blind.gradient_rows, minlength=blind.n_samples) > 0
    keep = np.isin(blind.gradient_rows, np.flatnonzero(seen))
    position = np.cumsum(seen) - 1
    blind = dataclasses.replace(
        blind, x_active=np.zeros((int(seen.sum()), 0)), gradient_rows=position[blind.gradient_rows[keep]],
        gradients=blind.gradients[keep], gradient_steps=blind.gradient_steps[keep],
    )  # fmt: skip
    assert abs(auc(y_blind[seen], run_attack(make_attack("clustering"), blind).label_scores) - 0.5) < 0.1


def test_gradient_clustering_names_many_classes_with_labelled_rows() -> None:
    rng = np.random.default_rng(4)
    n, c, width = 600, 5, 12
    y = rng.integers(0, c, n)
    directions = rng.normal(size=(c, width))
    g = (0.2 + rng.random(n))[:, None] * (directions[y] + 0.3 * rng.normal(size=(n, width)))
    fields = {"gradients": g, "gradient_rows": np.arange(n), "gradient_steps": np.arange(n) // 100}
    obs = passive_obs(n, c, **fields)
    with pytest.raises(NotApplicable, match="needs labelled rows"):
        run_attack(make_attack("clustering"), obs)
    obs, scored = given(obs, y, 30)
    result = run_attack(make_attack("clustering", k=30), obs)
    assert np.mean(result.label_predictions[scored] == y[scored]) > 0.9


def tree_partitions(rng: np.random.Generator, y: np.ndarray, x: np.ndarray, trees: int) -> tuple[np.ndarray, ...]:
    """Nodes of depth-3 trees grown on a feature that carries the label, each tree on a bootstrap-like subset."""
    n = len(y)
    nodes = []
    for _ in range(trees):
        rows = np.flatnonzero(rng.random(n) < 0.7)
        frontier = [rows]
        for _depth in range(3):
            children = []
            for node in frontier:
                feature = x[node, rng.integers(0, x.shape[1])]
                cut = np.median(feature)
                children += [node[feature <= cut], node[feature > cut]]
            nodes += children
            frontier = children
    return tuple(node for node in nodes if len(node))


def test_id2graph_reads_the_labels_from_the_partitions_alone() -> None:
    rng = np.random.default_rng(5)
    n = 800
    y = (rng.random(n) < 0.25).astype(int)
    x = y[:, None] * 2.0 + rng.normal(size=(n, 2))  # the splits follow columns that carry the label
    obs = passive_obs(n, x_own=x, partitions=tree_partitions(rng, y, x, trees=10))
    result = run_attack(make_attack("id2graph", family="forest"), obs)
    assert auc(y, result.label_scores) > 0.85
    # partitions on columns that know nothing of the label: blind
    noise = rng.normal(size=(n, 2))
    blind = dataclasses.replace(obs, partitions=tree_partitions(rng, y, noise, trees=10))
    assert abs(auc(y, run_attack(make_attack("id2graph"), blind).label_scores) - 0.5) < 0.1


def lr_training(rng: np.random.Generator, informative: bool, batch: int = 50) -> tuple[Observations, np.ndarray]:
    """A passive party's view of LR training: its own gradient (p − y)ᵀX_B / b of each step, p from the whole model
    (an active share it does not know), and its rows."""
    n, d = 1000, 4
    x = rng.normal(size=(n, d))
    active = rng.normal(size=n)
    w_true = np.array([1.5, -1.0, 0.5, 0.0])
    logit = x @ w_true + active if informative else active
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(int)
    w, w_a = np.zeros(d), 0.0
    gradients, rows = [], []
    for _epoch in range(3):
        for batch_rows in np.array_split(rng.permutation(n), n // batch):
            p = 1 / (1 + np.exp(-(x[batch_rows] @ w + w_a * active[batch_rows])))
            delta = p - y[batch_rows]
            g = delta @ x[batch_rows] / len(batch_rows)
            gradients.append(g[None, :])
            rows.append(batch_rows)
            w, w_a = w - 0.5 * g, w_a - 0.5 * delta @ active[batch_rows] / len(batch_rows)
    blocks = np.stack(gradients)
    obs = passive_obs(n, x_own=x, block_gradients=blocks, block_rows=tuple(rows), own_outputs=(x @ w)[:, None])
    return obs, y


@pytest.mark.parametrize("name", ["residuals", "own_logit"])
def test_lr_attacks_read_what_the_passive_block_knows_of_the_label(name: str) -> None:
    obs, y = lr_training(np.random.default_rng(6), informative=True)
    ideal = auc(y, obs.x_own @ np.array([1.5, -1.0, 0.5, 0.0]))  # the best any score of the passive columns can do
    found = auc(y, run_attack(make_attack(name, family="lr"), obs).label_scores)
    assert found > 0.7 and found > ideal - 0.05


def test_own_gradients_leak_a_batchs_labels_even_through_columns_that_know_nothing_of_them() -> None:
    """With columns independent of the label, the trained block is blind, but each step's gradient is d_p functionals
    of its batch's residuals: their least-squares fit follows the batch's own labels (the leak the batch bound
    n ≥ 2 d_p limits, docs/protocol.md), by about √(d_p / b), and fades as the batch grows."""
    leaks = {}
    for batch in (10, 50, 500):
        obs, y = lr_training(np.random.default_rng(7), informative=False, batch=batch)
        leaks[batch] = auc(y, run_attack(make_attack("residuals"), obs).label_scores)
        assert abs(auc(y, run_attack(make_attack("own_logit"), obs).label_scores) - 0.5) < 0.06
    assert leaks[10] > leaks[50] > 0.6 > leaks[500] > 0.5


def test_the_harness_gives_labelled_rows_of_every_class_and_scores_the_others() -> None:
    from vflsec.client.experiments.harness import label_figures, with_labels

    y = np.array([0] * 90 + [1] * 8 + [2] * 2)
    obs = passive_obs(len(y), 3, x_own=np.zeros((len(y), 1)))
    given_obs, scored = with_labels(obs, y, 9, seed=0)
    rows = given_obs.labelled_rows
    # k // C of each class, but never a class's last row: a class of 2 rows gives 1
    assert np.bincount(y[rows], minlength=3).tolist() == [3, 3, 1]
    assert np.array_equal(given_obs.labelled_labels, y[rows])
    assert not set(rows) & set(scored) and len(rows) + len(scored) == len(y)
    predicted = np.where(np.arange(len(y)) < 50, 0, 1)
    figures = label_figures(Reconstruction(None, label_predictions=predicted), y, scored, 3)
    assert figures["accuracy"] == pytest.approx(np.mean(predicted[scored] == y[scored]))
    assert figures["recall_per_class"][2] == 0.0 and "auc" not in figures


def test_the_aware_id2graph_reads_an_unsearched_sibling_as_a_leaf_unless_the_defense_hides_it() -> None:
    """A CART tree: the root and both children searched; the left child split, its right child (rows 0-29, every
    row of class 1 among them) never searched — a pure leaf, which the protocol would otherwise have shown."""
    rng = np.random.default_rng(3)
    n = 150
    y = np.zeros(n, dtype=int)
    y[:30] = 1
    left, right, kept = np.arange(60), np.arange(60, n), np.arange(30, 60)
    partitions = (np.arange(n), left, right, kept)
    nodes = ((0, 0), (0, 1), (0, 2), (0, 3))
    shuffle = rng.permutation(n)  # rows in no particular order
    inverse = np.argsort(shuffle)
    obs = passive_obs(n, partitions=tuple(inverse[p] for p in partitions), partition_nodes=nodes,
                      tree_settings={"kind": "tree", "max_depth": 3})  # fmt: skip
    truth = y[shuffle]
    plain = run_attack(make_attack("id2graph"), obs)
    aware = make_attack("id2graph_aware")
    read = run_attack(aware, obs)
    assert auc(truth, read.label_scores) > 0.95 > 0.8 > auc(truth, plain.label_scores)  # measured 1.0 and 0.75
    leaf = aware._membership(obs)[:, -1].toarray().ravel()
    assert set(np.flatnonzero(leaf)) == set(inverse[:30]) and leaf.max() == aware.leaf_weight
    # under passive_depth:depth=2 the protocol would not have shown depth 2: the sibling is a partition, no leaf
    hidden = dataclasses.replace(obs, tree_settings={"kind": "tree", "max_depth": 3,
                                                     "partition_defense": ["passive_depth:depth=2"]})  # fmt: skip
    assert aware._membership(hidden)[:, -1].max() == 1.0
    with pytest.raises(NotApplicable, match="partition_nodes"):
        run_attack(aware, dataclasses.replace(obs, partition_nodes=None))
