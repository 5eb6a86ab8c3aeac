"""Finding 7: PSI leaked more than the intersection (twist bit per row, unbounded lists, repeated exchanges).

Every probe runs against a live federation (real gRPC, mTLS) and speaks to the passive party with the active
party's own certificate, as a deviating active party would.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from pysodium import crypto_core_ristretto255_is_valid_point

from tests.security.conftest import Federation, federation
from vflsec.client.federation.launcher import FederationLayout
from vflsec.services.app import start_party
from vflsec.services.config import load_config
from vflsec.services.crypto import oprf, psi
from vflsec.services.transport import psi_stream
from vflsec.v1 import passive_pb2, passive_pb2_grpc

CAP = 600  # the federation's [limits] psi_max_ids: above every party's 569 rows, so honest alignment passes
P = 2**255 - 19
A = 486662
@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    folder = tmp_path_factory.mktemp("psi")
    # ECDH's probes: the active party aligns by ECDH too (OPRF, the default, has its own: test_psi_oprf_deviating.py).
    spec = {"n_passive": 1, "limits": {"psi_max_ids": CAP}, "allow_plain": True, "psi_protocol": "ecdh"}
    with federation(folder, **spec) as running:
        yield running


@pytest.fixture(scope="module")
def passive(fed: Federation) -> Iterator[passive_pb2_grpc.PassiveStub]:
    with fed.channel("active", "passive-1") as channel:
        yield passive_pb2_grpc.PassiveStub(channel)


def _exchange(stub: passive_pb2_grpc.PassiveStub, session_id: str, points: list[bytes]) -> tuple[list, list]:
    """A PsiExchangeStream as a deviating active party could make it: the list in chunks; the two reply lists."""
    blob = np.frombuffer(b"".join(points), dtype=f"S{psi.POINT_BYTES}")
    lists: dict[str, list[bytes]] = {psi.DOUBLE: [], psi.OWN: []}
    for reply in stub.PsiExchangeStream(psi_stream.requests(session_id, b"probe", psi.chunks_of(blob))):
        data = getattr(reply, reply.WhichOneof("list")).data
        lists[reply.WhichOneof("list")] += [data[i : i + 32] for i in range(0, len(data), 32)]
    return lists[psi.DOUBLE], lists[psi.OWN]


def _refused(call, *args) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call(*args)
    return err.value.code(), err.value.details()


def _twist_bit(encoding: bytes) -> bool:
    """The old probe's distinguisher: read as an X25519 u-coordinate, is this value on the twist (u³ + A·u² + u
    non-square)?"""
    u = (int.from_bytes(encoding, "little") & ((1 << 255) - 1)) % P
    return pow((u * u * u + A * u * u + u) % P, (P - 1) // 2, P) == P - 1


def test_twist_probe_has_nothing_to_distinguish(fed: Federation, passive) -> None:
    """Old probe: hash 400 IDs, send them blinded, and compare each row's twist bit before and after the
    passive party's blinding: 400/400 agreed, one bit per row. Now every value is an element of ristretto255, a
    group of prime order (no twist, no cofactor), and the raw bytes' bit no longer survives blinding."""
    session_id = fed.operator.create_session("plain", seed=7).session_id
    sent = psi.PsiKey().blind_ids([f"candidate-{i}" for i in range(400)], psi.new_salt())
    returned, own = _exchange(passive, session_id, sent)
    assert len(returned) == 400
    for value in (*sent, *returned, *own):
        assert crypto_core_ristretto255_is_valid_point(value)
    # Read as X25519 did, the bit is a coin flip after blinding: survival near 200/400, not 400/400.
    bits = [[_twist_bit(v) for v in values] for values in (sent, returned)]
    kept = sum(before == after for before, after in zip(*bits, strict=True))
    assert 140 <= kept <= 260, kept  # binomial(400, 1/2): outside this range with probability < 1e-9


def test_over_cap_list_is_refused_before_any_point(fed: Federation, passive) -> None:
    session_id = fed.operator.create_session("plain", seed=8).session_id
    # All-zero bytes are not even points: the cap must answer first, so no point is ever looked at.
    code, details = _refused(_exchange, passive, session_id, [bytes(32)] * (CAP + 1))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"{CAP + 1} IDs" in details and f"cap of {CAP}" in details and "psi_max_ids" in details
    # The refused request used up nothing: the session still aligns.
    assert len(fed.operator.align(session_id)) > 0


# Encodings a deviating active party could send instead of a blinded ID (RFC 9496 §4.3.1 refuses each).
BAD_ENCODINGS = {
    "identity": bytes(32),
    "non-canonical (s = p)": P.to_bytes(32, "little"),
    "bit 255 set": None,  # a valid value with bit 255 set: libsodium 1.0.18 decodes it, vflsec refuses it
    "negative (s = 1)": (1).to_bytes(32, "little"),
    "no element (s = 2)": (2).to_bytes(32, "little"),
    "edwards25519 point of order 8": bytes.fromhex("26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05"),
}


@pytest.mark.parametrize("kind", list(BAD_ENCODINGS))
def test_invalid_points_are_refused_and_the_service_keeps_running(fed: Federation, passive, kind: str) -> None:
    session_id = fed.operator.create_session("plain", seed=9).session_id
    good = psi.hash_ids(["some-id"], b"probe")[0]
    bad = BAD_ENCODINGS[kind] or bytes([*good[:31], good[31] | 0x80])
    code, details = _refused(_exchange, passive, session_id, [good, bad])
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "index 1 is not a canonical point of ristretto255" in details
    assert len(fed.operator.align(session_id)) > 0  # still serving, and the session was not used up


def _restart(fed: Federation, party: str) -> None:
    """Stop a party and start it again from its config and checkpoints, on the same address."""
    layout: FederationLayout = fed.layout
    fed.parties[party].stop()
    fed.parties[party] = start_party(load_config(layout.configs[party]))


def test_one_exchange_per_session_even_across_restarts(fed: Federation, passive) -> None:
    session_id = fed.operator.create_session("plain", seed=10).session_id
    common = fed.operator.align(session_id)
    assert common
    candidates = psi.PsiKey().blind_ids([f"candidate-{i}" for i in range(20)], psi.new_salt())

    def refused_everywhere() -> None:
        # The operator's Align answers the recorded IDs again; it runs no second exchange (refused below).
        assert fed.operator.align(session_id) == common
        code, details = _refused(_exchange, passive, session_id, candidates)
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "one per session" in details
        # Nor can the common rows be re-pointed after the fact.
        finish = passive_pb2.PsiFinishRequest(session_id=session_id, positions=np.arange(len(common)).tolist())
        code, details = _refused(passive.PsiFinish, finish)
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "aligned already" in details

    refused_everywhere()
    _restart(fed, "passive-1")
    _restart(fed, "active")
    refused_everywhere()
    # The restarted federation still serves: a new session aligns to the same common IDs.
    assert sorted(fed.operator.align(fed.operator.create_session("plain", seed=11).session_id)) == sorted(common)


def test_active_party_refuses_to_start_over_its_own_cap(fed: Federation) -> None:
    # The config path of the cap is exercised above; here the active engine's bound is lowered in place (then
    # restored) so that its own list breaks it: refused before anything is sent, and the session is not used up.
    engine = fed.parties["active"].engine
    session_id = fed.operator.create_session("plain", seed=12).session_id
    n_ids, caps = len(engine.data.ids), engine.psi_caps
    engine.psi_caps = dataclasses.replace(caps, max_ids=100)
    try:
        code, details = _refused(fed.operator.align, session_id)
    finally:
        engine.psi_caps = caps
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"holds {n_ids} sample IDs, over the cap of 100" in details and "psi_max_ids" in details
    assert len(fed.operator.align(session_id)) > 0


def test_psi_budget_per_owner_across_sessions_and_restarts(tmp_path) -> None:
    # One exchange per session still let the active party test a dictionary over many sessions. Now each
    # passive party counts the IDs it blinds per owner, durably, and refuses an exchange over [limits]
    # psi_owner_budget before computing any point.
    with federation(tmp_path, n_passive=1, limits={"psi_owner_budget": 100}) as fed, fed.channel(
        "active", "passive-1"
    ) as channel:
        stub = passive_pb2_grpc.PassiveStub(channel)
        candidates = psi.PsiKey().blind_ids([f"candidate-{i}" for i in range(61)], psi.new_salt())
        ledger = fed.layout.workdir / "passive-1" / "state" / "psi_owners"

        first = fed.operator.create_session("ckks").session_id
        assert len(_exchange(stub, first, candidates[:60])[0]) == 60
        _restart(fed, "passive-1")  # the count survives a restart
        second = fed.operator.create_session("ckks").session_id
        assert len(_exchange(stub, second, candidates[:40])[0]) == 40  # 100 of 100
        third = fed.operator.create_session("ckks").session_id
        code, details = _refused(_exchange, stub, third, candidates[:1])
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "100 of 100 IDs blinded over its sessions, 1 more sent ([limits] psi_owner_budget)" in details
        assert fed.parties["passive-1"].engine.sessions[third].psi_permutation is None  # nothing computed
        _restart(fed, "passive-1")
        code, _ = _refused(_exchange, stub, third, candidates[:1])
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert sorted(p.name for p in ledger.iterdir()) == ["active.npz"]
        assert fed.parties["passive-1"].engine.psi_blinded == {"active": 100}


def test_oprf_bins_are_charged_to_the_same_budget_across_a_restart(tmp_path) -> None:
    # Review 15, F7: the OPRF hello's bins are charged to the owner's psi_owner_budget like ECDH's blinded IDs, in
    # the same durable ledger: a restart does not reset it, and over the budget a hello is refused before any work.
    spec = {"n_passive": 1, "limits": {"psi_owner_budget": 300}, "psi_protocol": "oprf"}
    with federation(tmp_path, **spec) as fed, fed.channel("active", "passive-1") as channel:
        stub = passive_pb2_grpc.PassiveStub(channel)

        def hello(bins: int) -> None:  # an OPRF hello and no U: charged at the hello, then refused for U cut short
            sender = oprf.BaseOtSender()
            request = psi_stream.oprf_hello(oprf.Hello(session, psi.new_salt(), bytes(16), bins, sender.point))
            list(stub.PsiOprfStream(iter([request]), timeout=60))

        session = fed.operator.create_session("ckks").session_id
        code, details = _refused(hello, 256)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "U ended after 0 of 1 chunks" in details
        _restart(fed, "passive-1")
        assert fed.parties["passive-1"].engine.psi_blinded == {"active": 256}  # kept across the restart
        candidates = psi.PsiKey().blind_ids([f"candidate-{i}" for i in range(40)], psi.new_salt())
        assert len(_exchange(stub, fed.operator.create_session("ckks").session_id, candidates)[0]) == 40
        session = fed.operator.create_session("ckks").session_id
        code, details = _refused(hello, 128)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "296 of 300 IDs blinded over its sessions, 128 more announced as OPRF bins" in details
        assert fed.parties["passive-1"].engine.psi_blinded == {"active": 296}
