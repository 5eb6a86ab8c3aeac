"""LR's trainers outside the services: the shared masked-gradient round trip and checkpoint round trips."""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from vflsec.services.crypto import entropy, he, masking
from vflsec.services.errors import FailedPrecondition
from vflsec.services.models.family import ActiveContext, Received
from vflsec.services.models.lr.maths import OptimizerConfig
from vflsec.services.models.lr.trainers import LrActive, LrKeyHolder, LrPassive, masked_gradient


@pytest.mark.parametrize("replicas", [2, 3])  # 3 and 2 feature groups: an odd count leaves an empty imaginary part
@pytest.mark.parametrize("backend", ["plain", "ckks"])
def test_the_masked_round_trip_gives_delta_t_x_over_n(backend: str, replicas: int) -> None:
    rng = np.random.default_rng(0)
    keys = he.make_keyholder(backend)
    n, k, d = 40, 3, 5
    delta_plain, x = rng.uniform(-1, 1, (n, k)), rng.uniform(0, 1, (n, d))
    delta = he.encrypt_matrix(keys, delta_plain, replicas=replicas, form=he.LOWERED)
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


class _Owner:
    """An LR owner (active party) over fake peers: a key holder that returns [[p]] = 0.5 (crafted: one prime lower,
    a product's form; failing: its block sums refused) and a passive party that records its Backward (after
    ``delay`` seconds)."""

    def __init__(self) -> None:
        self.keyholder = he.make_keyholder("ckks")
        self.party = he.open_public("ckks", self.keyholder.public_context())
        rng = np.random.default_rng(9)
        self.X, self.y = rng.uniform(-1, 1, (64, 3)), rng.integers(0, 2, 64)
        self.sent: list[str] = []
        self.active = LrActive.create(2, 3, OptimizerConfig("sgd", 0.1, 0.0))

    def context(self, pool: ThreadPoolExecutor, *, crafted: bool = False, failing: bool = False, delay: float = 0.0):
        owner, party = self, self.party

        class KeyHolder:
            def training_scores(
                self,
                backend: he.Backend,
                session_id: str,
                step: int,
                share: np.ndarray,
                replicas: int,
                index: np.ndarray,
                widths: dict[str, int],
            ) -> Received:
                p = he.encrypt_matrix(party, np.full((len(index), 1), 0.5), replicas=replicas, form=he.LOWERED)
                self.layout = p.layout
                if crafted:  # rescaled by TenSEAL: one prime fewer than [[p]]
                    cts = [party.mul_plain(ct, np.ones(party.size(ct))) for ct in p.ciphertexts]
                    p = he.EncryptedMatrix(p.layout, cts)
                blobs = [party.serialize(ct) for ct in p.ciphertexts]
                return Received(p, blobs, bytes(32))

            def block_sums(self, session_id: str, step: int, blobs: list[bytes], width: int, tag: bytes) -> np.ndarray:
                if failing:
                    raise FailedPrecondition("block sums refused")
                owner.sent.append("block sums")
                cts = he.deserialize_all(owner.keyholder, blobs, self.layout.ct_size)
                return LrKeyHolder.block_sums(owner.keyholder, cts, self.layout, width)

        class Passive:
            def share_training_logits(self, session_id: str, step: int, index: np.ndarray) -> None:
                pass

            def backward(self, session_id: str, step: int, index: np.ndarray, delta: he.WireMatrix) -> None:
                time.sleep(delay)
                owner.sent.append("backward")

        return ActiveContext(
            session_id="s",
            step=1,
            epoch=0,
            backend=party,
            n_classes=2,
            mask_key=b"k" * 32,
            key_holder=KeyHolder(),
            passives={"passive-1": Passive()},
            emit=lambda kind, source, **fields: None,
            features=lambda index: self.X[index],
            labels=lambda index: self.y[index],
            widths={"active": 4, "passive-1": 2},
            spawn=pool.submit,
            training_keys=lambda: party,
            share_mask_keys={"passive-1": b"m" * 32},
        )

    def held(self) -> list[object]:
        """The re-randomising zeros the owner holds made ahead (he.Backend.make_ahead), referenced here so that no
        later object can take one's id."""
        level = tuple(self.party._level_data(he.LOWERED).parms_id())
        return list(self.party._ahead._held.get(("public", level), []))


def test_the_owner_refuses_training_scores_of_another_form_before_using_them() -> None:
    """[[p]] one prime lower (a product's form) is refused by the owner, naming the coordinator's training scores,
    before δ is formed or anything goes to a passive party (review 24, F5); an honest [[p]] goes through."""
    owner = _Owner()
    with ThreadPoolExecutor(2) as pool:
        with pytest.raises(FailedPrecondition, match="coordinator's training scores of step 1: ciphertext 0 has 2 p"):
            owner.active.train_step(owner.context(pool, crafted=True), np.arange(64))
        assert owner.sent == [] and not owner.active.weights.any()
        owner.active.train_step(owner.context(pool), np.arange(64))
    assert sorted(owner.sent) == ["backward", "block sums"] and owner.active.weights.any()


def test_the_owner_makes_its_next_zeros_ahead_and_its_products_take_them() -> None:
    """After a step the owner holds its next step's re-randomising zeros (one product here); its next step's product
    takes them (they are no longer held) and it makes others."""
    owner = _Owner()
    with ThreadPoolExecutor(2) as pool:
        owner.active.train_step(owner.context(pool), np.arange(64))
        first = owner.held()
        assert len(first) == 1
        owner.active.train_step(owner.context(pool), np.arange(64))
        second = owner.held()
    assert len(second) == 1 and not {id(z) for z in first} & {id(z) for z in second}


def test_a_failed_own_gradient_is_reported_only_once_no_backward_is_in_flight() -> None:
    """The owner sends Backward before its own products; if those fail, the step's failure is raised only after the
    passive parties' calls have ended (review of session 23, F3-1), and the owner's weights are not changed."""
    owner = _Owner()
    with ThreadPoolExecutor(2) as pool:
        with pytest.raises(FailedPrecondition, match="block sums refused"):
            owner.active.train_step(owner.context(pool, failing=True, delay=0.5), np.arange(64))
        assert owner.sent == ["backward"] and not owner.active.weights.any()
