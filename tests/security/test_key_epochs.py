"""Issue 9, kept open for it: the training key answered linear functionals of itself without limit.

Probe (review): a structured ciphertext of honest form, e.g. (0, t·x^j), sent to DecryptBlockSums decrypts to
w·k linear functionals of the training secret key per party and step; N = 8192 ternary unknowns fall after
about N / (w·k) steps (15 for digits' active block). Now the coordinator rotates the training keys every
T = max(1, N // (4 · Σ_q w_q·k)) steps (he.key_rotation_steps): step s runs under epoch s // T, so every
party of the session together is answered at most N/4 functionals of one key, and an old epoch's key is
dropped. The probe below plays both parties at once and asks, at every step, for every block sum it may get,
counting them per key; its ciphertexts are masked products of crafted "features" (honest form, as a
structured probe must be; TenSEAL's Python API cannot build (0, t·x^j) itself, and the count does not depend
on the content).
"""

from __future__ import annotations

import hashlib
from collections import Counter

import grpc
import numpy as np
import pytest

from tests.integration.conftest import training_scores_request
from tests.security.conftest import federation
from vflsec.services.crypto import he, masking
from vflsec.services.transport import wire
from vflsec.services.transport.tensors import from_tensor
from vflsec.v1 import coordinator_pb2, coordinator_pb2_grpc

TAG = bytes(range(32))  # the caller's mask_tag (entropy.tag of its masks' context)

STEPS = 10


def test_training_keys_rotate_and_no_key_answers_more_than_a_quarter_of_n(tmp_path) -> None:
    with federation(tmp_path, dataset="digits", n_passive=1) as fed:
        info = fed.operator.create_session("ckks")
        sid, k = info.session_id, 10
        fed.operator.align(sid)  # the coordinator trains on aligned rows only
        widths = {"active": info.n_active_features + 1, **dict(info.passive_features)}
        rotation = he.key_rotation_steps(sum(widths.values()) * k)
        assert widths == {"active": 33, "passive-1": 32} and rotation == 3  # 8192 // (4 · 650)
        n = 2 * max(widths.values())
        engine = fed.parties["coordinator"].engine.sessions[sid]
        with fed.channel("active", "coordinator") as a_ch, fed.channel("passive-1", "coordinator") as p_ch:
            stubs = {
                "active": coordinator_pb2_grpc.CoordinatorStub(a_ch),
                "passive-1": coordinator_pb2_grpc.CoordinatorStub(p_ch),
            }
            answered: Counter[str] = Counter()  # key (digest of its public context) -> functionals answered
            epochs: list[int] = []
            for step in range(1, STEPS + 1):
                context = stubs["passive-1"].GetTrainingContext(
                    coordinator_pb2.TrainingContextRequest(session_id=sid, step=step)
                )
                assert (context.epoch, context.rotation) == (step // rotation, rotation)
                key = hashlib.sha256(context.data).hexdigest()
                epochs.append(context.epoch)
                backend = he.open_public("ckks", context.data)
                parts = masking.product_parts(backend)
                replicas = he.choose_replicas(n, k, max(widths.values()), backend.slots, parts=parts)
                request = training_scores_request(
                    [stubs["passive-1"]], sid, step, list(range(n)), widths, k=k, replicas=replicas
                )
                reply = stubs["active"].ComputeTrainingScores(request)
                probs = wire.from_message(backend, reply, "probs")
                for party, width in widths.items():
                    crafted = np.eye(n)[:, :width]  # one functional per answered sum, whatever the content
                    cts, _ = masking.masked_feature_products(
                        backend, probs, crafted, np.random.default_rng(), parts=parts
                    )
                    sums = from_tensor(stubs[party].DecryptBlockSums(coordinator_pb2.BlockSumsRequest(
                        mask_tag=TAG, session_id=sid, step=step, ciphertexts=[backend.serialize(c) for c in cts],
                        width=width)),
                        "sums", ndim=2)
                    answered[key] += sums.size
                # Only the keys a step can still need are kept: this step's epoch (and, once asked, the next).
                assert set(engine.epochs) == {step // rotation}

        assert epochs == [step // rotation for step in range(1, STEPS + 1)]
        assert len(answered) == STEPS // rotation + 1  # a new key every `rotation` steps
        assert max(answered.values()) <= he.CKKS_POLY_MODULUS_DEGREE // he.KEY_ROTATION_MARGIN
        # Without rotation the same probe would have read this many functionals of one key:
        assert sum(answered.values()) > he.CKKS_POLY_MODULUS_DEGREE // he.KEY_ROTATION_MARGIN * 3
        # Keys of past epochs are gone from the coordinator's state too.
        state = fed.layout.workdir / "coordinator" / "state" / "epochs"
        assert [f.name for f in state.iterdir()] == [f"{sid}.e{STEPS // rotation}.bin"]


def test_a_ciphertext_under_an_old_epoch_key_decrypts_to_nothing(tmp_path) -> None:
    with federation(tmp_path, dataset="breast_cancer", n_passive=1, passive_features=2) as fed:
        sid = fed.operator.create_session("ckks").session_id
        fed.operator.align(sid)  # the coordinator trains on aligned rows only
        widths = {"active": 29, "passive-1": 2}
        rotation = he.key_rotation_steps(31)
        n = 64
        with fed.channel("active", "coordinator") as a_ch, fed.channel("passive-1", "coordinator") as p_ch:
            active = coordinator_pb2_grpc.CoordinatorStub(a_ch)
            passive = coordinator_pb2_grpc.CoordinatorStub(p_ch)

            def keys(step: int) -> he.Backend:
                request = coordinator_pb2.TrainingContextRequest(session_id=sid, step=step)
                return he.open_public("ckks", active.GetTrainingContext(request).data)

            def scores(step: int) -> he.EncryptedMatrix:
                backend = keys(step)
                request = training_scores_request([passive], sid, step, list(range(n)), widths)
                return wire.from_message(backend, active.ComputeTrainingScores(request), "probs")

            old = keys(1)
            for step in range(1, rotation + 1):
                probs = scores(step)
            assert step // rotation == 1  # the last step opened epoch 1; epoch 0's key is dropped
            # Steps of a dropped epoch get no keys.
            with pytest.raises(grpc.RpcError) as info:
                active.GetTrainingContext(coordinator_pb2.TrainingContextRequest(session_id=sid, step=1))
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION

            # A product of honest form whose δ was encrypted under epoch 0's key (p = 0.5, features 1: each
            # true sum would be 32) decrypts under epoch 1's key to noise far outside the masked range.
            stale = he.encrypt_matrix(old, np.full((n, 1), 0.5), replicas=probs.replicas, form=he.LOWERED)
            assert stale.layout == probs.layout
            cts, _ = masking.masked_feature_products(
                old, stale, np.ones((n, 2)), np.random.default_rng(), parts=masking.product_parts(old)
            )
            request = coordinator_pb2.BlockSumsRequest(
                mask_tag=TAG, session_id=sid, step=rotation, ciphertexts=[old.serialize(c) for c in cts], width=2
            )
            # Answered, its slots clipped to the masked range (review 24, F3): sums of ±(2^24 + 65) a slot, 0 or at
            # least 2^25 away from it, never the plaintext's 32 (the flooding moves a sum by 2^-6).
            sums = from_tensor(passive.DecryptBlockSums(request), "sums", ndim=2)
            assert np.abs(sums - 32.0).min() > 16.0
