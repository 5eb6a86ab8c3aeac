"""Tree protocol with the real CKKS backend: what the key holder decrypts, its admission limits, the released views."""

import json

import numpy as np
import pytest

from vflsec.services.crypto import entropy, he, masking
from vflsec.services.errors import FailedPrecondition, InvalidArgument
from vflsec.services.models.tree import KeyHolder, LocalFederation, TreeConfig, TreeData, simulate
from vflsec.services.models.tree.steps import Task, indicator_layout, product_fold, product_parts
from vflsec.services.models.tree.structure import ACTIVE


@pytest.fixture(scope="module")
def wine():
    return TreeData.load("wine")


def test_key_holder_decrypts_only_masked_slots_and_releases_per_bin_counts(wine):
    fed = LocalFederation.create(TreeConfig(max_depth=3), wine, "ckks")
    decrypted: list[np.ndarray] = []
    opened: list[tuple[object, np.ndarray, np.ndarray]] = []
    backend, open_counts = fed.keyholder.backend, fed.keyholder.open_counts

    def recording_decrypt(ct):  # under CKKS a product carries two groups, in its slots' real and imaginary parts
        values = type(backend).decrypt_complex(backend, ct)
        decrypted.extend([values.real, values.imag])
        return values

    def recording_open(party, task, *args):
        counts = open_counts(party, task, *args)
        expected = fed.labels.indicators(task).T @ fed.owners[party].indicator_matrix(task)
        opened.append((task, counts, expected))
        return counts

    backend.decrypt_complex = recording_decrypt
    fed.keyholder.open_counts = recording_open
    fed.train()
    assert opened and decrypted
    # What leaves the decryption: exactly the per-bin class counts of the candidate features, nothing per sample.
    for _task, counts, expected in opened:
        assert counts.shape == (wine.n_classes, sum(fed.owners[1].bins.sizes))
        np.testing.assert_array_equal(counts, expected)
    # What the key holder saw slot by slot, in both parts: products masked uniformly in [-2^24, 2^24]. Unmasked would be
    # class indicators times 0/1 bin indicators, all in {0, 1}; a masked slot lands in [-1, 2] with prob ~1e-7.
    slots = np.concatenate(decrypted)
    assert np.mean((slots > -1) & (slots < 2)) < 1e-3
    assert np.std(slots) > 2**22 and np.abs(slots).max() <= he.CKKS_MASK_BOUND + he.FEATURE_BOUND + 1
    # The coordinator's skeleton has bin indices but no threshold.
    assert all(n.threshold is None for t in fed.builder.forest().trees for n in t.nodes())


def test_one_answer_per_party_and_node_and_exact_width(wine):
    fed = LocalFederation.create(TreeConfig(max_depth=1), wine, "ckks")
    task = fed.builder.next_task()
    assert fed.builder.open(task, fed.labels.totals(task))
    width = fed.builder.width(task, 1)
    sent = he.matrix_from_wire(fed.public, fed.labels.encrypt(fed.public, task, width))  # as a passive party reads it
    products, mask_sums = fed.owners[1].masked_products(fed.public, sent, task, entropy.os_entropy())
    blobs = [fed.public.serialize(ct) for ct in products]
    weights = fed.owners[1].bin_weights(task)
    assert sent.shape == (task.rows.size, wine.n_classes - 1)  # the last class's products are never made
    with pytest.raises(InvalidArgument, match="ciphertexts, got"):
        fed.keyholder.open_counts(1, task, width, sent.layout, blobs[:-1], mask_sums, weights)
    with pytest.raises(InvalidArgument, match="mask sums"):
        fed.keyholder.open_counts(1, task, width, sent.layout, blobs, mask_sums[:-1], weights)
    for bad in (weights[:-1], np.where(np.arange(width) == 0, -1.0, weights), np.full(width, np.nan)):
        with pytest.raises(InvalidArgument, match="bin weights"):  # refused before the answer is spent
            fed.keyholder.open_counts(1, task, width, sent.layout, blobs, mask_sums, bad)
    fresh = [fed.public.serialize(ct) for ct in sent.ciphertexts][:1] * len(blobs)  # not of a product's form
    with pytest.raises(InvalidArgument, match="an honest product"):
        fed.keyholder.open_counts(1, task, width, sent.layout, fresh, mask_sums, weights)
    # That refusal spent the node's one answer: the honest request is now refused too.
    with pytest.raises(FailedPrecondition, match="one decryption"):
        fed.keyholder.open_counts(1, task, width, sent.layout, blobs, mask_sums, weights)
    restored = KeyHolder(fed.keyholder.backend)  # a restarted coordinator remembers the spent answer
    restored.load_state(fed.keyholder.to_state())
    with pytest.raises(FailedPrecondition, match="one decryption"):
        restored.open_counts(1, task, width, sent.layout, blobs, mask_sums, weights)


def test_withheld_thresholds_absent_from_the_active_view(wine):
    fed = simulate(TreeConfig.forest(n_trees=5, seed=1), wine, "ckks").federation
    passive_thresholds = set(fed.owners[1].thresholds().values())
    assert passive_thresholds
    full, withheld = fed.released("full"), fed.released("withhold")
    for tf, tw in zip(full.trees, withheld.trees, strict=True):
        for nf, nw in zip(tf.nodes(), tw.nodes(), strict=True):
            assert (nf.node_id, nf.owner, nf.feature) == (nw.node_id, nw.owner, nw.feature)
            if nf.is_leaf:
                continue
            assert nf.threshold is not None  # full: luo's PRA setting, every threshold disclosed
            if nw.owner == ACTIVE:
                assert nw.threshold == nf.threshold
            else:
                assert nw.bin is None and nw.threshold is None
    released = json.dumps([[[n.threshold, n.bin] for n in t.nodes()] for t in withheld.trees])
    assert not any(repr(v) in released for v in passive_thresholds)
    # The full view predicts exactly what the federation outputs (its thresholds are the owners' own).
    np.testing.assert_array_equal(full.predict_values(wine.test), fed.predict(wine.test))
    with pytest.raises(ValueError, match="no threshold"):
        withheld.predict_values(wine.test)
    with pytest.raises(ValueError, match="release setting"):
        fed.released("thresholds-only")


def test_ckks_matches_plain_on_digits():
    digits = TreeData.load("digits")
    config = TreeConfig(max_depth=2)
    ckks, plain = simulate(config, digits, "ckks"), simulate(config, digits, "plain")
    np.testing.assert_array_equal(ckks.votes, plain.votes)
    counts = [{k: v for k, v in run.federation.messages.items() if "bytes" not in k} for run in (ckks, plain)]
    products = [c.pop("product ciphertexts") for c in counts]
    assert counts[0] == counts[1]  # same messages; only the ciphertext sizes and the product counts differ
    assert plain.federation.messages["product ciphertexts"] / 2 <= products[0] < products[1]  # CKKS: 2 groups each


def test_a_partition_lighter_than_min_samples_leaf_is_refused_whatever_the_counts_claimed() -> None:
    # Review of issue 27: the split was chosen on the caller's counts (claimed x1000); the partition itself must
    # still leave both children min_samples_leaf, else a deviating active party builds nodes of one row.
    from vflsec.services.models.tree.steps import Builder, Split

    config = TreeConfig(kind="tree", max_depth=2, min_samples_leaf=4, n_bins=4)
    builder = Builder(config, 2, 40, [[4, 4], [4]])
    task = builder.next_task()
    assert task is not None
    builder.open(task, np.array([20.0, 20.0]))
    one_row = np.zeros(40, dtype=bool)
    one_row[0] = True
    with pytest.raises(InvalidArgument, match="below min_samples_leaf 4"):
        builder.apply(task, Split(0, 0, 0, 0.0), one_row)
    four_rows = np.zeros(40, dtype=bool)
    four_rows[:4] = True
    builder.apply(task, Split(0, 0, 0, 0.0), four_rows)  # the smallest side the policy accepts


def test_products_beyond_the_masked_range_are_clipped_not_refused(wine):
    """Rule 4: the node's decision is the only answer that may depend on a decryption (and is what the key budget is
    charged), so products that decrypt beyond the masked range, and counts beyond the node's weight, are clipped."""
    fed = LocalFederation.create(TreeConfig(max_depth=1), wine, "ckks")
    task = fed.builder.next_task()
    assert fed.builder.open(task, fed.labels.totals(task))
    width = fed.builder.width(task, 1)
    sent = he.matrix_from_wire(fed.public, fed.labels.encrypt(fed.public, task, width))  # as a passive party reads it
    loud, mask_sums = masking.masked_feature_products(
        fed.public, sent, fed.owners[1].indicator_matrix(task), entropy.os_entropy(), mask_bound=2.0**30,
        fold=product_fold(task), parts=product_parts(fed.public),
    )
    blobs, weights = [fed.public.serialize(c) for c in loud], fed.owners[1].bin_weights(task)
    counts = fed.keyholder.open_counts(1, task, width, sent.layout, blobs, mask_sums, weights)
    assert counts.shape == (wine.n_classes, width)
    assert counts.min() >= 0 and counts.max() <= task.weights.sum()
    assert not np.array_equal(counts, fed.labels.indicators(task).T @ fed.owners[1].indicator_matrix(task))


def test_a_decision_is_charged_the_bits_of_its_outcomes(wine):
    fed = LocalFederation.create(TreeConfig(max_depth=1), wine, "plain")
    task = fed.builder.next_task()
    outcomes = 1 + sum(fed.builder.width(task, p) for p in task.features)  # a leaf, or a (party, feature, bin)
    assert 2 ** (fed.builder.decision_bits(task) - 1) < outcomes <= 2 ** fed.builder.decision_bits(task)


def test_folded_slots_stay_within_the_feature_bound_and_wider_features_are_refused() -> None:
    """Review 16 F4: with honest [[Y]] (class indicator x multiplicity), a folded slot sums product_fold(task)
    rows' values, at most FEATURE_BOUND (64) even when every row weighs the maximum and sits in one bin and class
    (masks off to read the slots); a feature side with fold x |x| > 64 is refused before anything is made."""
    keys, n = he.make_keyholder("plain"), 20000
    task = Task(0, 0, 0, np.arange(n), np.full(n, 8.0), {1: (0,)})
    fold = product_fold(task)
    layout = indicator_layout(task, 3, 2, keys.slots)
    assert fold == 8 and layout.n_chunks >= fold  # several chunks fold into a product
    y = np.zeros((n, 2))  # the encrypted classes: all but the last of 3
    y[:, 0] = task.weights
    enc = he.encrypt_matrix(keys, y, replicas=layout.replicas)
    x = np.zeros((n, 2))
    x[:, 0] = 1.0
    products, _ = masking.masked_feature_products(keys, enc, x, np.random.default_rng(0), mask_bound=0.0, fold=fold)
    top = max(np.abs(np.asarray(keys.decrypt(p))).max() for p in products)
    assert top == he.FEATURE_BOUND  # 8 chunks x multiplicity 8, the bound reached, never passed
    with pytest.raises(ValueError, match=r"fold · \|x\| <= 64"):
        masking.masked_feature_products(keys, enc, 9.0 * x, np.random.default_rng(0), mask_bound=0.0, fold=fold)
