"""Tree family: config validation, quantile bins, the structure and its released views, step state round trips."""

import doctest
import json

import numpy as np
import pytest

from vflsec.services.errors import FailedPrecondition, InvalidArgument
from vflsec.services.models.tree import (
    Builder,
    FeatureOwner,
    LocalFederation,
    QuantileBins,
    TreeConfig,
    TreeData,
    best_split,
    combine,
    simulate,
    structure,
)
from vflsec.services.models.tree.steps import Task


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "boosting"}, "kind must be one of tree, forest"),
        ({"max_depth": 0}, "max_depth must be a positive integer"),
        ({"max_depth": 2.5}, "max_depth must be a positive integer"),
        ({"min_samples_leaf": -1}, "min_samples_leaf"),
        ({"n_bins": 1}, "n_bins must be an integer in [2, 64]"),
        ({"n_bins": 65}, "n_bins must be an integer in [2, 64]"),
        ({"n_trees": 3}, "n_trees must be 1 for kind='tree'"),
        ({"bootstrap": True}, "bootstrap applies to forests only"),
        ({"kind": "forest", "bootstrap": "yes"}, "bootstrap must be a bool"),
        ({"feature_fraction": 0.0}, "feature_fraction must lie in (0, 1]"),
        ({"feature_fraction": 1.5}, "feature_fraction must lie in (0, 1]"),
        ({"feature_fraction": True}, "feature_fraction must lie in (0, 1]"),
        ({"seed": -1}, "seed must be a non-negative integer"),
        ({"kind": "forest", "n_trees": 0}, "n_trees must be a positive integer"),
    ],
)
def test_config_errors(kwargs, message):
    with pytest.raises(ValueError, match="tree config: ") as info:
        TreeConfig(**kwargs)
    assert message in str(info.value)


def test_config_defaults_and_dict_round_trip():
    tree, forest = TreeConfig(), TreeConfig.forest()
    assert (tree.max_depth, tree.n_trees, tree.bootstrap) == (5, 1, False)
    assert (forest.kind, forest.n_trees, forest.max_depth, forest.bootstrap) == ("forest", 100, 3, True)
    assert tree.features_per_node(64) == 64 and forest.features_per_node(64) == 8
    assert TreeConfig.forest(feature_fraction=0.25).features_per_node(13) == 3
    assert TreeConfig.from_dict(json.loads(json.dumps(forest.to_dict()))) == forest
    with pytest.raises(ValueError, match="unknown field"):
        TreeConfig.from_dict({"depth": 3})


def test_quantile_bins_threshold_semantics():
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.normal(size=500), rng.integers(0, 3, 500), np.full(500, 7.0)])
    bins = QuantileBins.fit(X, 8)
    assert bins.sizes == [8, 3, 1]  # 7 interior edges; 3 distinct values -> 2 edges; a constant column -> 1 bin
    B = bins.transform(X)
    for f, size in enumerate(bins.sizes):
        assert B[:, f].min() == 0 and B[:, f].max() == size - 1
        for t in range(size - 1):  # "bin <= t" is exactly "x <= threshold"
            np.testing.assert_array_equal(B[:, f] <= t, X[:, f] <= bins.threshold(f, t))
    assert QuantileBins.from_json(json.loads(json.dumps(bins.to_json()))) == bins
    with pytest.raises(ValueError, match="NaN or infinite"):
        QuantileBins.fit(np.array([[np.nan]]), 4)


def test_structure_docstring_example():
    assert doctest.testmod(structure).failed == 0


def test_best_split_gini_and_midpoint_bin():
    # One party, one feature with 6 bins; rows occupy bins 0, 1 (class 0) and 4, 5 (class 1): the pure cut lies
    # between occupied bins 1 and 4, and scikit-learn's threshold on bin indices (2.5) puts bin 2 left.
    task = Task(0, 0, 0, np.arange(8), np.ones(8), {1: (0,)})
    counts = np.array([[2, 2, 0, 0, 0, 0], [0, 0, 0, 0, 2, 2]], dtype=float)
    weights, totals = {1: counts.sum(axis=0)}, counts.sum(axis=1)
    split = best_split(task, {1: counts}, weights, totals, [[], [6]], min_samples_leaf=1)
    assert (split.owner, split.feature, split.bin) == (1, 0, 2)
    assert split.proxy == pytest.approx(8.0)  # both sides pure: Σ c²/n = 4 + 4
    assert best_split(task, {1: counts}, weights, totals, [[], [6]], min_samples_leaf=5) is None
    with pytest.raises(InvalidArgument, match="columns"):
        best_split(task, {1: counts[:, :5]}, weights, totals, [[], [6]], 1)


def test_counts_that_do_not_add_up_to_the_bin_weights_and_class_totals_are_no_candidate():
    """Review 11 F1 / F2: crafted products (a passive party) or indicators (the active party) give counts that do
    not match the bins' owner's weights or the node's class totals; such a feature never wins, and the leaf size is
    judged on the owner's weights, so a chosen split always passes its owner's partition."""
    task = Task(0, 0, 0, np.arange(8), np.ones(8), {1: (0,)})
    honest = np.array([[2, 2, 0, 0, 0, 0], [0, 0, 0, 0, 2, 2]], dtype=float)
    weights, totals = {1: honest.sum(axis=0)}, honest.sum(axis=1)
    assert best_split(task, {1: honest}, weights, totals, [[], [6]], 1) is not None
    shifted = honest + np.array([[3, 0, 0, 0, 0, 0], [0] * 6])  # a mask sum moved: class 0 heavier in bin 0
    assert best_split(task, {1: shifted}, weights, totals, [[], [6]], 1) is None
    one_row = np.array([[1, 0, 0, 0, 0, 0], [0] * 6], dtype=float)  # indicators isolating one row
    assert best_split(task, {1: one_row}, weights, totals, [[], [6]], 1) is None
    # Leaf sizes come from the weights: bins 0-1 weigh 3 in the owner's word, so no cut leaves min_samples_leaf 4.
    light = {1: np.array([1, 2, 0, 0, 3, 2], dtype=float)}
    counts = np.array([[1, 2, 0, 0, 0, 0], [0, 0, 0, 0, 3, 2]], dtype=float)
    assert best_split(task, {1: counts}, light, counts.sum(axis=1), [[], [6]], 4) is None


def test_state_round_trip_resumes_the_same_forest():
    data = TreeData.load("wine")
    config = TreeConfig.forest(n_trees=3, seed=4)
    whole = simulate(config, data).federation
    run = LocalFederation.create(config, data)
    for _ in range(5):
        run.grow_node()
    # Checkpoint mid-training, restore every role from bytes and the data, finish.
    run.builder = Builder.from_state(run.builder.to_state(), config, data.n_classes, len(data.y_train),
                                     [o.bins.sizes for o in run.owners])
    run.owners = [FeatureOwner.from_state(o.to_state(), x) for o, x in zip(run.owners, data.train, strict=True)]
    forest = run.train()
    np.testing.assert_array_equal(run.predict(data.test), whole.predict(data.test))
    assert [n.bin for t in forest.trees for n in t.nodes()] == [
        n.bin for t in whole.builder.forest().trees for n in t.nodes()
    ]
    restored = FeatureOwner.from_state(run.owners[1].to_state())  # inference needs no training columns
    answers, expected = restored.directions(data.test[1]), run.owners[1].directions(data.test[1])
    assert answers.keys() == expected.keys() and all(np.array_equal(answers[k], expected[k]) for k in answers)
    with pytest.raises(FailedPrecondition, match="without its training columns"):
        restored.indicator_matrix(Task(0, 0, 0, np.arange(2), np.ones(2), {1: (0,)}))


def test_builder_refuses_out_of_order_and_bad_messages():
    data = TreeData.load("wine")
    fed = LocalFederation.create(TreeConfig(max_depth=1), data)
    task = fed.builder.next_task()
    with pytest.raises(InvalidArgument, match="class totals"):
        fed.builder.open(task, np.zeros(data.n_classes))
    assert fed.builder.open(task, fed.labels.totals(task))
    with pytest.raises(InvalidArgument, match="counts must have shape"):
        fed.builder.decide(task, {})
    bad = {p: np.full((data.n_classes, fed.builder.width(task, p)), -1.0) for p in task.features}
    with pytest.raises(InvalidArgument, match="finite and non-negative"):
        fed.builder.decide(task, bad)
    other = Task(0, 1, 1, task.rows, task.weights, task.features)
    with pytest.raises(FailedPrecondition, match="not the node being grown"):
        fed.builder.open(other, fed.labels.totals(other))
    with pytest.raises(FailedPrecondition, match="not finished"):
        fed.builder.forest()
    with pytest.raises(InvalidArgument, match="no candidate split"):
        fed.owners[1].apply_split(task, 99, 0)


def test_combine_refuses_missing_answers():
    data = TreeData.load("wine")
    fed = simulate(TreeConfig(max_depth=2), data).federation
    directions = {o.party: o.directions(x) for o, x in zip(fed.owners, data.test, strict=True)}
    root = fed.builder.forest().trees[0].root
    directions[root.owner].pop((0, 0))
    with pytest.raises(InvalidArgument, match="must answer node"):
        combine(fed.builder.forest(), directions, len(data.y_test))
