"""LR's training forward as masked shares in Z_2^64 (docs/protocol.md, Training, steps 1-3), against a live federation.

Each passive party sends z_p + r_p straight to the coordinator (ShareTrainingLogits -> SubmitTrainingShare), r_p under
its own share-mask key and bound to (session, step, rows); the owner sends z_a − Σ r_p with ComputeTrainingScores; the
coordinator adds the shares, decrypting nothing, and returns [[p]]. The tests play the owner (and, where a deviating
passive party is the point, a passive party) over real gRPC, mTLS and CKKS.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from tests.security.conftest import federation
from vflsec.services.crypto import he, ring_mask
from vflsec.services.transport import tls, wire
from vflsec.services.transport.server import peer_channel
from vflsec.v1 import coordinator_pb2, coordinator_pb2_grpc, passive_pb2, passive_pb2_grpc

N = 64  # batch rows: 2 x the widest block
WIDTHS = {"active": 29, "passive-1": 2}  # breast_cancer: 28 active features + bias, 2 passive features


def _code(call, request) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(request)
    return info.value.code(), info.value.details()


def _request(sid: str, step: int, rows: list[int], share: bytes) -> coordinator_pb2.TrainingScoresRequest:
    return coordinator_pb2.TrainingScoresRequest(
        session_id=sid, step=step, share=share, replicas=1, sample_index=rows, widths=WIDTHS
    )


def test_a_replayed_step_sends_the_same_share_and_gets_the_same_scores(tmp_path) -> None:
    """The passive party's redo of a step (after a crash elsewhere) rebuilds the same z_p, from the block before the
    step, under the same pad; the coordinator answers it with the same [[p]] bytes and keeps no share once a step is
    computed (memory: the current step's shares only)."""
    with federation(tmp_path, dataset="breast_cancer", n_passive=1, passive_features=2) as fed:
        sid = fed.operator.create_session("ckks", batch_size=N).session_id
        fed.operator.align(sid)
        coordinator = fed.parties["coordinator"].engine
        received: dict[int, list[bytes]] = {}
        key_holder_call = coordinator.family_call

        def watched(session_id, caller, name, **payload):  # type: ignore[no-untyped-def]
            if name == "submit_training_share":
                received.setdefault(payload["step"], []).append(payload["share"])
            return key_holder_call(session_id, caller, name, **payload)

        coordinator.family_call = watched
        key = fed.parties["active"].engine.session(sid).share_mask_keys["passive-1"]
        rows = list(range(N))
        with fed.channel("active", "passive-1") as p_ch, fed.channel("active", "coordinator") as c_ch:
            passive = passive_pb2_grpc.PassiveStub(p_ch)
            owner = coordinator_pb2_grpc.CoordinatorStub(c_ch)

            def step(s: int) -> coordinator_pb2.EncryptedMatrix:
                passive.ShareTrainingLogits(passive_pb2.ForwardRequest(session_id=sid, step=s, sample_index=rows))
                mask = ring_mask.logit_mask(key, sid, s, np.array(rows), 1)
                own = ring_mask.owner_share(np.zeros((N, 1)), [mask])  # z_a = 0: the owner's zero block
                return owner.ComputeTrainingScores(_request(sid, s, rows, ring_mask.to_bytes(own)))

            first = step(1)
            assert coordinator.sessions[sid].trainer.pending == {}  # the step's shares are gone once used
            # The passive party applies step 1 ([[p]] as its [[δ]]: any honest ciphertext): its block moves.
            before = fed.parties["passive-1"].engine.weights(sid).copy()
            passive.Backward(passive_pb2.BackwardRequest(session_id=sid, step=1, sample_index=rows, delta=first))
            assert np.abs(fed.parties["passive-1"].engine.weights(sid) - before).max() > 1e-6

            # The owner replays step 1: the passive party sends the very same bytes (block before the step, same pad)
            # and the coordinator answers with the same [[p]] bytes.
            replayed = step(1)
            assert len(received[1]) == 2 and received[1][0] == received[1][1]
            assert list(replayed.ciphertexts) == list(first.ciphertexts)
            # Step 2 runs on the new block under another pad: unmasked with the owner's key it is X_p W_1ᵀ.
            step(2)
            s_p = fed.parties["passive-1"].engine.session(sid)
            z_p = fed.parties["passive-1"].engine.data.X[s_p.rows[rows]] @ s_p.trainer.weights.T
            words = ring_mask.from_bytes(received[2][0], (N, 1), "share") - ring_mask.logit_mask(
                key, sid, 2, np.array(rows), 1
            )
            np.testing.assert_allclose(ring_mask.decode(words), z_p, atol=1e-6)
            assert np.abs(z_p).max() > 1e-4
            assert np.median(np.abs(ring_mask.decode(ring_mask.from_bytes(received[2][0], (N, 1), "s")) - z_p)) > 2**30


def test_shares_of_another_step_or_rows_are_refused_and_an_out_of_range_sum_is_clipped(tmp_path) -> None:
    """What the coordinator refuses depends only on the request's fields and on which parties shared (rule 4): a share
    for a step that is neither the next nor the last names the step; shares of other rows leave the owner's step
    refused naming the party, nothing computed; a sum beyond ±2^23 is clipped and scored, never refused; a party
    outside the session, or the owner, cannot submit a passive share."""
    with federation(tmp_path, dataset="breast_cancer", n_passive=1, passive_features=2) as fed:
        sid = fed.operator.create_session("ckks", batch_size=N).session_id
        fed.operator.align(sid)
        coordinator = fed.parties["coordinator"].engine
        keys = coordinator.sessions[sid].backend
        rows, zeros = list(range(N)), bytes(8 * N)
        with fed.channel("passive-1", "coordinator") as s_ch, fed.channel("active", "coordinator") as c_ch:
            sharer = coordinator_pb2_grpc.CoordinatorStub(s_ch)
            owner = coordinator_pb2_grpc.CoordinatorStub(c_ch)

            def share(step: int, index: list[int], words: bytes = zeros) -> None:
                sharer.SubmitTrainingShare(
                    coordinator_pb2.TrainingShare(session_id=sid, step=step, sample_index=index, share=words)
                )

            code, details = _code(lambda _: share(3, rows), None)
            assert code == grpc.StatusCode.FAILED_PRECONDITION
            assert "step 3 is neither the session's next training step 1 nor its last 0" in details

            share(1, list(range(1, N + 1)))  # other rows than the owner's step
            code, details = _code(owner.ComputeTrainingScores, _request(sid, 1, rows, zeros))
            assert code == grpc.StatusCode.FAILED_PRECONDITION
            assert "passive-1 sent no training share for these sample_index rows of step 1" in details
            assert coordinator.sessions[sid].last_step == 0  # nothing computed

            # The owner's share shifts every logit by ±2^30: the sum is clipped to ±2^23 and scored (p = 1, 0).
            for step, shift, p in ((1, 2.0**30, 1.0), (2, -(2.0**30), 0.0)):
                share(step, rows)
                crafted = ring_mask.to_bytes(ring_mask.encode(np.full((N, 1), shift)))
                probs = wire.from_message(keys, owner.ComputeTrainingScores(_request(sid, step, rows, crafted)), "p")
                np.testing.assert_allclose(he.decrypt_matrix(keys, probs), p, atol=1e-3)
            # Any words are a share: all bits set (−2^-24 each) is scored too.
            share(3, rows, b"\xff" * (8 * N))
            assert owner.ComputeTrainingScores(_request(sid, 3, rows, b"\xff" * (8 * N))).rows == N

            # The owner may not send a passive party's share (its certificate's role), nor may a passive identity that
            # is not a party of the session.
            code, details = _code(owner.SubmitTrainingShare, coordinator_pb2.TrainingShare(
                session_id=sid, step=4, sample_index=rows, share=zeros))
            assert code == grpc.StatusCode.PERMISSION_DENIED
            stranger = tls.make_pki(fed.layout.workdir / "certs", ["passive-9"]).files("passive-9")
            with peer_channel(fed.layout.addresses["coordinator"], "coordinator", stranger, 64 << 20) as channel:
                code, details = _code(coordinator_pb2_grpc.CoordinatorStub(channel).SubmitTrainingShare,
                                      coordinator_pb2.TrainingShare(session_id=sid, step=4, sample_index=rows,
                                                                    share=zeros))
            assert code == grpc.StatusCode.PERMISSION_DENIED and "passive-9 is not a party of session" in details
            assert coordinator.sessions[sid].trainer.pending == {}  # nothing of theirs was kept


def test_a_step_whose_shares_a_coordinator_restart_lost_is_sent_again_and_trains_as_usual(tmp_path) -> None:
    """The coordinator keeps the passive shares of a step in memory only. Lost between them and the owner's call (as a
    restart loses them), the owner's ComputeTrainingScores is refused naming the party; the active party then asks for
    the shares once more (the same bytes) and the step goes on, the session ending where an undisturbed one does."""
    with federation(tmp_path, dataset="breast_cancer", n_passive=1, passive_features=2, allow_plain=True) as fed:
        coordinator = fed.parties["coordinator"].engine
        scores, refusals, models = coordinator.training_scores, [], []
        for lose in (False, True):
            info = fed.operator.create_session("plain", batch_size=N, seed=3)
            common = sorted(fed.operator.align(info.session_id))
            lost: list[int] = []

            def forgetful(session_id, step, *args, _lose=lose, _lost=lost):  # type: ignore[no-untyped-def]
                if _lose and step not in _lost:  # every step loses its shares once
                    _lost.append(step)
                    coordinator.sessions[session_id].trainer.pending.clear()
                try:
                    return scores(session_id, step, *args)
                except Exception as exc:
                    refusals.append(str(exc))
                    raise

            coordinator.training_scores = forgetful
            list(fed.operator.train(info.session_id, common[:200], 1))
            models.append(fed.operator.fetch_model(info.session_id))
        assert len(lost) == 3 and len(refusals) == 3
        assert all("passive-1 sent no training share for these sample_index rows" in r for r in refusals)
    np.testing.assert_allclose(models[1].active_weights, models[0].active_weights, atol=1e-9)
    np.testing.assert_allclose(models[1].passive["passive-1"], models[0].passive["passive-1"], atol=1e-9)


def test_residual_the_owner_reads_passive_logits_of_its_crafted_rows(tmp_path) -> None:
    """Documented residual (review 23, F1; docs/protocol.md, the active party's training row): the owner chooses its
    own share and its own columns, so with z_a = 0 (share = −r_p), [[p]] as its [[δ]] and 64·e_j in its column j, its
    own flooded block sums give p_j, hence z_p of d_a + 1 rows a step. It was so before session 17 too: the channel is
    δ = p − y, not [[z_p]]. Closing it needs attested owner contributions (as the block-sums residual does)."""
    from vflsec.services.models.lr.trainers import masked_gradient

    with federation(tmp_path, dataset="breast_cancer", n_passive=1, passive_features=2) as fed:
        sid = fed.operator.create_session("ckks", batch_size=N).session_id
        fed.operator.align(sid)
        active = fed.parties["active"].engine
        owned = active.session(sid)
        passive_engine = fed.parties["passive-1"].engine
        rows = list(range(N))
        errors = []
        with fed.channel("active", "passive-1") as p_ch, fed.channel("active", "coordinator") as c_ch:
            passive = passive_pb2_grpc.PassiveStub(p_ch)
            owner = coordinator_pb2_grpc.CoordinatorStub(c_ch)
            for step in (1, 2, 3):
                held = passive_engine.session(sid)
                z_true = passive_engine.data.X[held.rows[rows]] @ held.trainer.weights.T  # the test's view only
                passive.ShareTrainingLogits(passive_pb2.ForwardRequest(session_id=sid, step=step, sample_index=rows))
                pad = ring_mask.logit_mask(owned.share_mask_keys["passive-1"], sid, step, np.array(rows), 1)
                own = ring_mask.owner_share(np.zeros((N, 1)), [pad])
                reply = owner.ComputeTrainingScores(_request(sid, step, rows, ring_mask.to_bytes(own)))
                probs = wire.from_message(owned.backend, reply, "p")
                x = np.zeros((N, 29))
                x[np.arange(29), np.arange(29)] = 64.0  # crafted "features": row j alone in column j
                grad = masked_gradient(
                    owned.backend, probs, x, owned.mask_key, sid, step, b"r23" * 8,
                    lambda cts, width, tag, _s=step: active.coordinator.block_sums(sid, _s, cts, width, tag),
                )
                p_read = grad[0] * N / 64.0
                errors.append(float(np.abs(np.log(p_read / (1 - p_read)) - z_true[:29, 0]).max()))
                # the passive party applies the step with [[p]] as its δ, so its block moves
                passive.Backward(passive_pb2.BackwardRequest(session_id=sid, step=step, sample_index=rows, delta=reply))
        assert max(errors[1:]) < 5e-3  # z_p of 29 rows a step, to the flooding's 2^-6 / 64
