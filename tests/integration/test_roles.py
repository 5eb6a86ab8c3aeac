"""Every RPC checks the caller's role from its certificate."""

from __future__ import annotations

import grpc
import pytest

from vflsec.client.federation.operator import Operator
from vflsec.services.transport import tls
from vflsec.services.transport.server import peer_channel
from vflsec.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc, passive_pb2_grpc


def _denied(call, request) -> str:
    with pytest.raises(grpc.RpcError) as err:
        call(request, timeout=10)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    return err.value.details()


def test_passive_party_asking_for_scores_is_denied(binary_federation) -> None:
    stub = coordinator_pb2_grpc.CoordinatorStub(binary_federation.channel("passive-1", "coordinator"))
    details = _denied(stub.ReleaseScores, coordinator_pb2.ReleaseScoresRequest(session_id="s"))
    assert "'passive'" in details and "ReleaseScores" in details and "allowed: active" in details
    _denied(stub.ReleaseModel, common_pb2.SessionRef(session_id="s"))


def test_only_the_coordinator_reads_passive_weights(binary_federation) -> None:
    stub = passive_pb2_grpc.PassiveStub(binary_federation.channel("active", "passive-1"))
    details = _denied(stub.GetWeights, common_pb2.SessionRef(session_id="s"))
    assert "allowed: coordinator" in details


def test_parties_cannot_drive_the_active_party(binary_federation) -> None:
    for caller in ("passive-1", "coordinator"):
        operator = Operator(binary_federation.channel(caller, "active"))
        with pytest.raises(grpc.RpcError) as err:
            operator.create_session("plain")
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_operator_cannot_call_party_internals(binary_federation) -> None:
    stub = passive_pb2_grpc.PassiveStub(binary_federation.channel("operator", "passive-1"))
    _denied(stub.GetWeights, common_pb2.SessionRef(session_id="s"))


def test_foreign_ca_and_plaintext_are_refused(binary_federation, tmp_path) -> None:
    fed = binary_federation
    foreign = tls.make_pki(tmp_path / "foreign", ["active"])
    channel = peer_channel(fed.layout.addresses["active"], "active", foreign.files("operator"), 1 << 20)
    with pytest.raises(grpc.RpcError) as err:
        Operator(channel).create_session("plain")
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    insecure = grpc.insecure_channel(fed.layout.addresses["active"])
    with pytest.raises(grpc.RpcError) as err:
        Operator(insecure).create_session("plain")
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_wrong_server_identity_is_refused(binary_federation) -> None:
    """Identity pinning: a channel meant for the coordinator refuses the passive party's certificate."""
    fed = binary_federation
    channel = peer_channel(fed.layout.addresses["passive-1"], "coordinator", fed.layout.tls("active"), 1 << 20)
    stub = coordinator_pb2_grpc.CoordinatorStub(channel)
    with pytest.raises(grpc.RpcError) as err:
        stub.GetPublicContext(common_pb2.SessionRef(session_id="s"), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
