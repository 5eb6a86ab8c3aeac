"""Histogram subtraction (steps.Histograms, steps.KnownRows): at a right child the key holder derives a passive
party's per-bin counts as its parent's minus its left sibling's; they equal the counts its own products would have
opened, the party is asked no products for it (SubmitCounts refused), and ApplySplit there is answered only for its
parent's rows less its left sibling's."""

import json

import numpy as np
import pytest

from vflsec.services.crypto import he
from vflsec.services.errors import FailedPrecondition, InvalidArgument
from vflsec.services.models import family as families
from vflsec.services.models.tree import FeatureOwner, LabelHolder, Task, TreeConfig, TreeData
from vflsec.services.models.tree.steps import GrowthMirror, Histograms, KnownRows


def _grow(max_depth: int = 3):
    """Grow wine's tree in process (plain backend): the holder, the passive party, per derived node its task and the
    passive party's true counts and bin weights there, the nodes it made products for, and per such node (task, the
    node as its products were made, the counts and bin weights the holder holds, the true ones)."""
    data = TreeData.load("wine")
    family = families.get("tree")
    settings = family.settings({"max_depth": max_depth, "party": 0})
    active = FeatureOwner.fit(0, data.train[0], settings.config)
    labels = LabelHolder(data.y_train, data.n_classes)
    passive = family.new_passive(
        data.n_classes, data.train[1].shape[1], family.settings({"max_depth": max_depth, "party": 1})
    )
    passive.begin(data.train[1], data.train[1], len(data.y_train))
    truth = FeatureOwner(1, passive.owner.bins, data.train[1])
    holder = family.new_key_holder(data.n_classes, ["passive-1"], settings)
    holder.begin(len(data.y_train), [active.bins.sizes, passive.owner.bins.sizes])
    keys, derived, searched, made = he.make_keyholder("plain"), [], [], []
    while (node := holder.next_node()) is not None:
        task = Task.from_json(node)
        if not holder.open_node(task.key, labels.totals(task)):
            continue
        if holder.derived:
            assert holder.derived == (1,)
            with pytest.raises(FailedPrecondition, match="no products due"):
                holder.due(1, task.key)
            derived.append((task, truth.plain_counts(task, labels.indicators(task)), truth.bin_weights(task)))
            assert passive.known.complement(task, 1) and not passive.known.derived(task, 1)
            passive.known.opened(task, 1)  # the active party's word (NodeCounts without [[Y]])
            assert np.array_equal(holder.counts[1], derived[-1][1])
            assert np.array_equal(holder.weights[1], derived[-1][2])
        elif 1 in task.features:
            wire = labels.encrypt(keys, holder._over(task), holder.builder.width(task, 1))
            _, over = passive.search(node, wire)
            searched.append(over.key)
            holder.submit_counts(keys, 1, task.key, *passive.node_products(keys, over, wire, "s", 0), session_id="s")
            passive.accepted(task)
            truth_here = (truth.plain_counts(task, labels.indicators(task)), truth.bin_weights(task))
            made.append((task, over, holder.counts[1], holder.weights[1], *truth_here))
        split = holder.decide(task.key, active.plain_counts(task, labels.indicators(task)))
        if split is not None:
            node = holder.current(task.key)
            left = (
                passive.apply_split(node, split.feature, split.bin)
                if split.owner
                else active.apply_split(task, split.feature, split.bin)
            )
            holder.apply(task.key, left, split.owner)
    return holder, passive, derived, searched, made


def test_a_right_childs_counts_are_derived_exactly_and_its_products_never_asked() -> None:
    _, _, derived, searched, _ = _grow()
    assert derived, "wine's depth-3 tree has right children with a searched parent and left sibling"
    assert not {task.key for task, _, _ in derived} & set(searched)  # no products made for a derived node
    # a right child is searched (products made) only where its parent or left sibling had no counts to derive from
    had = set(searched) | {task.key for task, _, _ in derived}
    for tree, node in searched:
        assert node % 2 or node == 0 or not {(tree, node - 1), (tree, (node - 1) // 2)} <= had


def test_the_smaller_child_goes_through_products_and_both_childrens_counts_are_exact() -> None:
    """The smaller child first: at a left child whose parent's counts the holder holds, the passive party's products
    are made over whichever child has fewer rows (the right sibling's rows under the left child's key), and the
    holder's counts of both children (the left one opened, or derived as parent − right; the right one derived, as
    _grow checks) equal those the party's own products of each would have opened."""
    _, _, derived, _, made = _grow(max_depth=4)
    had = {task.key: task for task, *_ in made} | {task.key: task for task, *_ in derived}
    swapped = []
    for task, over, counts, weights, true_counts, true_weights in made:
        assert np.array_equal(counts, true_counts) and np.array_equal(weights, true_weights)
        parent = had.get((task.tree, (task.node_id - 1) // 2)) if task.node_id % 2 else None
        fewest = task.rows.size if parent is None else min(task.rows.size, parent.rows.size - task.rows.size)
        assert over.key == task.key and over.features == task.features and over.rows.size == fewest
        if over.rows.size < task.rows.size:
            assert parent is not None and np.array_equal(over.rows, np.setdiff1d(parent.rows, task.rows))
            swapped.append((task.tree, task.node_id + 1))
    assert swapped, "wine's depth-4 tree has left children heavier than their right siblings"
    assert set(swapped) & {task.key for task, *_ in derived}, "and a right child derived after one of them"


def test_apply_split_at_a_derived_node_takes_exactly_its_rows() -> None:
    _, passive, derived, _, _ = _grow()
    task = derived[-1][0]
    node = task.to_json()
    assert passive.known.derived(task, 1)
    fewer = {**node, "rows": node["rows"][1:], "weights": node["weights"][1:]}
    with pytest.raises(FailedPrecondition, match="nor of its parent and left sibling"):
        passive.apply_split(fewer, task.features[1][0], 0)
    assert passive.apply_split(node, task.features[1][0], 0).shape == task.rows.shape


def test_derivation_needs_the_same_features_at_parent_and_sibling() -> None:
    counts, weights = np.array([[3.0, 1.0], [2.0, 4.0]]), np.array([4.0, 6.0])
    parent = Task(0, 0, 0, np.arange(10), np.ones(10), {1: (0,)})
    left = Task(0, 1, 1, np.arange(4), np.ones(4), {1: (0,)})
    right = Task(0, 2, 1, np.arange(4, 10), np.ones(6), {1: (0,)})
    kept = Histograms()
    kept.keep(1, parent, counts, weights)
    assert kept.derive(1, right) is None  # no left sibling yet
    kept.keep(1, left, np.array([[1.0, 1.0], [1.0, 1.0]]), np.array([2.0, 2.0]))
    derived = kept.derive(1, right)
    assert derived is not None and np.array_equal(derived[0], [[2.0, 0.0], [1.0, 3.0]])
    assert kept.derive(1, Task(0, 2, 1, right.rows, right.weights, {1: (1,)})) is None  # other features
    assert kept.derive(1, left) is None  # a left child is never derived
    assert Histograms.from_json(json.loads(json.dumps(kept.to_json()))).derive(1, right) is not None
    known = KnownRows()
    known.searched(parent, 1)
    known.searched(left, 1)
    other = Task(0, 2, 1, np.arange(5, 10), np.ones(5), {1: (0,)})
    assert known.complement(right, 1) and not known.complement(other, 1)
    assert not known.derived(right, 1)  # a right child the growth may have left a leaf: no ApplySplit there ...
    with pytest.raises(FailedPrecondition, match="parent's less its left sibling's"):
        known.opened(other, 1)
    known.opened(right, 1)  # ... until the active party says it was opened
    assert known.derived(right, 1)
    assert KnownRows.from_json(json.loads(json.dumps(known.to_json()))).derived(right, 1)


def test_a_restored_key_holder_keeps_the_histograms_it_derives_from() -> None:
    holder, *_ = _grow(max_depth=2)
    family = families.get("tree")
    state = holder.to_state()
    restored = family.restore_key_holder((state[0], json.loads(json.dumps(state[1]))))
    assert restored.histograms.kept.keys() == holder.histograms.kept.keys()


# --- review 16: rule 3 at the partition's holder (F1), the active party's own growth (F2), the word (F3) ----------
def test_a_passive_party_refuses_a_split_that_leaves_a_side_below_min_samples_leaf() -> None:
    """F1: whatever (feature, bin) the coordinator picks, the party sends no partition with a side lighter than the
    session's min_samples_leaf (4), and keeps no split; an honest choice is answered."""
    family = families.get("tree")
    x = np.arange(40.0).reshape(-1, 1)  # 16 quantile bins of 2-3 rows each: bin 0 holds fewer than 4
    passive = family.new_passive(3, 1, family.settings({"max_depth": 2, "party": 1}))
    passive.begin(x, x, 40)
    node = Task(0, 0, 0, np.arange(40), np.ones(40), {1: (0,)}).to_json()
    passive.search(node, he.WireMatrix((40, 2), 1, 40, []))
    with pytest.raises(FailedPrecondition, match="leaves a side below min_samples_leaf 4"):
        passive.apply_split(node, 0, 0)
    assert passive.owner.splits == {}
    assert passive.apply_split(node, 0, 7).sum() >= 4


def _mirror_root(growth: GrowthMirror, n: int) -> Task:
    root = Task(0, 0, 0, np.arange(n), np.ones(n), {0: (0,), 1: (0,)})
    growth.check(root)
    growth.opened(root, np.array([n / 2, n / 2]), [])
    growth.decided(root, True)  # a passive party's split: its sides are named by the coordinator
    return root


def test_the_active_party_applies_the_stopping_rules_and_checks_who_is_derived() -> None:
    """F2: the label holder refuses, before any [[Y]] or word, a node the growth leaves a leaf, a child lighter
    than min_samples_leaf, and a party said derived that was not asked at both parent and left sibling."""
    config = TreeConfig(max_depth=3, min_samples_leaf=4)
    growth = GrowthMirror(config, 20)
    root = Task(0, 0, 0, np.arange(20), np.ones(20), {0: (0,), 1: (0,)})
    growth.check(root)
    with pytest.raises(FailedPrecondition, match="party 1's counts are derived"):
        growth.opened(root, np.array([10.0, 10.0]), [1])  # the root has no parent
    with pytest.raises(FailedPrecondition, match="the growth leaves it a leaf"):
        growth.opened(root, np.array([20.0, 0.0]), [])  # pure
    with pytest.raises(FailedPrecondition, match="lighter than min_samples_leaf 4"):
        _mirror_root(growth := GrowthMirror(config, 20), 20)
        growth.check(Task(0, 1, 1, np.arange(3), np.ones(3), {1: (0,)}))  # a 3 | 17 split
    growth = GrowthMirror(config, 20)
    _mirror_root(growth, 20)
    left = Task(0, 1, 1, np.arange(7), np.ones(7), {1: (0,)})
    growth.check(left)
    with pytest.raises(FailedPrecondition, match="the growth leaves it a leaf"):
        growth.opened(left, np.array([3.0, 4.0]), [])  # 7 < 2 x 4
    growth = GrowthMirror(config, 20)
    _mirror_root(growth, 20)
    left = Task(0, 1, 1, np.arange(10), np.ones(10), {1: (0,)})
    growth.check(left)
    growth.opened(left, np.array([5.0, 5.0]), [])
    growth.decided(left, False)
    right = Task(0, 2, 1, np.arange(10, 20), np.ones(10), {1: (0,)})
    growth.check(right)
    with pytest.raises(FailedPrecondition, match="party 1's counts are derived"):
        growth.opened(Task(0, 2, 1, right.rows, right.weights, {1: (1,)}), np.array([5.0, 5.0]), [1])
    growth.opened(right, np.array([5.0, 5.0]), [1])  # asked at its parent and left sibling for feature 0


def test_the_word_is_parsed_strictly_and_bounded_as_products_are() -> None:
    """F3: a NodeCounts with a shape but no ciphertexts is no word; a node outside the session's shape is
    INVALID_ARGUMENT, one lighter than 2 x min_samples_leaf refused; ApplySplit at a known complement the active
    party did not say was opened gets its own refusal."""
    _, passive, derived, _, _ = _grow()
    task = derived[-1][0]
    node, word = task.to_json(), he.WireMatrix((0, 0), 0, 0, [])
    with pytest.raises(InvalidArgument, match="indicators"):
        passive.opened(node, he.WireMatrix((task.rows.size, 3), 1, task.rows.size, []))
    with pytest.raises(InvalidArgument, match="no node a session"):
        passive.opened({**node, "node_id": 1000006}, word)
    with pytest.raises(FailedPrecondition, match="lighter than 2 x min_samples_leaf"):
        passive.opened({**node, "rows": node["rows"][:7], "weights": node["weights"][:7]}, word)
    passive.known.searched_here.discard(task.key)
    with pytest.raises(FailedPrecondition, match="a known complement, not opened"):
        passive.apply_split(node, task.features[1][0], 0)
    passive.opened(node, word)
    assert passive.known.derived(task, 1)


def test_products_over_the_smaller_sibling_only_where_every_side_allows_them() -> None:
    """Each side applies the rule to what it holds: the passive party accepts [[Y]] of the smaller right sibling's
    rows only where it knows the parent's rows with the key holder holding its counts there (products taken, or the
    word), the active party encrypts them only where it asked every party at the parent for the same features, and
    anything but the node's or the sibling's row count is refused."""
    parent = Task(0, 0, 0, np.arange(10), np.ones(10), {1: (0,)})
    left = Task(0, 1, 1, np.arange(7), np.ones(7), {1: (0,)})
    known = KnownRows()
    known.nodes[parent.key] = (parent.rows, parent.weights, (0,))  # its rows only (an implied complement)
    assert known.products_over(left, 1, 3) is None and known.products_over(left, 1, 7) is left
    known.searched(parent, 1)  # the key holder took this party's products of the parent
    over = known.products_over(left, 1, 3)
    assert over is not None and over.key == left.key and np.array_equal(over.rows, np.arange(7, 10))
    assert known.products_over(left, 1, 7) is left and known.products_over(left, 1, 5) is None
    assert known.accepted_rows(left, 1) == [3, 7]  # what a refusal names (review 23, F3)
    assert known.products_over(Task(0, 1, 1, left.rows, left.weights, {1: (1,)}), 1, 3) is None  # other features
    assert KnownRows.from_json(json.loads(json.dumps(known.to_json()))).products_over(left, 1, 3) is not None
    smaller_left = Task(0, 1, 1, np.arange(3), np.ones(3), {1: (0,)})
    assert known.products_over(smaller_left, 1, 3) is smaller_left  # the left child is the smaller one

    config = TreeConfig(max_depth=3, min_samples_leaf=1)
    growth = GrowthMirror(config, 10)
    _mirror_root(growth, 10)
    growth.check(left)
    assert np.array_equal(growth.products_over(left, [1]).rows, np.arange(7, 10))
    assert growth.products_over(Task(0, 1, 1, left.rows, left.weights, {1: (1,)}), [1]).rows.size == 7

    kept = Histograms()
    kept.keep(1, parent, np.array([[3.0, 1.0], [2.0, 4.0]]), np.array([5.0, 5.0]))
    assert kept.holds(1, parent.key, (0,)) and not kept.holds(1, parent.key, (1,))
    assert not kept.holds(2, parent.key, (0,))
    counts, weights = kept.less(1, left, np.array([[1.0, 0.0], [1.0, 1.0]]), np.array([2.0, 1.0]))
    assert np.array_equal(counts, [[2.0, 1.0], [1.0, 3.0]]) and np.array_equal(weights, [3.0, 4.0])

    family = families.get("tree")
    passive = family.new_passive(2, 1, family.settings({"max_depth": 3, "party": 1, "min_samples_leaf": 1}))
    x = np.arange(10.0).reshape(-1, 1)
    passive.begin(x, x, 10)
    node = Task(0, 1, 1, np.arange(7), np.ones(7), {1: (0,)}).to_json()
    with pytest.raises(InvalidArgument, match=r"indicators must be \(7, 1\)"):
        passive.search(node, he.WireMatrix((3, 1), 1, 3, []))  # no parent here: only the node's own rows
