"""Batched serving under a deviating owner (review 13): AdmitQueries, ShareLogitsBatch -> SubmitShares and
ReleaseScoresBatch.

Every test plays the active party (or a passive one) against a live federation: real gRPC on loopback with mTLS, CKKS
training, PSI alignment, `refuse_training_ids` and the score chain `gaussian:epsilon=1`. The first tests guard review
13's findings (each failed on the code it reviewed); the others the properties it found holding. Nothing here is
timed: a wait on an event is a guard against a hang, never a measure of speed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pytest

from tests.security.conftest import Federation, federation
from vflsec.services.common import BATCH_ENTRIES, CHUNK_VALUES, QUERY_ID_CHARS
from vflsec.services.config import load_config
from vflsec.services.crypto import ring_mask
from vflsec.services.defenses.release import ParamReleaseChain, ScoreReleaseChain
from vflsec.services.engines import checkpoint, coordinator
from vflsec.services.engines import passive as passive_engine
from vflsec.services.engines.coordinator import MAX_OPEN_QUERIES
from vflsec.services.errors import PermissionDenied
from vflsec.services.models import lr
from vflsec.services.transport.tensors import from_tensor
from vflsec.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc, passive_pb2, passive_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
TRAIN = slice(0, 128)
OK = 0
CODE = {c: c.value[0] for c in grpc.StatusCode}
HANG = 60.0  # seconds before a wait that should end at once is called a hang


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Federation, str, list[str]]]:
    policy = {"query_budget": 2_000, "refuse_training_ids": True}
    with federation(
        tmp_path_factory.mktemp("batched"), n_passive=2, query_policy=policy, score_release=["gaussian:epsilon=1"]
    ) as f:
        info = f.operator.create_session("ckks", batch_size=64, seed=0)
        common = sorted(f.operator.align(info.session_id))
        list(f.operator.train(info.session_id, common[TRAIN], 1))
        yield f, info.session_id, common


def _stubs(f: Federation):
    c = coordinator_pb2_grpc.CoordinatorStub(f.channel("active", "coordinator"))
    p = [passive_pb2_grpc.PassiveStub(f.channel("active", name)) for name in ("passive-1", "passive-2")]
    return c, p


def _index(f: Federation, sid: str, ids: list[str]) -> list[int]:
    s = f.parties["active"].engine.session(sid)
    return [int(s.index_of[i]) for i in ids]


def _aligned(f: Federation, sid: str) -> int:
    return len(f.parties["active"].engine.session(sid).rows)


def _own_share(f: Federation, sid: str, query_id: str, index: list[int]) -> bytes:
    """The owner's honest share of ``index`` for ``query_id`` (its block minus every passive mask), computed here."""
    a = f.parties["active"].engine
    s = a.session(sid)
    rows = np.asarray(index, np.int64)
    own = ring_mask.encode(s.trainer.inference_share(a.data.X[s.rows[rows]]))
    for key in s.share_mask_keys.values():
        own -= ring_mask.share_mask(key, sid, s.step, query_id, rows, s.trainer.share_width)
    return ring_mask.to_bytes(own)


def _expected(f: Federation, sid: str, index: list[int]) -> np.ndarray:
    a = f.parties["active"].engine
    s_a = a.session(sid)
    rows = np.asarray(index)
    z = a.data.X[s_a.rows[rows]] @ s_a.trainer.weights.T + s_a.trainer.bias
    for party in ("passive-1", "passive-2"):
        p = f.parties[party].engine
        s_p = p.session(sid)
        z = z + p.data.X[s_p.rows[rows]] @ s_p.trainer.weights.T
    return lr.confidence_scores(z)


def _admit_request(sid: str, entries: list[list[int]]) -> coordinator_pb2.AdmitQueriesRequest:
    return coordinator_pb2.AdmitQueriesRequest(
        session_id=sid, queries=[common_pb2.QueryRows(sample_index=e) for e in entries]
    )


def _admit(c, sid: str, entries: list[list[int]]):
    return c.AdmitQueries(_admit_request(sid, entries)).queries


def _share_request(sid: str, entries: list[tuple[str, list[int]]]) -> passive_pb2.ShareLogitsBatchRequest:
    return passive_pb2.ShareLogitsBatchRequest(
        session_id=sid, queries=[common_pb2.QueryRows(query_id=q, sample_index=i) for q, i in entries]
    )


def _share(passives, sid: str, entries: list[tuple[str, list[int]]]) -> list[list[common_pb2.EntryStatus]]:
    return [list(p.ShareLogitsBatch(_share_request(sid, entries)).status) for p in passives]


def _release_request(sid: str, entries: list[tuple[str, list[int], bytes]]) -> coordinator_pb2.ReleaseBatchRequest:
    return coordinator_pb2.ReleaseBatchRequest(
        session_id=sid, queries=[common_pb2.QueryShare(query_id=q, sample_index=i, share=b) for q, i, b in entries]
    )


def _release(c, sid: str, entries: list[tuple[str, list[int], bytes]]):
    return c.ReleaseScoresBatch(_release_request(sid, entries)).released


def _refused(call, field: str) -> str:
    """``call()``'s INVALID_ARGUMENT, which must name ``field``; its message."""
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()[:200]
    assert field in err.value.details()
    return err.value.details()


# ------------------------------------------------------------------------------------------------ review 13's findings


def test_an_admission_checks_its_rows_without_holding_other_sessions(fed, monkeypatch) -> None:
    """F1: while one session's admission is inside its per-entry checks (here held there on purpose), another
    session's admission runs to its end: the row checks hold only their own session's lock, and the lock over every
    owner's count is taken for the budget's arithmetic alone. Before, the whole loop ran under that lock, so an owner's
    free refusals (training rows spend nothing) stalled every session's admission."""
    f, sid, common = fed
    engine = f.parties["coordinator"].engine
    other = f.operator.create_session("ckks", batch_size=64, seed=3)
    other_common = sorted(f.operator.align(other.session_id))
    list(f.operator.train(other.session_id, other_common[TRAIN], 1))
    trained = np.asarray(_index(f, sid, common[TRAIN][:1]), np.int64)
    row = np.asarray(_index(f, other.session_id, other_common[340:341]), np.int64)
    trained_rows = engine.session(sid).trained_index
    inside, let_go = threading.Event(), threading.Event()
    members = trained_rows.members

    def held_inside(index):  # type: ignore[no-untyped-def]
        inside.set()
        let_go.wait(HANG)
        return members(index)

    monkeypatch.setattr(trained_rows, "members", held_inside)
    spent = engine.scored.get("active", 0)
    outcomes: dict[str, list] = {}
    other_done = threading.Event()

    def admit(name: str, session_id: str, entry: np.ndarray, done: threading.Event | None = None) -> None:
        outcomes[name] = engine.admit_queries(session_id, [entry])
        if done is not None:
            done.set()

    first = threading.Thread(target=admit, args=("first", sid, trained))
    second = threading.Thread(target=admit, args=("second", other.session_id, row, other_done))
    first.start()
    try:
        assert inside.wait(HANG), "the first admission never reached its row checks"
        second.start()
        admitted_meanwhile = other_done.wait(HANG)
    finally:
        let_go.set()
        first.join(HANG)
        if second.ident is not None:  # started
            second.join(HANG)
    assert admitted_meanwhile, "another session's admission waited for this session's row checks"
    assert isinstance(outcomes["first"][0], PermissionDenied)  # a training row: refused, spent nothing
    assert outcomes["second"][0][1] == spent + 1


def test_share_logits_batch_is_bounded_before_any_share_is_made(fed, monkeypatch) -> None:
    """F2: a row may be in many entries, so a passive party bounds a ShareLogitsBatch call as a whole before it
    gathers a row: at most BATCH_ENTRIES entries and max(aligned rows, one round's CHUNK_VALUES) rows in all, else
    INVALID_ARGUMENT naming queries. Before, 120 entries of every aligned row made it mask and send 58,440 row shares
    for query ids nobody admitted."""
    f, sid, _ = fed
    _, passives = _stubs(f)
    aligned = _aligned(f, sid)
    bound = max(aligned, CHUNK_VALUES)
    computed: list[int] = []
    masked = passive_engine.PassiveParty._masked_shares

    def counted(self, session_id, s, x, queries):  # type: ignore[no-untyped-def]
        computed.append(len(x))
        return masked(self, session_id, s, x, queries)

    monkeypatch.setattr(passive_engine.PassiveParty, "_masked_shares", counted)
    every = list(range(aligned))
    full, rest = divmod(bound, aligned)
    at_bound = [(f"invented-{k}", every) for k in range(full)] + [("invented-rest", every[:rest])]
    assert rest > 0 and len(at_bound) <= BATCH_ENTRIES  # the test's premise: below, only the rows exceed the bound
    over = [*at_bound[:-1], (at_bound[-1][0], every[: len(at_bound[-1][1]) + 1])]
    message = _refused(lambda: passives[0].ShareLogitsBatch(_share_request(sid, over)), "queries")
    assert f"{bound + 1} rows" in message
    too_many = [(f"invented-{k}", [k]) for k in range(BATCH_ENTRIES + 1)]
    _refused(lambda: passives[0].ShareLogitsBatch(_share_request(sid, too_many)), "queries")
    assert computed == []  # refused before a row was gathered or masked
    # At the bound the call is served (one honest round's worth); the coordinator refuses every invented query.
    (statuses,) = _share(passives[:1], sid, at_bound)
    assert sum(computed) == bound
    assert {st.code for st in statuses} == {CODE[grpc.StatusCode.FAILED_PRECONDITION]}


def test_every_batched_call_bounds_its_entries(fed) -> None:
    """F3: AdmitQueries, SubmitShares and ReleaseScoresBatch refuse more than BATCH_ENTRIES entries (INVALID_ARGUMENT
    naming the field), spending nothing; a call at the bound admits every entry and lapses none of them. Before,
    276 entries were admitted and charged, the first lapsing within its own call, unreleasable."""
    f, sid, common = fed
    c, _ = _stubs(f)
    engine = f.parties["coordinator"].engine
    (row,) = _index(f, sid, common[298:299])
    spent = engine.scored.get("active", 0)
    _refused(lambda: c.AdmitQueries(_admit_request(sid, [[row]] * (BATCH_ENTRIES + 1))), "queries")
    assert engine.scored.get("active", 0) == spent
    admitted = _admit(c, sid, [[row]] * BATCH_ENTRIES)
    assert BATCH_ENTRIES <= MAX_OPEN_QUERIES
    ids = [q.admitted.query_id for q in admitted if q.status.code == OK]
    assert len(ids) == BATCH_ENTRIES and all(q in engine.session(sid).queries for q in ids)
    assert engine.scored["active"] == spent + BATCH_ENTRIES
    shares = [(q, [row], bytes(16)) for q in ids] + [(ids[0], [row], bytes(16))]
    passive = coordinator_pb2_grpc.CoordinatorStub(f.channel("passive-1", "coordinator"))
    submit = coordinator_pb2.SharesRequest(
        session_id=sid, shares=[common_pb2.QueryShare(query_id=q, sample_index=i, share=b) for q, i, b in shares]
    )
    _refused(lambda: passive.SubmitShares(submit), "shares")
    _refused(lambda: c.ReleaseScoresBatch(_release_request(sid, shares)), "queries")
    assert all(q in engine.session(sid).queries for q in ids)  # nothing taken by the refused calls


def test_admission_refuses_rows_outside_the_alignment_before_spending(fed) -> None:
    """F4: a row index below 0 or at or past the aligned rows is INVALID_ARGUMENT naming sample_index at admission,
    batched or not, and spends nothing (the owner ran the alignment, so the refusal tells it nothing: rule 4); a
    well-formed batch-mate is admitted. Before, such rows were admitted and charged and only a passive party refused
    them later."""
    f, sid, common = fed
    c, _ = _stubs(f)
    engine = f.parties["coordinator"].engine
    aligned = _aligned(f, sid)
    (row,) = _index(f, sid, common[299:300])
    spent = engine.scored.get("active", 0)
    for outside in (-5, aligned, 10**12):
        request = coordinator_pb2.AdmitQueryRequest(session_id=sid, sample_index=[row, outside])
        _refused(lambda request=request: c.AdmitQuery(request), "sample_index")
    admitted = _admit(c, sid, [[-5], [aligned], [10**12], [row]])
    assert [q.status.code for q in admitted] == [CODE[grpc.StatusCode.INVALID_ARGUMENT]] * 3 + [OK]
    assert all("sample_index" in q.status.message for q in admitted[:3])
    assert engine.scored["active"] == spent + 1


def test_the_owner_share_is_written_once() -> None:
    """F6: the owner's masked inference share has one implementation (ActiveParty._own_shares), used by a round and by
    a request run alone; before, each wrote its own."""
    source = (ROOT / "services" / "engines" / "active.py").read_text()
    assert source.count("ring_mask.share_mask(") == 1
    assert source.count("self._own_shares(") == 2


def test_every_rpc_refuses_an_overlong_query_id_without_echoing_it(fed) -> None:
    """A query id longer than QUERY_ID_CHARS is INVALID_ARGUMENT naming query_id on every RPC that takes one, its
    message short. Before, ReleaseScores echoed a 100 KB id into its status, which came back RESOURCE_EXHAUSTED."""
    f, sid, common = fed
    c, passives = _stubs(f)
    rows = _index(f, sid, common[375:377])
    long_id = "y" * 100_000
    share = bytes(8 * len(rows) * f.parties["coordinator"].engine.session(sid).trainer.share_width)  # the right size
    as_passive = coordinator_pb2_grpc.CoordinatorStub(f.channel("passive-1", "coordinator"))
    calls = {
        "ReleaseScores": lambda: c.ReleaseScores(
            coordinator_pb2.ReleaseScoresRequest(session_id=sid, query_id=long_id, share=share, sample_index=rows)
        ),
        "SubmitShare": lambda: as_passive.SubmitShare(
            coordinator_pb2.ShareRequest(session_id=sid, query_id=long_id, share=share, sample_index=rows)
        ),
        "ShareLogits": lambda: passives[0].ShareLogits(
            passive_pb2.ShareLogitsRequest(session_id=sid, query_id=long_id, sample_index=rows)
        ),
    }
    for name, call in calls.items():
        message = _refused(call, "query_id")
        assert len(message) < 200, name
    (q,) = (x.admitted.query_id for x in _admit(c, sid, [rows]))
    assert len(q) <= QUERY_ID_CHARS
    entries = [(long_id, rows), ("z" * (QUERY_ID_CHARS + 1), rows), (q, rows)]
    for statuses in _share(passives, sid, entries):
        assert [s.code for s in statuses] == [CODE[grpc.StatusCode.INVALID_ARGUMENT]] * 2 + [OK]
        assert all("query_id" in s.message and len(s.message) < 200 for s in statuses[:2])
    submit = coordinator_pb2.SharesRequest(
        session_id=sid, shares=[common_pb2.QueryShare(query_id=long_id, sample_index=rows, share=share)]
    )
    (status,) = as_passive.SubmitShares(submit).status
    assert status.code == CODE[grpc.StatusCode.INVALID_ARGUMENT] and "query_id" in status.message
    released = _release(c, sid, [(long_id, rows, share), (q, rows, _own_share(f, sid, q, rows))])
    assert [r.status.code for r in released] == [CODE[grpc.StatusCode.INVALID_ARGUMENT], OK]
    assert f.operator.predict(sid, common[380:382]).scores.shape == (2, 2)  # still serving


# ------------------------------------------------------------------------------------------------ what held


def test_each_entry_is_charged_and_checked_alone(fed, monkeypatch) -> None:
    """Duplicates in an entry, training rows, the same row in many entries, the budget's end within a call: each entry
    on its own; the call's total charge is exactly the admitted rows."""
    f, sid, common = fed
    c, _ = _stubs(f)
    engine = f.parties["coordinator"].engine
    held = _index(f, sid, common[310:320])
    trained = _index(f, sid, common[TRAIN][:2])
    spent = engine.scored.get("active", 0)
    entries = [[held[0], held[0]], trained, *([[held[1]]] * 5), held[2:5]]
    admitted = _admit(c, sid, entries)
    codes = [q.status.code for q in admitted]
    assert codes[0] == CODE[grpc.StatusCode.INVALID_ARGUMENT]
    assert codes[1] == CODE[grpc.StatusCode.PERMISSION_DENIED]
    assert codes[2:] == [OK] * 6
    assert engine.scored["active"] == spent + 5 + 3  # the same row in five entries: five queries, five charges
    # Three samples of budget left: an entry past them is refused while the entries before and after it that fit
    # are admitted, in order.
    monkeypatch.setattr(engine, "policy", replace(engine.policy, budget=engine.scored["active"] + 3))
    admitted = _admit(c, sid, [[held[5]], held[6:9], held[6:8]])
    assert [q.status.code for q in admitted] == [OK, CODE[grpc.StatusCode.RESOURCE_EXHAUSTED], OK]
    assert engine.scored["active"] == spent + 8 + 3


def test_release_only_what_was_admitted_and_shared(fed) -> None:
    """Release an entry never admitted, one admitted for other rows, one before its shares, twice, and a passive
    share for rows of another query: each refused in its place; an honest mate released."""
    f, sid, common = fed
    c, passives = _stubs(f)
    held = _index(f, sid, common[330:340])
    q1, q2 = (q.admitted.query_id for q in _admit(c, sid, [held[0:3], held[3:6]]))
    for statuses in _share(passives, sid, [(q1, held[0:3]), (q1, held[3:6]), ("invented", held[6:8])]):
        assert [s.code for s in statuses] == [OK] + [CODE[grpc.StatusCode.FAILED_PRECONDITION]] * 2
    released = _release(
        c,
        sid,
        [
            ("never-admitted", held[0:3], _own_share(f, sid, q1, held[0:3])),
            (q1, held[3:6], _own_share(f, sid, q1, held[3:6])),  # q2's rows under q1
            (q2, held[3:6], _own_share(f, sid, q2, held[3:6])),  # q2 admitted, never shared
            (q1, held[0:3], _own_share(f, sid, q1, held[0:3])),  # honest
            (q1, held[0:3], _own_share(f, sid, q1, held[0:3])),  # twice
        ],
    )
    codes = [r.status.code for r in released]
    assert codes == [CODE[grpc.StatusCode.FAILED_PRECONDITION]] * 3 + [OK, CODE[grpc.StatusCode.FAILED_PRECONDITION]]
    scores = from_tensor(released[3].scores.scores, "scores", shape=(3, 2))
    assert np.abs(scores - _expected(f, sid, held[0:3])).max() > 1e-3  # gaussian:epsilon=1 on every score


def test_noise_is_fresh_per_entry_and_a_crafted_mate_is_clipped_alone(fed) -> None:
    """One row in eight entries of one ReleaseScoresBatch: eight independent Gaussian draws (no shared noise to
    difference away); a mate with a crafted own share is scored (clipped), not refused."""
    f, sid, common = fed
    c, passives = _stubs(f)
    row = _index(f, sid, common[350:351])
    ids = [q.admitted.query_id for q in _admit(c, sid, [row] * 9)]
    for statuses in _share(passives, sid, [(q, row) for q in ids]):
        assert all(s.code == OK for s in statuses)
    entries = [(q, row, _own_share(f, sid, q, row)) for q in ids[:8]]
    crafted = np.full((1, 1), np.uint64(2**62), dtype=np.uint64)
    entries.append((ids[8], row, ring_mask.to_bytes(crafted)))
    released = _release(c, sid, entries)
    assert all(r.status.code == OK for r in released)
    draws = np.array([from_tensor(r.scores.scores, "s", shape=(1, 2))[0] for r in released[:8]])
    noise = draws - _expected(f, sid, row)[0]
    assert len({tuple(np.round(n, 12)) for n in noise}) == 8  # no two entries share a draw
    assert np.std(noise[1:, 0] - noise[0, 0]) > 0.1  # differences of independent N(0, 0.48²) draws


def test_release_waits_for_a_durable_charge_and_a_restart_releases_nothing(fed, monkeypatch) -> None:
    """The ledger write held back: the release runs only once the ledger on disk holds the query's charge. A
    coordinator restarted between admission and release knows no open query: nothing is released uncharged."""
    f, sid, common = fed
    c, passives = _stubs(f)
    engine = f.parties["coordinator"].engine
    events: list[tuple[str, int]] = []
    save = engine.ledger.save

    def late_save(owner, count):  # type: ignore[no-untyped-def]
        time.sleep(0.5)  # widens the window in which a release that did not wait would run first
        save(owner, count)
        events.append(("durable", count))

    monkeypatch.setattr(engine.ledger, "save", late_save)
    chain = engine.score_chain

    class Watched:
        def __call__(self, raw, z, context):  # type: ignore[no-untyped-def]
            events.append(("released", engine.scored.get("active", 0)))
            return chain(raw, z, context)

        def describe(self):  # type: ignore[no-untyped-def]
            return chain.describe()

    monkeypatch.setattr(engine, "score_chain", Watched())
    row = _index(f, sid, common[360:362])
    (admitted,) = _admit(c, sid, [row])
    query, spent = admitted.admitted.query_id, admitted.admitted.scored
    for statuses in _share(passives, sid, [(query, row)]):
        assert statuses[0].code == OK
    (released,) = _release(c, sid, [(query, row, _own_share(f, sid, query, row))])
    assert released.status.code == OK
    first_release = events.index(next(e for e in events if e[0] == "released"))
    assert any(kind == "durable" and n >= spent for kind, n in events[:first_release]), events
    on_disk = checkpoint.CountLedger(f.layout.workdir / "coordinator" / "state" / "owners").load_all()
    assert on_disk["active"] >= spent

    monkeypatch.setattr(engine.ledger, "save", save)
    row = _index(f, sid, common[362:364])
    (admitted,) = _admit(c, sid, [row])
    query = admitted.admitted.query_id
    state = checkpoint.StateDir(f.layout.workdir / "coordinator" / "state")
    schema = load_config(f.layout.configs["coordinator"]).schema
    restarted = coordinator.Coordinator(ScoreReleaseChain(), ParamReleaseChain(), {}, state=state, schema=schema)
    (outcome,) = restarted.release_batch(sid, [(query, np.asarray(row), _own_share(f, sid, query, row))])
    assert "no open query" in str(outcome)


def test_malformed_entries_get_statuses_and_the_service_keeps_running(fed) -> None:
    f, sid, common = fed
    c, passives = _stubs(f)
    held = _index(f, sid, common[370:374])
    # Empty calls answer no entries; an empty entry is INVALID_ARGUMENT naming sample_index.
    assert list(_admit(c, sid, [])) == []
    assert _share(passives, sid, []) == [[], []]
    assert list(_release(c, sid, [])) == []
    (empty,) = _admit(c, sid, [[]])
    assert empty.status.code == CODE[grpc.StatusCode.INVALID_ARGUMENT] and "sample_index" in empty.status.message
    (q,) = (x.admitted.query_id for x in _admit(c, sid, [held[:2]]))
    (released,) = _release(c, sid, [(q, held[:2], b"\0" * 3)])
    assert released.status.code == CODE[grpc.StatusCode.INVALID_ARGUMENT]
    assert "share holds 3 bytes" in released.status.message
    assert f.operator.predict(sid, common[382:384]).scores.shape == (2, 2)
