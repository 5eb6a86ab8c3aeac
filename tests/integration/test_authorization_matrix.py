"""Every RPC of every service, called from every role over real mutual TLS, is allowed or denied exactly as
the authorization matrix (services/rpc/authz.py, from the ROLE_POLICY dicts) says; callers without a valid client
certificate are refused before any RPC runs."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.message import Message

from vflsec.services.rpc import authz
from vflsec.services.transport import tls
from vflsec.services.transport.server import peer_channel

# A certificate per role, as issued by write_federation (the operator's is always issued).
CALLERS = {tls.COORDINATOR: "coordinator", tls.ACTIVE: "active", tls.PASSIVE: "passive-1", tls.OPERATOR: "operator"}
# A passive party answers only its own operator (identity, not role: tests/security/test_session_owner.py).
OWN_OPERATOR = "operator-passive-1"
# The party serving each service in the test federation.
SERVERS = {
    "Coordinator": "coordinator",
    "Active": "active",
    "Passive": "passive-1",
    "SplitNnCoordinator": "coordinator",
    "SplitNnPassive": "passive-1",
    "TreeCoordinator": "coordinator",
    "TreePassive": "passive-1",
}
UNKNOWN_SESSION = "authz-matrix-unknown-session"
TIMEOUT = 20.0


def _minimal_request(rule: authz.Rule) -> Message:
    """An empty request of the RPC's input type, naming a session no party knows: valid protobuf, no effect."""
    request = message_factory.GetMessageClass(rule.method.input_type)()
    if "session_id" in rule.method.input_type.fields_by_name:
        request.session_id = UNKNOWN_SESSION
    return request


def _call(channel: grpc.Channel, rule: authz.Rule) -> grpc.StatusCode:
    request = _minimal_request(rule)
    kind = channel.unary_stream if rule.method.server_streaming else channel.unary_unary
    stub = kind(rule.path, request_serializer=type(request).SerializeToString, response_deserializer=lambda b: b)
    try:
        reply = stub(request, timeout=TIMEOUT)
        if rule.method.server_streaming:
            list(reply)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


@pytest.fixture(scope="module")
def channels(binary_federation):
    opened: dict[tuple[str, str], grpc.Channel] = {}
    for role, caller in CALLERS.items():
        for service, server in SERVERS.items():
            who = OWN_OPERATOR if role == tls.OPERATOR and server == "passive-1" else caller
            opened[role, service] = binary_federation.channel(who, server)
    yield opened
    for channel in opened.values():
        channel.close()


RULES = authz.rules()


@pytest.mark.parametrize("rule", RULES, ids=[r.path.strip("/") for r in RULES])
def test_every_role_on_every_rpc(channels, rule: authz.Rule) -> None:
    assert rule.allowed, f"{rule.path} is in no policy: denied to everyone"
    outcome = {role: _call(channels[role, rule.service.name], rule) for role in authz.ROLES}
    for role, code in outcome.items():
        if role in rule.allowed:
            # The request passed authorization; the engine may still refuse it (unknown session: NOT_FOUND).
            assert code not in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED), (role, code)
        else:
            assert code == grpc.StatusCode.PERMISSION_DENIED, (role, code)


def _health_code(channel: grpc.Channel) -> grpc.StatusCode:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize("server", sorted(set(SERVERS.values())))
def test_callers_without_a_valid_client_certificate_are_refused(binary_federation, tmp_path, server: str) -> None:
    layout = binary_federation.layout
    address = layout.addresses[server]
    options = [("grpc.ssl_target_name_override", server)]
    # The open health service is the most permissive RPC a server has: refusing it refuses everything.
    with peer_channel(address, server, layout.tls("operator"), 1 << 20) as trusted:
        assert _health_code(trusted) == grpc.StatusCode.OK  # the control: a valid certificate gets through
    # Server verified, but no client certificate: the server's required client auth fails the handshake.
    anonymous = grpc.ssl_channel_credentials(root_certificates=layout.tls(server).ca.read_bytes())
    with grpc.secure_channel(address, anonymous, options=options) as channel:
        assert _health_code(channel) == grpc.StatusCode.UNAVAILABLE
    # A certificate with the right party id and role, issued by another CA.
    foreign = tls.make_pki(tmp_path / "foreign", [server]).files("operator")
    foreign_creds = grpc.ssl_channel_credentials(
        root_certificates=layout.tls(server).ca.read_bytes(),  # trust the real server, present a foreign cert
        private_key=foreign.key.read_bytes(),
        certificate_chain=foreign.cert.read_bytes(),
    )
    with grpc.secure_channel(address, foreign_creds, options=options) as channel:
        assert _health_code(channel) == grpc.StatusCode.UNAVAILABLE
