"""Finding 2: DecryptBlockSums was a decryption oracle; finding 8: attacker-sized TenSEAL bytes and features.

Probe: passive-1 (2 features) sent products of [[p]] with identity-matrix "features" — 25 ciphertexts were
accepted — and read every residual of the batch to 1.3e-7; the active party could do the same to [[p]]. Now a
party gets one decryption per step, of exactly ceil(ceil(width / R) / 2) x n_chunks ciphertexts (two feature
groups a product under CKKS) for the width the active party reported for it, and the sums leave flooded
(he.BLOCK_SUM_FLOODING) and rounded (he.BLOCK_SUM_GRID). What remains by design: within its width a party learns
δᵀX for an X of its choice, to the flooding's precision (docs/protocol.md, "Block sums").
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import tenseal as ts

from tests.integration.conftest import training_scores_request
from tests.security.conftest import federation
from vflsec.client.federation.launcher import FederationSpec, SpecError, write_federation
from vflsec.services import app
from vflsec.services.config import load_config
from vflsec.services.crypto import he, masking
from vflsec.services.data import datasets
from vflsec.services.transport import wire
from vflsec.services.transport.tensors import from_tensor
from vflsec.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc

TAG = bytes(range(32))  # the caller's mask_tag (entropy.tag of its masks' context)

N = 64  # batch rows; logits 0 make every p = 0.5, so the true sums of an identity probe are known
WIDTHS = {"active": 29, "passive-1": 2}  # breast_cancer: 28 active features + bias, 2 passive features


def _code(call, request) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(request)
    return info.value.code(), info.value.details()


def _products(backend: he.Backend, probs: he.EncryptedMatrix, X: np.ndarray, mask_bound: float = 0.0) -> list[bytes]:
    parts = masking.product_parts(backend)  # two feature groups a product under CKKS, as the parties send
    cts, _ = masking.masked_feature_products(
        backend, probs, X, np.random.default_rng(), mask_bound=mask_bound, parts=parts
    )
    return [backend.serialize(ct) for ct in cts]


def _sums(stub, session_id: str, step: int, blobs: list[bytes], width: int) -> np.ndarray:
    request = coordinator_pb2.BlockSumsRequest(
        mask_tag=TAG, session_id=session_id, step=step, ciphertexts=blobs, width=width
    )
    return from_tensor(stub.DecryptBlockSums(request), "sums", ndim=2)


def test_block_sums_are_no_decryption_oracle(tmp_path) -> None:
    with federation(tmp_path, dataset="breast_cancer", n_passive=1, passive_features=2) as fed:
        info = fed.operator.create_session("ckks", batch_size=N)
        assert dict(info.passive_features) == {"passive-1": 2} and info.n_active_features + 1 == WIDTHS["active"]
        sid = info.session_id
        fed.operator.align(sid)
        with fed.channel("active", "coordinator") as a_ch, fed.channel("passive-1", "coordinator") as p_ch:
            active = coordinator_pb2_grpc.CoordinatorStub(a_ch)
            passive = coordinator_pb2_grpc.CoordinatorStub(p_ch)
            public = active.GetPublicContext(common_pb2.SessionRef(session_id=sid))
            backend = he.open_public("ckks", public.data)

            def scores(step: int, index: list[int]) -> coordinator_pb2.EncryptedMatrix:
                return active.ComputeTrainingScores(training_scores_request([passive], sid, step, index, WIDTHS))

            reply = scores(1, list(range(N)))
            probs = wire.from_message(backend, reply, "probs")
            identity = np.eye(N)

            # The probe: identity "features" for every row, more ciphertexts than passive-1's width allows.
            probe = _products(backend, probs, identity)
            assert len(probe) == N // 2  # two identity columns a product
            code, details = _code(passive.DecryptBlockSums, coordinator_pb2.BlockSumsRequest(
                mask_tag=TAG, session_id=sid, step=1, ciphertexts=probe, width=N))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "reported 2" in details
            code, details = _code(passive.DecryptBlockSums, coordinator_pb2.BlockSumsRequest(
                mask_tag=TAG, session_id=sid, step=1, ciphertexts=probe, width=2))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and f"is 1 ciphertexts, got {N // 2}" in details

            # Within its width and count the content is its own choice: δᵀX for X = two identity columns...
            crafted = _products(backend, probs, identity[:, :2])
            first = _sums(passive, sid, 1, crafted, 2)
            # ...repeated byte for byte it gets the cached answer (no fresh noise to average)...
            np.testing.assert_array_equal(_sums(passive, sid, 1, crafted, 2), first)
            # ...and any other request for the step gets that same answer, nothing decrypted: one decryption per
            # party and step (products are re-randomised, so an honest redo of a step is never byte-identical).
            other = _products(backend, probs, identity[:, 2:4])
            np.testing.assert_array_equal(_sums(passive, sid, 1, other, 2), first)

            # The active party on [[p]]: a blob larger than a fresh ciphertext is refused before parsing...
            own = _products(backend, probs, identity[:, : WIDTHS["active"]])
            oversized = [*own[:-1], bytes(2 * backend.max_ciphertext_bytes)]
            code, details = _code(active.DecryptBlockSums, coordinator_pb2.BlockSumsRequest(
                mask_tag=TAG, session_id=sid, step=1, ciphertexts=oversized, width=WIDTHS["active"]))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "exceeds" in details
            # ...and the identity probe within its width reads p only through the flooding.
            second = _sums(active, sid, 1, own, WIDTHS["active"])

            errors = np.concatenate([first.ravel(), second.ravel()]) - 0.5  # every probed p is 0.5
            assert errors.size == 31
            np.testing.assert_allclose(errors / he.BLOCK_SUM_GRID, np.round(errors / he.BLOCK_SUM_GRID))
            assert 0.5 * he.BLOCK_SUM_FLOODING < errors.std() < 2.0 * he.BLOCK_SUM_FLOODING  # vs 1.3e-7 before

            # A replay of the step names the same batch and gets the same [[p]]; another batch is refused.
            assert list(scores(1, list(range(N))).ciphertexts) == list(reply.ciphertexts)
            code, _ = _code(lambda _: scores(1, list(range(1, N + 1))), None)
            assert code == grpc.StatusCode.FAILED_PRECONDITION

            # The forward decrypts nothing: a [[z]] sent the old way is refused naming the field, whatever its bytes.
            request = training_scores_request([passive], sid, 2, list(range(N)), WIDTHS)
            request.logits.ciphertexts.append(bytes(2 * backend.max_ciphertext_bytes))
            code, details = _code(active.ComputeTrainingScores, request)
            assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("logits: ")

            # Products outside the masked range (a mask or feature beyond the bounds, which would decode with a
            # larger error) are clipped to it, never refused: a product's slots are the owner's δ times the caller's
            # features, so a refusal told an owner with a crafted δ whether x was nonzero (rule 4; review 24, F3).
            # The answer is still the step's one: a repeat, or any other request of the step, gets the same sums.
            probs2 = wire.from_message(backend, scores(2, list(range(N))), "probs")
            loud = _products(backend, probs2, np.ones((N, 2)), mask_bound=2.0**30)
            clipped = _sums(passive, sid, 2, loud, 2)
            bound = he.CKKS_MASK_BOUND + he.FEATURE_BOUND + 1.0  # a slot's, as the key holder clips it
            assert np.all(np.abs(clipped) <= bound * N + 1.0)  # N slots a block (R = 1), plus the flooding
            np.testing.assert_array_equal(_sums(passive, sid, 2, loud, 2), clipped)
            honest = _products(backend, probs2, np.ones((N, 2)))
            np.testing.assert_array_equal(_sums(passive, sid, 2, honest, 2), clipped)


def test_features_beyond_the_mask_hiding_bound_are_refused(tmp_path) -> None:
    # breast_cancer's raw "area" columns reach ~4000: with scaling = "none" they would show through the masks.
    # The dealer refuses such a federation before writing it; each party refuses on its own too (an operator may
    # edit its config after the dealer).
    data = datasets.load_dataset("breast_cancer")
    with pytest.raises(SpecError, match=r"reach \|x\| = .*refuse \|x\| > 64"):
        write_federation(FederationSpec(data, n_passive=1, scaling="none"), tmp_path / "refused")
    layout = write_federation(FederationSpec(data, n_passive=1, scaling="minmax"), tmp_path)
    for party in ("active", "passive-1"):
        config = layout.configs[party]
        config.write_text(config.read_text().replace('"scaling" = "minmax"', '"scaling" = "none"'))
        with pytest.raises(ValueError, match="the masks hide"):
            app.load_party_data(load_config(config))
    with pytest.raises(ValueError, match=r"\|x\| <= 64"):
        backend = he.make_keyholder("plain")
        masking.masked_feature_products(backend, he.encrypt_matrix(backend, np.ones((4, 1))), np.full((4, 1), 65.0),
                                   np.random.default_rng())


def _scaled(backend: he.Backend, size: int, scale_bits: int, product: bool = False) -> bytes:
    """The review's probe: a fresh encryption of zero whose scale is 2^scale_bits instead of 2^40 (decoded, its
    decryption error shows magnified 2^(40 - scale_bits) times); as a ``product`` it is rescaled like a real one
    (one prime fewer), so that only its scale gives it away."""
    ct = ts.ckks_vector(backend._ctx, np.zeros(size), 2.0**scale_bits)
    return (ct * np.ones(size) if product else ct).serialize()


def test_ciphertexts_of_a_dishonest_form_are_not_decrypted(tmp_path) -> None:
    # Finding 1 (review, 16:05): a fresh encryption of zero at scale 2^8, 331,658 bytes (under the size cap),
    # released -29.19 through DecryptBlockSums: the decryption-error sum x 2^32, readable through the flooding.
    with federation(tmp_path, dataset="breast_cancer", n_passive=1, passive_features=2) as fed:
        info = fed.operator.create_session("ckks", batch_size=N)
        sid = info.session_id
        fed.operator.align(sid)
        keys = fed.parties["coordinator"].engine.sessions[sid].backend  # to show what the probe would read
        with fed.channel("active", "coordinator") as a_ch, fed.channel("passive-1", "coordinator") as p_ch:
            active = coordinator_pb2_grpc.CoordinatorStub(a_ch)
            passive = coordinator_pb2_grpc.CoordinatorStub(p_ch)
            backend = he.open_public("ckks", active.GetPublicContext(common_pb2.SessionRef(session_id=sid)).data)

            def scores(step: int) -> he.EncryptedMatrix:
                request = training_scores_request([passive], sid, step, list(range(N)), WIDTHS)
                return wire.from_message(backend, active.ComputeTrainingScores(request), "probs")

            def block_sums(step: int, blobs: list[bytes]) -> tuple[grpc.StatusCode, str]:
                return _code(passive.DecryptBlockSums, coordinator_pb2.BlockSumsRequest(
                    mask_tag=TAG, session_id=sid, step=step, ciphertexts=blobs, width=2))

            # The forward decrypts nothing: a [[z]] at scale 2^8 (the review's probe, sent the old way) is refused
            # naming the field, before anything is decrypted, and the step does not advance.
            request = training_scores_request([passive], sid, 1, list(range(N)), WIDTHS)
            request.logits.ciphertexts.append(_scaled(backend, backend.slots, 8))
            code, details = _code(active.ComputeTrainingScores, request)
            assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("logits: ")
            assert fed.parties["coordinator"].engine.sessions[sid].last_step == 0

            probs = scores(1)
            size = probs.layout.ct_size
            probe = [_scaled(backend, size, 8)]  # passive-1's 2 columns at R = 1: one product of two parts
            assert len(probe[0]) <= backend.max_ciphertext_bytes  # under the size cap, as in the review
            # Decrypted, the probe reads the decryption error x 2^32, far above the flooding's 2^-6.
            assert np.abs(keys.decrypt(keys.deserialize(probe[0]))).max() > 32 * he.BLOCK_SUM_FLOODING
            code, details = block_sums(1, probe)
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            assert "scale 2^8.00" in details and "an honest product has 2, 2 and 2^72" in details
            # The refusal spent the step's one decryption (persisted before the bytes were parsed): honest products
            # get that same refusal.
            assert block_sums(1, _products(backend, probs, np.ones((N, 2)))) == (code, details)

            # Rescaled like a real product (the right level), only the scale is off: refused.
            probs = scores(2)
            code, details = block_sums(2, [_scaled(backend, size, 8, product=True)])
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "2 primes and scale 2^8.00" in details
            # At the right scale but a fresh ciphertext's level (no product of [[p]] has it): refused.
            scores(3)
            fresh = backend.serialize(backend.encrypt(np.zeros(size)))
            code, details = block_sums(3, [fresh])
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "3 primes and scale 2^40.00" in details
            # A product of a fresh ciphertext (rescaled, 2^40: the form before session 19) is not [[p]]'s: refused.
            scores(4)
            code, details = block_sums(4, [_scaled(backend, size, 40, product=True)])
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "2 primes and scale 2^40.00" in details
            # Honest products of the next step are answered.
            probs = scores(5)
            assert _sums(passive, sid, 5, _products(backend, probs, np.ones((N, 2)), 2.0**24), 2).shape == (2, 1)

            # Inference decrypts nothing (shares are summed under zero-sum masks): an own share that is not 2 x 1
            # words is refused before any row of the query is taken ...
            active.FinishTraining(common_pb2.SessionRef(session_id=sid))
            admitted = active.AdmitQuery(coordinator_pb2.AdmitQueryRequest(session_id=sid, sample_index=[N, N + 1]))
            own = bytes(8 * 3)
            code, details = _code(active.ReleaseScores, coordinator_pb2.ReleaseScoresRequest(
                session_id=sid, query_id=admitted.query_id, share=own, sample_index=[N, N + 1]))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "share holds 24 bytes" in details
            # ...and so is a passive share of that size.
            code, details = _code(passive.SubmitShare, coordinator_pb2.ShareRequest(
                session_id=sid, query_id=admitted.query_id, sample_index=[N, N + 1], share=own))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "share holds 24 bytes" in details
