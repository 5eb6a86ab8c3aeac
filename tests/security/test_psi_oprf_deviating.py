"""Review 15, F1: the OPRF exchange (KKRT16) is secure against a semi-honest active party only, so it is opt-in.

A deviating active party that sends a U not of code form learns the passive party's choice bits s from one
exchange charged at the minimum (128 bins), then tests any dictionary offline: it recovers the passive party's
whole ID set, IDs it never held included. This documents the known limit docs/protocol.md states (a claim check,
not an expected failure): a passive party that sets ``[psi] accept = ["ecdh", "oprf"]`` trusts the active party
not to deviate. By default a passive party refuses the OPRF hello before any work or charge.

Live federations (real gRPC, mTLS); the active party is played with its own certificate. P's choice bits are read
from P's engine only to check what the attacker recovered; the attacker never uses them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from tests.security.conftest import Federation, federation
from vflsec.services.crypto import oprf, psi
from vflsec.services.transport import psi_stream
from vflsec.services.transport.links import PassiveClient
from vflsec.v1 import passive_pb2, passive_pb2_grpc

SPACE, KNOWN, FLIPS, BINS = 20_000, 64, 8, 128  # dictionary size, IDs A holds, s bits per bin, the minimum m


@pytest.fixture(scope="module")
def opted_in(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    with federation(tmp_path_factory.mktemp("oprf-in"), n_passive=1, allow_plain=True, psi_protocol="oprf") as fed:
        yield fed


def test_a_deviating_active_party_learns_the_choice_bits_and_every_passive_id(opted_in, monkeypatch) -> None:
    fed = opted_in
    engine = fed.parties["passive-1"].engine
    assert "oprf" in engine.psi_accept  # the passive party opted in
    drawn: list[oprf.BaseOtReceiver] = []  # ground truth only
    init = oprf.BaseOtReceiver.__init__

    def recording(self: oprf.BaseOtReceiver) -> None:
        init(self)
        drawn.append(self)

    monkeypatch.setattr(oprf.BaseOtReceiver, "__init__", recording)
    universe = np.array([f"cust{i:06d}" for i in range(SPACE)])
    rng = np.random.default_rng(7)  # the IDs only; the protocol draws from OS entropy
    p_ids = universe[rng.choice(SPACE, len(engine.data.ids), replace=False)]
    a_ids = p_ids[rng.choice(len(p_ids), KNOWN, replace=False)]  # A's customers, which P also holds
    monkeypatch.setattr(engine.data, "ids", p_ids)
    session_id = fed.operator.create_session("plain", seed=1).session_id
    spent = engine.psi_blinded.get("active", 0)

    salt = psi.new_salt()
    hashed = oprf.item_hashes(a_ids, salt)
    hash_key, table = oprf.place(hashed, BINS)
    base = oprf.BaseOtSender()
    sent: dict = {}

    def deviating_u(code_key: bytes, answers: list[bytes]) -> Iterator[bytes]:
        k0, k1 = base.keys(answers)
        t0, t1 = oprf._Columns(k0).rows(BINS), oprf._Columns(k1).rows(BINS)
        r = np.frombuffer(os.urandom(BINS * oprf.CODE_BYTES), np.uint8).reshape(BINS, -1).copy()
        full = np.flatnonzero(table >= 0)
        r[full] = oprf.codes(code_key, hashed[table[full]])
        flips = {}
        for n, j in enumerate(full[: oprf.CODE_BITS // FLIPS]):  # bin j: C(x) with FLIPS bits flipped, not a code
            flips[int(j)] = list(range(n * FLIPS, (n + 1) * FLIPS))
            for b in flips[int(j)]:
                r[j, b // 8] ^= 0x80 >> (b % 8)
        sent.update(t0=t0, r=r, flips=flips, code_key=code_key)
        return iter([(t0 ^ t1 ^ r).tobytes()])

    got: list[np.ndarray] = []
    with fed.channel("active", "passive-1") as channel:
        client = PassiveClient("passive-1", channel)
        hello = oprf.Hello(session_id, salt, hash_key, BINS, base.point)
        client.psi_oprf(hello, deviating_u, lambda n: None, got.append)
        values = np.concatenate(got)
        assert engine.psi_blinded["active"] - spent == BINS  # charged like an honest exchange of this size
        position = {v: i for i, v in enumerate(values.tolist())}
        t0, r = sent["t0"], sent["r"]
        s = np.zeros(oprf.CODE_BYTES, np.uint8)
        finish = []
        for j, bits in sent["flips"].items():  # 2^FLIPS hashes per bin: which flipped bits P's s kept
            for pattern in range(1 << FLIPS):
                row = t0[j].copy()
                for k, b in enumerate(bits):
                    if pattern >> k & 1:
                        row[b // 8] ^= 0x80 >> (b % 8)
                value = oprf.output_hash(np.array([j]), row[None])[0]
                if value in position:
                    for k, b in enumerate(bits):
                        if pattern >> k & 1:
                            s[b // 8] |= 0x80 >> (b % 8)
                    finish.append(position[value])
                    break
        assert np.array_equal(s, drawn[-1].choices)  # all 512 of P's secret choice bits
        # Offline, with s: P's value of any candidate y in each of its bins j is H(j, T0_j ^ ((r_j ^ C(y)) & s)).
        hu = oprf.item_hashes(universe, salt)
        cu, bu = oprf.codes(sent["code_key"], hu), oprf.bins_of(hash_key, hu, BINS)
        member = np.zeros(SPACE, bool)
        for i in range(oprf.HASHES):
            j = bu[:, i]
            member |= np.isin(oprf.output_hash(j, t0[j] ^ ((r[j] ^ cu) & s)), values)
        found = set(universe[member].tolist())
        assert found == set(p_ids.tolist())  # P's whole ID set ...
        assert len(found - set(a_ids.tolist())) == len(p_ids) - KNOWN  # ... IDs A never held included
        # and the run looks honest to P: PsiFinish with the positions of the IDs A holds is accepted
        assert client.psi_finish(session_id, np.array(finish)) == KNOWN


@pytest.fixture(scope="module")
def default(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    with federation(tmp_path_factory.mktemp("oprf-default"), n_passive=1, allow_plain=True) as fed:
        yield fed


def test_a_default_passive_party_refuses_the_oprf_hello_before_any_work_or_charge(default, monkeypatch) -> None:
    engine = default.parties["passive-1"].engine
    assert engine.psi_accept == {"ecdh"}
    monkeypatch.setattr(oprf, "BaseOtReceiver", None)  # any work at all would fail differently
    session_id = default.operator.create_session("plain", seed=1).session_id
    spent = dict(engine.psi_blinded)
    hello = oprf.Hello(session_id, psi.new_salt(), bytes(oprf.KEY_BYTES), BINS, oprf.BaseOtSender().point)
    with default.channel("active", "passive-1") as channel:
        stub = passive_pb2_grpc.PassiveStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            list(stub.PsiOprfStream(iter([psi_stream.oprf_hello(hello), passive_pb2.PsiOprfRequest(u_rows=b"")])))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "[psi] accept" in err.value.details() and "passive-1" in err.value.details()
    assert engine.psi_blinded == spent and engine.session(session_id).psi_permutation is None
    monkeypatch.undo()
    common = default.operator.align(session_id)  # ECDH, the default, aligns the session
    assert common and len(engine.session(session_id).rows) == len(common)
