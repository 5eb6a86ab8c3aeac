"""The tree family's trainers keep their state through a checkpoint: a restored coordinator resumes the node in
flight with the answers it spent (no second decryption), and decides as the original would."""

import json

import numpy as np
import pytest

from vflsec.services.crypto import entropy, he
from vflsec.services.errors import FailedPrecondition
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


def test_a_restored_key_holder_resumes_the_node_in_flight() -> None:
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
    sent = labels.encrypt(keys, task, sum(owners[1].bins.sizes))
    products, mask_sums = owners[1].masked_products(keys, sent, task, entropy.os_entropy())
    blobs = [keys.serialize(ct) for ct in products]
    weights = owners[1].bin_weights(task)
    holder.submit_counts(keys, 1, task.key, blobs, mask_sums, weights)

    state = holder.to_state()
    restored = family.restore_key_holder((state[0], json.loads(json.dumps(state[1]))))  # as a checkpoint stores it
    assert restored.next_node() == holder.next_node() and restored.answered == holder.answered
    with pytest.raises(FailedPrecondition, match="one decryption"):
        restored.submit_counts(keys, 1, task.key, blobs, mask_sums, weights)
    assert np.array_equal(restored.weights[1], weights)
    own = owners[0].plain_counts(task, labels.indicators(task))
    assert restored.decide(task.key, own) == holder.decide(task.key, own)


def test_released_tensors_round_trip() -> None:
    data = TreeData.load("wine")
    fed = LocalFederation.create(TreeConfig.forest(n_trees=3, max_depth=3), data)
    forest = full_tree(fed.train(), fed.owners)
    back = from_tensors(to_tensors(forest, 3), "forest")
    assert np.array_equal(back.predict_values(data.test), forest.predict_values(data.test))
