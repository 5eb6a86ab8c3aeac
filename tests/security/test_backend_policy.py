"""Issue 9, kept open for it: `plain` sessions hide nothing, and a coordinator ran them for anyone who asked.

Now the coordinator's `[policy] allowed_backends` (default ["ckks"]) decides; write_federation, `prepare` and
compose write ["ckks"] unless the spec asks for plain (the demo's --backend plain or --compare-plain).
"""

from __future__ import annotations

import grpc
import pytest

from tests.security.conftest import federation
from vflsec.client.federation.launcher import FederationSpec, write_federation
from vflsec.services.config import load_config
from vflsec.services.data import datasets
from vflsec.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc, passive_pb2, passive_pb2_grpc


def test_a_default_federation_refuses_a_plain_session(tmp_path) -> None:
    with federation(tmp_path, dataset="breast_cancer", n_passive=1) as fed:
        assert load_config(fed.layout.configs["coordinator"]).allowed_backends == ("ckks",)
        # Through the operator's path (the active party opens the session at the coordinator)...
        with pytest.raises(grpc.RpcError) as info:
            fed.operator.create_session("plain")
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "backend 'plain' is not allowed by this coordinator's [policy] allowed_backends ['ckks']" in (
            info.value.details()
        )
        # ...and straight from the active identity.
        with fed.channel("active", "coordinator") as channel:
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            with pytest.raises(grpc.RpcError) as info:
                stub.OpenSession(coordinator_pb2.OpenSessionRequest(
                    session_id="p", backend=common_pb2.BACKEND_PLAIN,
                    n_classes=2, passive_parties=["passive-1"]))
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED and "allowed_backends" in info.value.details()
        assert fed.operator.create_session("ckks").session_id  # the coordinator keeps serving
        # A passive party refuses plain by its own [policy], whatever a coordinator allows.
        assert load_config(fed.layout.configs["passive-1"]).allowed_backends == ("ckks",)
        with fed.channel("active", "passive-1") as channel:
            with pytest.raises(grpc.RpcError) as info:
                passive_pb2_grpc.PassiveStub(channel).JoinSession(passive_pb2.JoinSessionRequest(
                    session_id="p", backend=common_pb2.BACKEND_PLAIN, n_classes=2))
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "backend 'plain' is not allowed by passive-1's [policy] allowed_backends ['ckks']" in (
                info.value.details()
            )


def test_a_parity_federation_allows_plain_at_every_party(tmp_path) -> None:
    spec = FederationSpec(datasets.load_dataset("breast_cancer"), n_passive=2, allow_plain=True)
    layout = write_federation(spec, tmp_path)
    for party in ("coordinator", "passive-1", "passive-2"):
        assert load_config(layout.configs[party]).allowed_backends == ("ckks", "plain")
