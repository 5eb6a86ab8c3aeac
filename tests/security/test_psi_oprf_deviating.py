"""Review 15, F1, against the actively secure OPRF (OOS17's consistency check, services/crypto/oprf.py).

Before the check, a deviating active party that sent U rows that are not codewords (a known id's code with a
few bits flipped) learned the passive party's choice bits s from which of P's values matched, then tested any
dictionary offline: P's whole ID set, IDs it never held included. Now U's rows must be codewords of P's linear
code: P checks 64 random combinations of them after U is fixed and, on any mismatch, refuses with one status
and sends no value; the exchange is void and its bins stay charged. A missing, mis-sized or second proof, or any
message after the proof, is refused and voids the exchange alike. An honest exchange passes the check.

Live federations (real gRPC, mTLS); the active party is played with its own certificate.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from tests.security.conftest import Federation, federation
from vflsec.services.crypto import oprf, psi
from vflsec.services.errors import ServiceError
from vflsec.services.transport import psi_stream
from vflsec.services.transport.links import PassiveClient
from vflsec.v1 import passive_pb2, passive_pb2_grpc

SPACE, KNOWN, FLIPS, BINS = 20_000, 64, 8, 128  # dictionary size, IDs A holds, bits flipped per bin, the minimum m


@pytest.fixture(scope="module")
def opted_in(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    with federation(tmp_path_factory.mktemp("oprf-in"), n_passive=1, allow_plain=True, psi_protocol="oprf") as fed:
        yield fed


def _attack(fed: Federation, monkeypatch, flips: int) -> tuple[str, list[np.ndarray], object]:
    """One exchange from an active party whose U rows carry ``flips`` flipped bits in each of its first bins
    (F1's rows when flips > 0), answering the challenge as an honest party would for the words it used: (the
    session, the values it received, the call's error or None)."""
    engine = fed.parties["passive-1"].engine
    universe = np.array([f"cust{i:06d}" for i in range(SPACE)])
    rng = np.random.default_rng(7)  # the IDs only; the protocol draws from OS entropy
    p_ids = universe[rng.choice(SPACE, len(engine.data.ids), replace=False)]
    a_ids = p_ids[rng.choice(len(p_ids), KNOWN, replace=False)]  # A's customers, which P also holds
    monkeypatch.setattr(engine.data, "ids", p_ids)
    session_id = fed.operator.create_session("plain", seed=1).session_id
    salt = psi.new_salt()
    hashed = oprf.item_hashes(a_ids, salt)
    hash_key, table = oprf.place(hashed, BINS)
    base = oprf.BaseOtSender()
    receivers: list[oprf.Receiver] = []

    def deviating_u(code_seed: bytes, answers: list[bytes]) -> Iterator[bytes]:
        receiver = oprf.Receiver(oprf.Bins(table, hashed), *base.keys(answers), code_seed)
        receivers.append(receiver)
        (chunk,) = receiver.u_chunks()  # the honest U, then F1's flips
        u = np.frombuffer(chunk, np.uint8).reshape(-1, oprf.CODE_BYTES).copy()
        for n, j in enumerate(np.flatnonzero(table >= 0)[: oprf.CODE_BITS // max(flips, 1)] if flips else []):
            for b in range(n * flips, (n + 1) * flips):
                u[j, b // 8] ^= 0x80 >> (b % 8)
        return iter([u.tobytes()])

    got: list[np.ndarray] = []
    with fed.channel("active", "passive-1") as channel:
        client = PassiveClient("passive-1", channel)
        hello = oprf.Hello(session_id, salt, hash_key, BINS, base.point)
        try:
            client.psi_oprf(hello, deviating_u, lambda c: receivers[-1].proof(c), lambda n: None, got.append)
            error = None
        except ServiceError as exc:
            error = exc
    return session_id, got, error


def test_the_f1_attack_is_caught_by_the_consistency_check_and_learns_nothing(opted_in, monkeypatch) -> None:
    fed = opted_in
    engine = fed.parties["passive-1"].engine
    assert "oprf" in engine.psi_accept  # the passive party opted in
    spent = engine.psi_blinded.get("active", 0)
    session_id, got, error = _attack(fed, monkeypatch, FLIPS)
    assert error is not None and "failed the consistency check" in str(error)  # P refused at the check ...
    assert "no value was sent, the exchange is void" in str(error)
    assert got == []  # ... before any value: A has nothing to test s or a dictionary against
    assert engine.psi_blinded["active"] - spent == BINS  # charged like an honest exchange of this size
    assert engine.session(session_id).psi_permutation is None  # void: PsiFinish has nothing to name
    with fed.channel("active", "passive-1") as channel:
        stub = passive_pb2_grpc.PassiveStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.PsiFinish(passive_pb2.PsiFinishRequest(session_id=session_id, positions=[0]))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_the_refusal_is_one_status_naming_no_secret(opted_in, monkeypatch) -> None:
    texts = set()
    for flips in (1, FLIPS, 64):  # bits flipped per bin, in up to 64 bins; a try passes only if s lacks them all
        for _ in range(8):
            _, got, error = _attack(opted_in, monkeypatch, flips)
            if error is not None:
                break
        assert error is not None and got == []
        texts.add(str(error))
    (text,) = texts  # the same text whatever was flipped: which check failed, or which bit, is not said
    assert not any(ch.isdigit() for ch in text.split("failed the consistency check")[1])


def _raw_exchange(fed: Federation, session_id: str, tail: str) -> tuple[grpc.StatusCode, str, int]:
    """One exchange over a raw PsiOprfStream, honest up to U's last chunk, then ending as ``tail`` says: (the
    status, its details, the values received)."""
    ids = np.asarray(fed.parties["passive-1"].engine.data.ids)[:KNOWN]
    salt = psi.new_salt()
    hashed = oprf.item_hashes(ids, salt)
    hash_key, table = oprf.place(hashed, BINS)
    base = oprf.BaseOtSender()
    keys: queue.Queue = queue.Queue()
    challenges: queue.Queue = queue.Queue()

    def requests() -> Iterator[passive_pb2.PsiOprfRequest]:
        yield psi_stream.oprf_hello(oprf.Hello(session_id, salt, hash_key, BINS, base.point))
        code_seed, answers = keys.get()
        receiver = oprf.Receiver(oprf.Bins(table, hashed), *base.keys(answers), code_seed)
        chunks = list(receiver.u_chunks())
        yield from (passive_pb2.PsiOprfRequest(u_rows=chunk) for chunk in chunks)
        proof = psi_stream.oprf_proof(receiver.proof(challenges.get()))
        words, rows = receiver.proof(bytes(oprf.KEY_BYTES)).to_bytes()
        yield from {
            "honest": [proof],
            "no_proof": [],
            "short_proof": [passive_pb2.PsiOprfRequest(proof=passive_pb2.PsiOprfProof(words=words[:-1], rows=rows))],
            "two_proofs": [proof, proof],
            "u_after_proof": [proof, passive_pb2.PsiOprfRequest(u_rows=chunks[0])],
            "failed_check": [psi_stream.oprf_proof(oprf.Proof.from_bytes(words, rows))],
        }[tail]

    values = 0
    with fed.channel("active", "passive-1") as channel:
        try:
            for reply in passive_pb2_grpc.PassiveStub(channel).PsiOprfStream(requests(), timeout=60):
                step = reply.WhichOneof("step")
                if step == "keys":
                    keys.put((reply.keys.code_key, list(reply.keys.base_answers)))
                elif step == "challenge":
                    challenges.put(reply.challenge)
                else:
                    values += len(reply.values.data) // oprf.VALUE_BYTES
        except grpc.RpcError as exc:
            return exc.code(), exc.details(), values
    return grpc.StatusCode.OK, "", values


@pytest.mark.parametrize("tail", ["two_proofs", "u_after_proof"])
def test_a_message_after_the_proof_is_refused_naming_it_and_no_value_is_sent(opted_in, tail) -> None:
    # Harmless before (U and the values were fixed), but the stream refuses every message it does not expect.
    session_id = opted_in.operator.create_session("plain", seed=1).session_id
    code, details, values = _raw_exchange(opted_in, session_id, tail)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "a message after its proof" in details
    assert values == 0


@pytest.mark.parametrize("tail", ["no_proof", "short_proof", "two_proofs", "failed_check"])
def test_every_refusal_after_the_keys_voids_the_sessions_earlier_exchange_alike(opted_in, tail) -> None:
    engine = opted_in.parties["passive-1"].engine
    session_id = opted_in.operator.create_session("plain", seed=1).session_id
    assert _raw_exchange(opted_in, session_id, "honest")[0] == grpc.StatusCode.OK
    assert engine.session(session_id).psi_permutation is not None  # an exchange PsiFinish could name
    spent = engine.psi_blinded["active"]
    code, details, values = _raw_exchange(opted_in, session_id, tail)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("PSI: the active party's") and values == 0
    assert engine.psi_blinded["active"] - spent == BINS  # charged, never refunded
    assert engine.session(session_id).psi_permutation is None  # void, as a failed check voids it
    with opted_in.channel("active", "passive-1") as channel, pytest.raises(grpc.RpcError) as err:
        passive_pb2_grpc.PassiveStub(channel).PsiFinish(
            passive_pb2.PsiFinishRequest(session_id=session_id, positions=[0])
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_an_honest_exchange_passes_the_check_and_aligns(opted_in, monkeypatch) -> None:
    session_id, got, error = _attack(opted_in, monkeypatch, 0)
    engine = opted_in.parties["passive-1"].engine
    assert error is None and sum(len(v) for v in got) == oprf.HASHES * len(engine.data.ids)
    assert engine.session(session_id).psi_permutation is not None
    monkeypatch.undo()  # the federation's own IDs again
    common = opted_in.operator.align(opted_in.operator.create_session("plain", seed=1).session_id)
    assert common  # and the operator's own OPRF alignment passes it too


@pytest.fixture(scope="module")
def ecdh_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    # The active party keeps the default protocol (OPRF); the passive party's config narrows [psi] accept.
    with federation(tmp_path_factory.mktemp("oprf-off"), n_passive=1, allow_plain=True, psi_accept=["ecdh"]) as fed:
        yield fed


def test_a_passive_party_accepting_only_ecdh_refuses_the_oprf_hello_before_any_work_or_charge(
    ecdh_only, monkeypatch
) -> None:
    engine = ecdh_only.parties["passive-1"].engine
    assert engine.psi_accept == {"ecdh"}
    assert ecdh_only.parties["active"].engine.psi_protocol == "oprf"  # the default
    monkeypatch.setattr(oprf, "BaseOtReceiver", None)  # any work at all would fail differently
    session_id = ecdh_only.operator.create_session("plain", seed=1).session_id
    spent = dict(engine.psi_blinded)
    hello = oprf.Hello(session_id, psi.new_salt(), bytes(oprf.KEY_BYTES), BINS, oprf.BaseOtSender().point)
    with ecdh_only.channel("active", "passive-1") as channel:
        stub = passive_pb2_grpc.PassiveStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            list(stub.PsiOprfStream(iter([psi_stream.oprf_hello(hello), passive_pb2.PsiOprfRequest(u_rows=b"")])))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "[psi] accept" in err.value.details() and "passive-1" in err.value.details()
    assert engine.psi_blinded == spent and engine.session(session_id).psi_permutation is None
    monkeypatch.undo()
    # The operator's own Align by the default OPRF gets the refusal, naming the setting to change on either side,
    # and no fallback: nothing was charged or exchanged.
    with pytest.raises(grpc.RpcError) as err:
        ecdh_only.operator.align(session_id)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert '[psi] protocol = "ecdh" at the active party' in err.value.details()
    assert "add \"oprf\" to passive-1's [psi] accept" in err.value.details()
    assert engine.psi_blinded == spent and engine.session(session_id).psi_permutation is None
    ecdh_only.parties["active"].engine.psi_protocol = "ecdh"  # the operator's fix: the same session aligns by ECDH
    common = ecdh_only.operator.align(session_id)
    assert common and len(engine.session(session_id).rows) == len(common)
