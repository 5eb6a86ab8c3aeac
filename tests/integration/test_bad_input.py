"""Bad input gets a precise status and the services keep serving (real gRPC, mTLS, both backends)."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from vflsec.services.crypto import he, ring_mask
from vflsec.services.transport import wire
from vflsec.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc, passive_pb2, passive_pb2_grpc

TAG = bytes(range(32))  # the caller's mask_tag (entropy.tag of its masks' context)


@pytest.fixture(scope="module")
def trained(binary_federation):
    fed = binary_federation
    info = fed.operator.create_session("plain", seed=1)
    common = fed.operator.align(info.session_id)
    list(fed.operator.train(info.session_id, common[:200], 1))
    return fed, info.session_id, common


def _code(call, *args) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call(*args)
    return err.value.code(), err.value.details()


def _still_serving(fed, session_id: str, common: list[str]) -> None:
    released = fed.operator.predict(session_id, common[:5])
    assert released.scores.shape == (5, 2)


def test_unknown_sample_id_is_not_found(trained) -> None:
    fed, session_id, common = trained
    code, details = _code(fed.operator.predict, session_id, [common[0], "no-such-id"])
    assert code == grpc.StatusCode.NOT_FOUND and "no-such-id" in details
    _still_serving(fed, session_id, common)


def test_unknown_session_is_not_found(trained) -> None:
    fed, session_id, common = trained
    code, details = _code(fed.operator.predict, "no-such-session", common[:3])
    assert code == grpc.StatusCode.NOT_FOUND and "no-such-session" in details
    _still_serving(fed, session_id, common)


def test_empty_and_bad_requests_are_invalid(trained) -> None:
    fed, session_id, common = trained
    assert _code(fed.operator.predict, session_id, [])[0] == grpc.StatusCode.INVALID_ARGUMENT
    code, details = _code(lambda: list(fed.operator.train(session_id, common[:10], 0)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "epochs" in details
    _still_serving(fed, session_id, common)


def _coordinator_as_active(fed) -> coordinator_pb2_grpc.CoordinatorStub:
    return coordinator_pb2_grpc.CoordinatorStub(fed.channel("active", "coordinator"))


def _plain_matrix(values: np.ndarray, replicas: int = 1) -> common_pb2.EncryptedMatrix:
    backend = he.make_keyholder("plain")
    return wire.to_message(backend, he.encrypt_matrix(backend, values, replicas))


def test_malformed_shares_and_wrong_shapes(trained) -> None:
    fed, session_id, common = trained
    stub = _coordinator_as_active(fed)
    passive = passive_pb2_grpc.PassiveStub(fed.channel("active", "passive-1"))

    def release(share: bytes, n: int = 4):
        rows = list(range(n))  # a fresh admitted query, with the passive party's share
        query = stub.AdmitQuery(coordinator_pb2.AdmitQueryRequest(session_id=session_id, sample_index=rows))
        passive.ShareLogits(
            passive_pb2.ShareLogitsRequest(session_id=session_id, query_id=query.query_id, sample_index=rows)
        )
        request = coordinator_pb2.ReleaseScoresRequest(
            session_id=session_id, query_id=query.query_id, share=share, sample_index=rows
        )
        return stub.ReleaseScores(request)

    assert release(ring_mask.to_bytes(ring_mask.encode(np.zeros((4, 1))))).scores.shape == [4, 2]
    for share, what in (
        (b"\x00garbage", "share holds 8 bytes"),  # one word for four rows
        (bytes(8 * 12), "share holds 96 bytes"),  # 4 x 3 words: a binary model has one logit
        (b"", "share holds 0 bytes"),
    ):
        code, details = _code(release, share)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and what in details, (what, details)
    # Any 4 words are a share: a crafted one (all bits set, i.e. -2^-24 each) is scored, never refused (rule 4).
    assert release(b"\xff" * 32).scores.shape == [4, 2]
    _still_serving(fed, session_id, common)


def test_out_of_order_steps_and_unknown_indices_at_the_passive_party(trained) -> None:
    fed, session_id, common = trained
    stub = passive_pb2_grpc.PassiveStub(fed.channel("active", "passive-1"))
    share = passive_pb2.ShareLogitsRequest(session_id=session_id, query_id="q", sample_index=[0, 10**9])
    code, details = _code(stub.ShareLogits, share)
    assert code == grpc.StatusCode.NOT_FOUND and "sample index" in details
    forward = passive_pb2.ForwardRequest(session_id=session_id, step=-1, sample_index=[0])
    code, details = _code(stub.Forward, forward)  # retired: the forward goes to the coordinator masked
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "ShareTrainingLogits" in details

    backward = passive_pb2.BackwardRequest(
        session_id=session_id, step=10**6, sample_index=[0], delta=_plain_matrix(np.zeros((1, 1)))
    )
    code, details = _code(stub.Backward, backward)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "does not follow its forward" in details

    coordinator = _coordinator_as_active(fed)
    sums = coordinator_pb2.BlockSumsRequest(mask_tag=TAG, session_id=session_id, step=10**6, ciphertexts=[b"x"])
    assert _code(coordinator.DecryptBlockSums, sums)[0] == grpc.StatusCode.FAILED_PRECONDITION
    untagged = coordinator_pb2.BlockSumsRequest(session_id=session_id, step=1, ciphertexts=[b"x"])
    code, details = _code(coordinator.DecryptBlockSums, untagged)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "mask_tag: must be 32 bytes, got 0" in details
    _still_serving(fed, session_id, common)


def test_bad_training_shares_name_their_field(trained) -> None:
    """The training forward's messages (ShareTrainingLogits at the passive party, SubmitTrainingShare and
    ComputeTrainingScores' share at the coordinator): each bad field gets its status and name, over gRPC, and the
    services keep serving. No refusal looks at a share's values: any words of the right size are a share."""
    fed, session_id, common = trained
    last = fed.parties["coordinator"].engine.sessions[session_id].last_step
    passive = passive_pb2_grpc.PassiveStub(fed.channel("active", "passive-1"))
    for request, status, what in (
        (passive_pb2.ForwardRequest(session_id=session_id, step=0, sample_index=[0]), "INVALID_ARGUMENT", "steps >= 1"),
        (passive_pb2.ForwardRequest(session_id=session_id, step=10**6, sample_index=[0]), "FAILED_PRECONDITION",
         "step 1000000 is out of order"),
        (passive_pb2.ForwardRequest(session_id=session_id, step=last + 1, sample_index=[0, 10**9]), "NOT_FOUND",
         "sample index 1000000000"),
        (passive_pb2.ForwardRequest(session_id=session_id, step=last + 1, sample_index=[]), "INVALID_ARGUMENT",
         "sample_index is empty"),
    ):
        code, details = _code(passive.ShareTrainingLogits, request)
        assert code == getattr(grpc.StatusCode, status) and what in details, (what, details)

    sharer = coordinator_pb2_grpc.CoordinatorStub(fed.channel("passive-1", "coordinator"))
    words = bytes(8 * 4)
    for fields, status, what in (
        ({"step": last + 1, "sample_index": [0, 1, 2, 3], "share": b"\x00garbage"}, "INVALID_ARGUMENT",
         "share holds 8 bytes"),
        ({"step": last + 1, "sample_index": [0, 1, 2, 3], "share": bytes(8 * 8)}, "INVALID_ARGUMENT",
         "share holds 64 bytes"),  # 4 x 2 words: a binary model has one logit
        ({"step": 0, "sample_index": [0, 1, 2, 3], "share": words}, "INVALID_ARGUMENT", "step must be"),
        ({"step": last + 2, "sample_index": [0, 1, 2, 3], "share": words}, "FAILED_PRECONDITION",
         f"step {last + 2} is neither the session's next training step {last + 1} nor its last {last}"),
        ({"step": last - 1, "sample_index": [0, 1, 2, 3], "share": words}, "FAILED_PRECONDITION",
         f"step {last - 1} is neither"),
        ({"step": last + 1, "sample_index": [0, 1, 2, 10**5], "share": words}, "INVALID_ARGUMENT",
         "sample_index: row 100000 was never aligned"),
        ({"step": last + 1, "sample_index": [0, 1, 1, 3], "share": words}, "INVALID_ARGUMENT",
         "sample_index repeats a row"),
        ({"step": last + 1, "sample_index": [], "share": b""}, "INVALID_ARGUMENT", "sample_index is empty"),
    ):
        request = coordinator_pb2.TrainingShare(session_id=session_id, **fields)
        code, details = _code(sharer.SubmitTrainingShare, request)
        assert code == getattr(grpc.StatusCode, status) and what in details, (what, details)

    stub = _coordinator_as_active(fed)
    rows = list(range(100, 164))
    widths = {"active": 4, "passive-1": 6}  # the binary federation's schema: 3 active features + bias, 5 passive
    old_way = coordinator_pb2.TrainingScoresRequest(
        session_id=session_id, step=last + 1, logits=_plain_matrix(np.zeros((64, 1))), replicas=1,
        sample_index=rows, widths=widths,
    )
    code, details = _code(stub.ComputeTrainingScores, old_way)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("logits: a ciphertext [[z]] is no longer")
    short = coordinator_pb2.TrainingScoresRequest(
        session_id=session_id, step=last + 1, share=bytes(8 * 63), replicas=1, sample_index=rows, widths=widths
    )
    code, details = _code(stub.ComputeTrainingScores, short)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "share holds 504 bytes" in details
    _still_serving(fed, session_id, common)


def test_oversized_message_is_refused(trained) -> None:
    fed, session_id, common = trained
    limit = fed.parties["coordinator"].config.max_message_bytes
    stub = _coordinator_as_active(fed)
    request = coordinator_pb2.BlockSumsRequest(
        mask_tag=TAG, session_id=session_id, step=1, ciphertexts=[b"\0" * (limit + 1)]
    )
    code, _ = _code(stub.DecryptBlockSums, request)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    _still_serving(fed, session_id, common)
