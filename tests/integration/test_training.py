"""PSI, HE training and inference through the real services (loopback gRPC, mTLS, TenSEAL CKKS)."""

from __future__ import annotations

import numpy as np

from tests.integration.conftest import federation
from vflsec.services.data import datasets


def _party_ids(fed, party: str) -> set[str]:
    return set(datasets.read_party_csv(fed.layout.configs[party].parent / "data.csv").ids)


def test_psi_aligns_exactly_the_common_ids(binary_federation) -> None:
    fed = binary_federation
    info = fed.operator.create_session("plain")
    common = fed.operator.align(info.session_id)
    expected = _party_ids(fed, "active") & _party_ids(fed, "passive-1")
    assert len(common) == len(set(common))
    assert set(common) == expected
    # The parties really hold different ID sets: PSI had something to remove on both sides.
    assert expected < _party_ids(fed, "active") and expected < _party_ids(fed, "passive-1")


def _train(fed, backend: str, ds, split=None, epochs: int = 30):
    info = fed.operator.create_session(backend, learning_rate=0.1, batch_size=64, seed=3)
    common = sorted(fed.operator.align(info.session_id))  # one split in every run (PSI's order is random)
    if split is None:
        labels = ds.y[datasets.select_ids(ds.ids, common)]
        train_ids, test_ids = datasets.train_test_split_ids(np.asarray(common), labels, 0.25, seed=0)
        split = list(train_ids), list(test_ids), ds.y[datasets.select_ids(ds.ids, test_ids)]
    train_ids, test_ids, test_labels = split
    progress = list(fed.operator.train(info.session_id, train_ids, epochs))
    assert progress[-1].done and progress[-2].epoch == epochs
    released = fed.operator.predict(info.session_id, test_ids)
    assert released.sample_ids == test_ids
    accuracy = float(np.mean(released.scores.argmax(axis=1) == test_labels))
    return info, split, accuracy, released, fed.operator.fetch_model(info.session_id)


def test_binary_ckks_matches_plain(binary_federation) -> None:
    fed = binary_federation
    ds = datasets.load_dataset("breast_cancer")
    _, split, plain_acc, plain_scores, plain_model = _train(fed, "plain", ds)
    _, _, ckks_acc, ckks_scores, ckks_model = _train(fed, "ckks", ds, split)
    assert plain_acc >= 0.9
    # Fresh flooding noise per run can tip a borderline test row (one row is 1/129 = 0.78 pp here; measured
    # 0.9612 vs 0.9690 once, equal in other runs): parity is at most two rows apart.
    assert abs(ckks_acc - plain_acc) <= 2 / len(plain_scores.scores) + 1e-12
    # Same batches, same optimiser. CKKS block sums leave the coordinator flooded (he.BLOCK_SUM_FLOODING = 2^-6
    # per sum, 2^-6 / 64 per gradient entry), and Adam turns that noise on near-zero gradient components into
    # steps of up to the learning rate: the largest weight moved by up to 7 % of the largest plain weight in
    # repeated runs (3 % failed 2 runs in 7); the scores' bound is loosened with it, accuracy is checked above.
    for ckks_w, plain_w in (
        (ckks_model.active_weights, plain_model.active_weights),
        (ckks_model.passive["passive-1"], plain_model.passive["passive-1"]),
    ):
        assert np.abs(ckks_w - plain_w).max() <= 0.2 * np.abs(plain_w).max()
    np.testing.assert_allclose(ckks_scores.scores, plain_scores.scores, atol=5e-2)
    # Binary models release [1 - p, p].
    np.testing.assert_allclose(ckks_scores.scores.sum(axis=1), 1.0, atol=1e-9)
    assert ckks_model.active_weights.shape == (1, len(fed.layout.split.active))


def test_softmax_with_three_passive_parties(tmp_path) -> None:
    ds = datasets.load_dataset("wine")
    with federation(tmp_path, dataset="wine", n_passive=3) as fed:
        _, _, accuracy, released, model = _train(fed, "ckks", ds, epochs=20)
        assert released.scores.shape[1] == 3
        np.testing.assert_allclose(released.scores.sum(axis=1), 1.0, atol=1e-6)
        assert accuracy >= 0.9
        assert set(model.passive) == {"passive-1", "passive-2", "passive-3"}
        assert all(
            w.shape == (3, len(cols)) for w, cols in zip(model.passive.values(), fed.layout.split.passive, strict=True)
        )
