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
    code, details = _code(stub.Forward, forward)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "ShareLogits" in details

    backward = passive_pb2.BackwardRequest(
        session_id=session_id, step=10**6, sample_index=[0], delta=_plain_matrix(np.zeros((1, 1)))
    )
    code, details = _code(stub.Backward, backward)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "Forward" in details

    coordinator = _coordinator_as_active(fed)
    sums = coordinator_pb2.BlockSumsRequest(mask_tag=TAG, session_id=session_id, step=10**6, ciphertexts=[b"x"])
    assert _code(coordinator.DecryptBlockSums, sums)[0] == grpc.StatusCode.FAILED_PRECONDITION
    untagged = coordinator_pb2.BlockSumsRequest(session_id=session_id, step=1, ciphertexts=[b"x"])
    code, details = _code(coordinator.DecryptBlockSums, untagged)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "mask_tag: must be 32 bytes, got 0" in details
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
