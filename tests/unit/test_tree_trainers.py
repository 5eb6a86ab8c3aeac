"""The tree family's trainers keep their state through a checkpoint: a restored coordinator resumes the node in
flight with the answers it spent (no second decryption), and decides as the original would."""

import json

import numpy as np
import pytest

from vflsec.services.crypto import entropy, he
from vflsec.services.errors import FailedPrecondition, InvalidArgument
from vflsec.services.models import family as families
from vflsec.services.models.tree import (
    FeatureOwner,
    LabelHolder,
    LocalFederation,
    Task,
    TreeConfig,
    TreeData,
    full_tree,
)
from vflsec.services.models.tree.trainers import from_tensors, to_tensors

SID = "session-1"


def _root_with_counts():
    """A key holder at wine's root with passive-1's counts opened: (family, holder, owners, labels, task, keys,
    products, mask sums, bin weights)."""
    data = TreeData.load("wine")
    family = families.get("tree")
    settings = family.settings({"max_depth": 2, "party": 0})
    owners = [FeatureOwner.fit(p, x, settings.config) for p, x in enumerate(data.train)]
    labels = LabelHolder(data.y_train, data.n_classes)
    holder = family.new_key_holder(data.n_classes, ["passive-1"], settings)
    holder.begin(len(data.y_train), [o.bins.sizes for o in owners])
    task = Task.from_json(holder.next_node())
    assert holder.open_node(task.key, labels.totals(task))
    keys = he.make_keyholder("plain")
    sent = he.matrix_from_wire(keys, labels.encrypt(keys, task, sum(owners[1].bins.sizes)))
    products, mask_sums = owners[1].masked_products(keys, sent, task, entropy.os_entropy())
    blobs = [keys.serialize(ct) for ct in products]
    weights = owners[1].bin_weights(task)
    holder.submit_counts(keys, 1, task.key, blobs, mask_sums, weights, task.digest(SID, 0), session_id=SID)
    return family, holder, owners, labels, task, keys, blobs, mask_sums, weights


def test_a_restored_key_holder_resumes_the_node_in_flight() -> None:
    family, holder, owners, labels, task, keys, blobs, mask_sums, weights = _root_with_counts()

    state = holder.to_state()
    restored = family.restore_key_holder((state[0], json.loads(json.dumps(state[1]))))  # as a checkpoint stores it
    assert restored.next_node() == holder.next_node() and restored.answered == holder.answered
    with pytest.raises(FailedPrecondition, match="one decryption"):
        restored.submit_counts(keys, 1, task.key, blobs, mask_sums, weights, task.digest(SID, 0), session_id=SID)
    assert np.array_equal(restored.weights[1], weights)
    own = owners[0].plain_counts(task, labels.indicators(task))
    assert restored.decide(task.key, own) == holder.decide(task.key, own)


def test_released_tensors_round_trip() -> None:
    data = TreeData.load("wine")
    fed = LocalFederation.create(TreeConfig.forest(n_trees=3, max_depth=3), data)
    forest = full_tree(fed.train(), fed.owners)
    back = from_tensors(to_tensors(forest, 3), "forest")
    assert np.array_equal(back.predict_values(data.test), forest.predict_values(data.test))


def test_a_nodes_decision_is_made_once_and_repeated_after_a_restart() -> None:
    """Review 11 F3: a coordinator restarted while a passive owner applied its split decided the node again on the
    active party's new counts (two decisions for one charge). The decision is recorded before its owner learns it,
    and a repeated Decide gets it back, whatever counts it carries."""
    family, holder, owners, labels, task, *_ = _root_with_counts()
    own = owners[0].plain_counts(task, labels.indicators(task))
    first = holder.decide(task.key, own)
    assert first is not None
    other = np.zeros_like(own)
    other[:, 0] = labels.totals(task)  # counts that would decide otherwise (every row in one bin)
    assert holder.decide(task.key, other) == first
    state = holder.to_state()
    restored = family.restore_key_holder((state[0], json.loads(json.dumps(state[1]))))
    assert restored.decide(task.key, other) == first


def test_a_passive_party_makes_products_in_node_order_at_most_twice_a_node() -> None:
    """Review 11 F5: the active party could have a passive party make a node's products (214 MB and 3 s on digits'
    root) again and again. Nodes grow in (tree, node) order, so a passive party makes them for a node at most twice
    (once, and one retry) and never for an earlier node: its work is bounded by an honest growth's."""
    data = TreeData.load("wine")
    family = families.get("tree")
    passive = family.new_passive(data.n_classes, data.train[1].shape[1], family.settings({"max_depth": 2, "party": 1}))
    passive.begin(data.train[1], data.train[1], data.train[1].shape[0])
    features = {"1": list(range(data.train[1].shape[1]))}
    left, right = list(range(8)), list(range(8, 16))  # 2 x min_samples_leaf (4) rows each: nodes the growth searches

    def node(node_id: int, rows: list[int]) -> dict:
        return {"tree": 0, "node_id": node_id, "depth": 1, "rows": rows, "weights": [1.0] * len(rows),
                "features": features}  # fmt: skip

    def search(node_id: int, rows: list[int]):
        return passive.search(node(node_id, rows), he.WireMatrix((len(rows), data.n_classes - 1), 1, len(rows), []))[0]

    assert search(1, left).key == (0, 1) and search(1, left).key == (0, 1)  # once and a retry
    with pytest.raises(FailedPrecondition, match="at most 2 attempts"):
        search(1, left)
    assert search(2, right).key == (0, 2)
    with pytest.raises(FailedPrecondition, match="in order"):
        search(1, left)
    with pytest.raises(InvalidArgument, match="no node a session"):  # review 12 R3: keys the config cannot have
        search(5, left)  # a depth-2 tree searches nodes 0-2 only
    restored = family.restore_passive(passive.to_state())
    with pytest.raises(FailedPrecondition, match="lighter than 2 x min_samples_leaf 4"):  # rule 3 at this party
        search(2, [8, 9, 10, 11, 12, 13, 14])
    assert restored.attempts == 1 and next(iter(restored.searched)) == (0, 2)
