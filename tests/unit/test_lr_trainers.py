"""LR's trainers outside the services: the shared masked-gradient round trip and checkpoint round trips."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vflsec.services.crypto import entropy, he, masking
from vflsec.services.models.lr.maths import OptimizerConfig
from vflsec.services.models.lr.trainers import LrActive, LrKeyHolder, LrPassive, masked_gradient


@pytest.mark.parametrize("replicas", [2, 3])  # 3 and 2 feature groups: an odd count leaves an empty imaginary part
@pytest.mark.parametrize("backend", ["plain", "ckks"])
def test_the_masked_round_trip_gives_delta_t_x_over_n(backend: str, replicas: int) -> None:
    rng = np.random.default_rng(0)
    keys = he.make_keyholder(backend)
    n, k, d = 40, 3, 5
    delta_plain, x = rng.uniform(-1, 1, (n, k)), rng.uniform(0, 1, (n, d))
    delta = he.encrypt_matrix(keys, delta_plain, replicas=replicas)
    parts = masking.product_parts(keys)
    assert parts == (2 if backend == "ckks" else 1)
    seen: list[np.ndarray] = []

    def block_sums(blobs: list[bytes], width: int, tag: bytes) -> np.ndarray:  # the key holder's side
        # Two feature groups a product under CKKS: ceil(groups / 2) products a chunk.
        assert len(blobs) == math.ceil(math.ceil(d / replicas) / parts) * delta.layout.n_chunks
        sums = LrKeyHolder.block_sums(keys, he.deserialize_all(keys, blobs, delta.layout.ct_size), delta.layout, width)
        seen.append(sums)
        return sums

    grad = masked_gradient(keys, delta, x, entropy.new_key(), "s", 1, b"digest", block_sums)
    np.testing.assert_allclose(grad, delta_plain.T @ x / n, atol=1e-4)
    # Under CKKS what the key holder decrypted is masked, nowhere near the true sums; plain masks nothing.
    assert (np.abs(seen[0] - (delta_plain.T @ x).T).min() > 1.0) == (backend == "ckks")


def test_a_passive_block_replays_its_last_forward_after_a_restart() -> None:
    p = LrPassive.create(3, 4, OptimizerConfig("sgd", 0.5, 0.0))
    x = np.ones((2, 4))
    assert not p.can_replay
    p.previous_weights, p.weights = p.weights, p.weights + 1.0  # as backward leaves it
    restored = LrPassive.from_state(p.to_state())
    np.testing.assert_array_equal(restored.forward(x, replay=True), np.zeros((2, 3)))
    np.testing.assert_array_equal(restored.forward(x, replay=False), np.full((2, 3), 4.0))


def test_an_active_checkpoint_from_before_the_family_layer_restores() -> None:
    a = LrActive.create(2, 3, OptimizerConfig("adam", 0.1, 0.01))
    a.weights, a.bias = np.arange(3.0)[None, :], np.array([0.5])
    arrays, meta = a.to_state()
    old_meta = {k: v for k, v in meta.items() if k != "optimizer"} | {"training": ["adam", 0.1, 0.01, 64, 0]}
    restored = LrActive.from_state((arrays, old_meta))
    assert restored.config == a.config and restored.k == 1
    np.testing.assert_array_equal(restored.inference_share(np.ones((1, 3))), [[3.5]])
