"""The OT-extension PSI (services/crypto/oprf.py, Passive.PsiOprfStream; the default: [psi] protocol) through the
live services (real gRPC, mTLS, two passive parties): the known intersection comes back exactly with the same
sample at each common index on every party, ECDH stays selectable and agrees, and each bad input is refused with
a status naming it: bins over the caps (before any work or budget), a bad base-OT point, a stream without a hello,
U chunks of the wrong size, a value list that is not 3 per ID, PsiFinish positions naming padding, one ID twice or
nothing at all (one refusal for all, voiding the exchange), a refusal at one passive party, bad keys from one, bad
own IDs and disjoint sets (each leaving nothing aligned)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import threading
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from tests.integration.conftest import Federation, federation
from vflsec.services.crypto import oprf, psi
from vflsec.services.engines.passive import PSI_STREAMS_PER_OWNER
from vflsec.services.transport import psi_stream
from vflsec.services.transport.links import PassiveClient
from vflsec.v1 import passive_pb2, passive_pb2_grpc


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    with federation(tmp_path_factory.mktemp("psi-oprf"), n_passive=2, allow_plain=True, psi_protocol="oprf") as running:
        yield running


def _engine(fed: Federation, party: str):
    return fed.parties[party].engine


def _session(fed: Federation, seed: int) -> str:
    return fed.operator.create_session("plain", seed=seed).session_id


@contextlib.contextmanager
def _ids(fed: Federation, **ids: np.ndarray) -> Iterator[None]:
    """Parties' IDs replaced for the duration (``passive_1=...``; alignment reads no feature)."""
    datas = {party.replace("_", "-"): _engine(fed, party.replace("_", "-")).data for party in ids}
    originals = {party: data.ids for party, data in datas.items()}
    for party, data in datas.items():
        data.ids = ids[party.replace("-", "_")]
    try:
        yield
    finally:
        for party, data in datas.items():
            data.ids = originals[party]


def _refused(call, *args) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call(*args)
    return err.value.code(), err.value.details()


def test_known_intersection_over_two_passive_parties_row_for_row_and_ecdh_agrees(fed) -> None:
    rng = np.random.default_rng(0)  # the input rows only; the protocol draws from OS entropy
    common = [f"c{i:05d}" for i in range(700)]
    active = np.array(common + [f"a{i}" for i in range(300)])[rng.permutation(1000)]
    first = np.array(common + [f"x{i}" for i in range(50)] + ["a1", "a2"])[rng.permutation(752)]
    second = np.array(common[:650] + ["a1", "a3"] + [f"y{i}" for i in range(900)])[rng.permutation(1552)]
    expected = {*common[:650], "a1"}  # a2 and a3 each miss one passive party
    aligned = {}
    with _ids(fed, active=active, passive_1=first, passive_2=second):
        for protocol in ("oprf", "ecdh"):
            _engine(fed, "active").psi_protocol = protocol
            try:
                session_id = _session(fed, 1 if protocol == "oprf" else 2)
                aligned[protocol] = fed.operator.align(session_id)
            finally:
                _engine(fed, "active").psi_protocol = "oprf"
            rows = _engine(fed, "active").session(session_id).rows
            assert aligned[protocol] == active[rows].tolist()  # the operator's order is the common order
            for party, ids in (("passive-1", first), ("passive-2", second)):
                assert ids[_engine(fed, party).session(session_id).rows].tolist() == aligned[protocol]
    assert set(aligned["oprf"]) == set(aligned["ecdh"]) == expected and len(aligned["oprf"]) == len(expected)


def test_the_common_order_is_fresh_each_session(fed) -> None:
    one, two = (fed.operator.align(_session(fed, seed)) for seed in (3, 4))
    assert sorted(one) == sorted(two) and one != two


def _stream(fed: Federation, requests: list[passive_pb2.PsiOprfRequest]) -> list[passive_pb2.PsiOprfReply]:
    """A PsiOprfStream to passive-1 with the active party's certificate, requests as given; the replies."""
    with fed.channel("active", "passive-1") as channel:
        return list(passive_pb2_grpc.PassiveStub(channel).PsiOprfStream(iter(requests), timeout=60))


def _hello(session_id: str, **changes: object) -> passive_pb2.PsiOprfRequest:
    fields = dict(session_id=session_id, salt=psi.new_salt(), hash_key=bytes(16), bins=1024,
                  base_point=oprf.BaseOtSender().point)
    fields.update(changes)
    return psi_stream.oprf_hello(oprf.Hello(**fields))


def test_bins_over_the_caps_are_refused_before_any_work_or_budget(fed) -> None:
    engine = _engine(fed, "passive-1")
    session_id, spent = _session(fed, 5), dict(engine.psi_blinded)
    n_own = len(engine.data.ids)
    cap = max(int(engine.psi_caps.max_ratio * n_own), engine.psi_caps.ratio_floor)
    too_many = oprf.bins(cap) + oprf.BIN_ALIGN
    code, details = _refused(_stream, fed, [_hello(session_id, bins=too_many)])
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        f"PSI: the active party's hello announces {too_many} bins: this party takes a multiple of 128 up to "
        f"{oprf.bins(cap)}, the bins of {cap} IDs ([limits] psi_max_ids, psi_max_ratio, psi_ratio_floor)"
    ) in details
    code, details = _refused(_stream, fed, [_hello(session_id, bins=1000)])  # not a multiple of 128
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "announces 1000 bins" in details
    assert engine.psi_blinded == spent and engine.session(session_id).psi_permutation is None
    assert len(fed.operator.align(session_id)) > 0  # nothing was used up


def test_an_owner_over_budget_is_refused_before_any_work_and_bad_own_ids_are_refunded(fed, monkeypatch) -> None:
    # Review 15, F4: the budget is charged right after the hello's field checks, before base OTs or hashing our IDs.
    engine = _engine(fed, "passive-1")
    session_id, spent = _session(fed, 11), engine.psi_blinded["active"]
    work = []
    monkeypatch.setattr(oprf, "item_hashes", lambda *a: work.append("hashing") or [])
    monkeypatch.setattr(oprf, "BaseOtReceiver", lambda: work.append("base OTs"))
    monkeypatch.setattr(engine, "psi_owner_budget", spent + 512)
    code, details = _refused(_stream, fed, [_hello(session_id, bins=1024)])
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "([limits] psi_owner_budget)" in details
    assert work == [] and engine.psi_blinded["active"] == spent
    monkeypatch.undo()
    ids = engine.data.ids.astype(object)
    ids[5] = ids[2]
    with _ids(fed, passive_1=ids):
        code, details = _refused(_stream, fed, [_hello(session_id, bins=1024)])
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "PSI: passive-1's own IDs: duplicate ids" in details
    assert engine.psi_blinded["active"] == spent  # our own fault: charged, then refunded


@pytest.mark.parametrize(
    ("case", "problem"),
    [
        ("identity point", "PSI: the active party's hello: the base-OT point S is not a canonical point of"),
        ("short hash key", "PSI: the active party's hash key holds 3 bytes, not 16"),
        ("no salt", "PSI: the active party's salt holds 0 bytes, not 1 to 64"),
        ("no hello", "PSI: the active party's stream does not open with a hello"),
        ("second hello", "PSI: the active party's stream carries a second hello or an empty message"),
        ("short U chunk", "PSI: the active party's U: U chunk 0 holds 64 bytes, not 87040 (1088 rows of 80 bytes)"),
        ("U cut", "PSI: the active party's U: U ended after 0 of 1 chunks"),
        ("no proof", "PSI: the active party's stream holds no proof after U's last chunk"),
        ("short proof", "PSI: the active party's proof: the proof's words hold 3 bytes, not 768 (64 x 12)"),
    ],
)
def test_bad_hellos_and_u_streams_are_refused_naming_the_problem(fed, case: str, problem: str) -> None:
    session_id = _session(fed, 6)
    requests = {
        "identity point": [_hello(session_id, base_point=bytes(32))],
        "short hash key": [_hello(session_id, hash_key=b"abc")],
        "no salt": [_hello(session_id, salt=b"")],
        "no hello": [passive_pb2.PsiOprfRequest(u_rows=bytes(64))],
        "second hello": [_hello(session_id), _hello(session_id)],
        "short U chunk": [_hello(session_id), passive_pb2.PsiOprfRequest(u_rows=bytes(64))],
        "U cut": [_hello(session_id)],
        "no proof": [_hello(session_id), passive_pb2.PsiOprfRequest(u_rows=bytes(87040))],
        "short proof": [_hello(session_id), passive_pb2.PsiOprfRequest(u_rows=bytes(87040)),
                        passive_pb2.PsiOprfRequest(proof=passive_pb2.PsiOprfProof(words=b"abc", rows=bytes(5120)))],
    }[case]
    code, details = _refused(_stream, fed, requests)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and problem in details
    assert _engine(fed, "passive-1").session(session_id).psi_permutation is None  # nothing kept
    assert len(fed.operator.align(session_id)) > 0


def test_a_value_list_that_is_not_three_per_id_is_refused_by_the_active_party(fed, monkeypatch) -> None:
    engine = _engine(fed, "passive-2")
    honest = engine.psi_oprf

    def one_short(*args):
        for out in honest(*args):
            if isinstance(out, psi.Chunk):
                cut = out.data[: -oprf.VALUE_BYTES]
                out = psi.Chunk(out.index, out.chunks, len(cut) // oprf.VALUE_BYTES, cut)
            yield out

    monkeypatch.setattr(engine, "psi_oprf", one_short)
    session_id = _session(fed, 7)
    code, details = _refused(fed.operator.align, session_id)
    n = 3 * len(engine.data.ids) - 1
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"PSI: passive-2's reply: {n} values announced, not 3 per ID" in details
    assert _engine(fed, "active").session(session_id).rows is None


def test_psi_finish_refuses_every_bad_list_alike_naming_no_position_and_voids_the_exchange(fed) -> None:
    # Review 15, F2: which positions are padding or share a row is the passive party's secret order, so a padding
    # position, two values of one row, a repeated or an out-of-range position get one refusal (no position named),
    # and each voids the exchange: the next try needs a new exchange, charged again.
    session_id = _session(fed, 8)
    ids = _engine(fed, "active").data.ids
    engine = _engine(fed, "passive-1")
    m = oprf.bins(len(ids))

    def exchange(client: PassiveClient) -> np.ndarray:
        base_ot, salt = oprf.BaseOtSender(), psi.new_salt()
        hashed = oprf.item_hashes(ids, salt)
        hash_key, table = oprf.place(hashed, m)

        receivers = []

        def u_rows(code_seed: bytes, answers: list[bytes]) -> Iterator[bytes]:
            receivers.append(oprf.Receiver(oprf.Bins(table, hashed), *base_ot.keys(answers), code_seed))
            return receivers[-1].u_chunks()

        def prove(challenge: bytes) -> oprf.Proof:
            return receivers[-1].proof(challenge)

        spent = engine.psi_blinded["active"]
        hello = oprf.Hello(session_id, salt, hash_key, m, base_ot.point)
        n = client.psi_oprf(hello, u_rows, prove, lambda n: None, _drop)
        assert engine.psi_blinded["active"] == spent + m and n == 3 * len(engine.data.ids)
        return np.asarray(engine.session(session_id).psi_permutation)  # on disk (spill.Column): read whole

    refusals = set()
    with fed.channel("active", "passive-1") as channel:
        client = PassiveClient("passive-1", channel)
        for bad in ("padding", "one row twice", "repeated", "out of range"):
            for _ in range(20):  # 569 IDs in 1024 bins: most exchanges have an ID with two of its 3 bins equal
                sent_rows = exchange(client)
                padding = np.flatnonzero(sent_rows < 0)
                if padding.size:
                    break
            assert padding.size
            twice = np.flatnonzero(sent_rows == sent_rows[sent_rows >= 0][0])  # the 3 values of the first row sent
            assert len(twice) >= 2
            positions = {
                "padding": [int(padding[0])],
                "one row twice": twice[:2].tolist(),
                "repeated": [int(twice[0])] * 2,
                "out of range": [len(sent_rows)],
            }[bad]
            request = passive_pb2.PsiFinishRequest(session_id=session_id, positions=positions)
            refusals.add(_refused(client.stub.PsiFinish, request))
            assert engine.session(session_id).psi_permutation is None and engine.session(session_id).rows is None
            good = passive_pb2.PsiFinishRequest(session_id=session_id, positions=[int(twice[0])])
            code, details = _refused(client.stub.PsiFinish, good)  # void: even a good list needs a new exchange
            assert code == grpc.StatusCode.FAILED_PRECONDITION and "PsiFinish before PsiExchange" in details
    (code, details), = refusals  # the same status and text for every bad list
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(psi.BAD_POSITIONS)
    assert "the exchange is void" in details and not any(ch.isdigit() for ch in details)
    assert len(fed.operator.align(session_id)) > 0  # a new exchange on the same session aligns


def _drop(values: np.ndarray) -> None:
    """A ``take`` that keeps nothing."""


def test_a_refusal_at_one_passive_party_leaves_nothing_and_the_session_aligns_again(fed) -> None:
    engine = _engine(fed, "passive-2")
    session_id = _session(fed, 9)
    caps = engine.psi_caps
    engine.psi_caps = dataclasses.replace(caps, max_ids=10)
    try:
        code, details = _refused(fed.operator.align, session_id)
    finally:
        engine.psi_caps = caps
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "call to passive-2 failed" in details and "the bins of 10 IDs ([limits] psi_max_ids" in details
    assert all(_engine(fed, p).session(session_id).rows is None for p in ("active", "passive-1", "passive-2"))
    assert len(fed.operator.align(session_id)) > 0


@pytest.mark.parametrize(("party", "fault"), [("active", "duplicate"), ("passive-1", "duplicate"),
                                              ("active", "not a string"), ("passive-1", "not a string")])
def test_bad_own_ids_name_the_party_and_the_rows(fed, party: str, fault: str) -> None:
    session_id = _session(fed, 10)
    ids = _engine(fed, party).data.ids.astype(object)
    if fault == "duplicate":
        ids[5] = ids[2]
        problem = "duplicate ids at rows 2 and 5"
    else:
        ids[3] = 17
        problem = "sample id at row 3 is a int, not a string"
    with _ids(fed, **{party.replace("-", "_"): ids}):
        code, details = _refused(fed.operator.align, session_id)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and f"PSI: {party}'s own IDs: {problem}" in details
    assert len(fed.operator.align(session_id)) > 0  # nothing was aligned: the session aligns once they are fixed


def test_a_passive_party_answering_before_taking_u_is_refused_naming_the_counts(fed, monkeypatch) -> None:
    # Review 15, F6: the active party counts the U chunks it sent; a challenge (and values) before the last would
    # meet a proof and outputs never made. 30,000 IDs make 2 U chunks; the deviating passive party reads none.
    active = np.array([f"id{i}" for i in range(30_000)])
    engine = _engine(fed, "passive-1")
    honest = engine.psi_oprf

    def skips_u(session_id: str, hello: oprf.Hello, steps: Iterator[bytes]):
        replies = honest(session_id, hello, steps)
        yield next(replies)  # its keys; U is never read
        yield os.urandom(oprf.KEY_BYTES)  # a challenge before U is complete, then values
        values = np.frombuffer(os.urandom(oprf.VALUE_BYTES * 3 * len(engine.data.ids)), dtype="S16")
        yield psi.Chunk(0, 1, len(values), values.tobytes())

    monkeypatch.setattr(engine, "psi_oprf", skips_u)
    with _ids(fed, active=active, passive_1=active[: len(engine.data.ids)]):
        session_id = _session(fed, 12)
        assert oprf.row_chunks(oprf.bins(len(active))) == 2
        code, details = _refused(fed.operator.align, session_id)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    # how many chunks the call took before the values came is timing (0 or 1), never both
    assert re.search(r"PSI: passive-1's reply: a challenge before U's last chunk \([01] of 2 sent\)", details)
    assert _engine(fed, "active").session(session_id).rows is None


def test_idle_psi_streams_are_limited_per_owner_for_both_protocols(fed) -> None:
    # Review 15, F5: a stream waits on its caller uncharged; two idle ones are all an owner may hold, so a third
    # (either protocol) is refused at once and the server's threads stay free.
    engine = _engine(fed, "passive-1")
    release = threading.Event()

    def idle() -> Iterator[passive_pb2.PsiOprfRequest]:
        release.wait(30)
        return
        yield

    with fed.channel("active", "passive-1") as channel:
        stub = passive_pb2_grpc.PassiveStub(channel)
        held = [stub.PsiOprfStream(idle(), timeout=30), stub.PsiExchangeStream(idle(), timeout=30)]
        try:
            deadline = time.monotonic() + 5
            while engine._psi_streams.get("active") != PSI_STREAMS_PER_OWNER and time.monotonic() < deadline:
                time.sleep(0.01)
            for call in (stub.PsiOprfStream, stub.PsiExchangeStream):
                code, details = _refused(lambda call=call: list(call(iter([_hello(_session(fed, 13))]), timeout=10)))
                assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert f"PSI: active has {PSI_STREAMS_PER_OWNER} PSI streams open at passive-1" in details
        finally:
            for call in held:
                call.cancel()
            release.set()
    deadline = time.monotonic() + 5
    while engine._psi_streams.get("active") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine._psi_streams["active"] == 0
    assert len(fed.operator.align(_session(fed, 14))) > 0


def test_a_cuckoo_failure_is_a_named_refusal_and_the_session_aligns_again(fed, monkeypatch) -> None:
    session_id = _session(fed, 15)

    def never_settles(candidates: object, m: int, rounds: int = 0, n: int = 0) -> np.ndarray:
        raise oprf.CuckooFailure(f"cuckoo hashing of {n} ids into {m} bins did not settle (injected)")

    monkeypatch.setattr(oprf, "cuckoo", never_settles)
    code, details = _refused(fed.operator.align, session_id)
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "PSI: active could not place its IDs into OPRF bins" in details and "failed 16 times" in details
    monkeypatch.undo()
    assert len(fed.operator.align(session_id)) > 0  # nothing was sent: the session aligns


def test_disjoint_sets_are_an_empty_intersection_naming_every_party(fed) -> None:
    renamed = np.array([f"other-{i}" for i in _engine(fed, "passive-1").data.ids])
    with _ids(fed, passive_1=renamed):
        code, details = _refused(fed.operator.align, _session(fed, 11))
    n_active = len(_engine(fed, "active").data.ids)
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"PSI: no sample ID is common to all of active ({n_active} IDs), passive-1 ({len(renamed)} IDs)" in details


@pytest.mark.parametrize(
    ("fault", "problem"),
    [
        ("identity answer", "base-OT point 0 is not a canonical point of ristretto255"),
        ("short code key", "the code seed holds 3 bytes, not 16"),
        ("answers missing", "639 base-OT points, not 640"),
    ],
)
def test_bad_keys_from_a_passive_party_are_refused_by_the_active_party(fed, monkeypatch, fault: str, problem) -> None:
    engine = _engine(fed, "passive-1")
    honest = engine.psi_oprf

    def tampered(*args):
        for out in honest(*args):
            if isinstance(out, tuple):
                code_key, answers = out
                if fault == "identity answer":
                    answers = [bytes(32), *answers[1:]]
                elif fault == "short code key":
                    code_key = b"abc"
                else:
                    answers = answers[1:]
                out = (code_key, answers)
            yield out

    monkeypatch.setattr(engine, "psi_oprf", tampered)
    session_id = _session(fed, 12)
    code, details = _refused(fed.operator.align, session_id)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and f"PSI: passive-1's reply: {problem}" in details
    assert _engine(fed, "active").session(session_id).rows is None
