"""The "what each party learns" table (docs/protocol.md; README.md summarises it), checked against a live federation.

A federation trains and predicts over real gRPC, mTLS and CKKS while the test watches two parties from the
inside: the coordinator's every decryption (it holds the key, so whatever it decrypts is what it learns) and every
share it is sent (the training forward's and inference's, words of Z_2^64), and every message a passive party
receives from others, in training and in a round of concurrent Predicts. The active
party's side is tests/integration/test_transcript.py; the probes of a deviating party are the other files of this
folder.
The last test keeps the two copies of the table identical and every test they cite in existence.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tenseal as ts

from tests.security.conftest import federation
from vflsec.services.crypto import he, ring_mask
from vflsec.services.engines import active as active_engine
from vflsec.services.engines import passive
from vflsec.services.models import lr
from vflsec.v1 import common_pb2, passive_pb2

ROOT = Path(__file__).resolve().parents[2]
MASK_FLOOR = 2.0**20  # a masked product slot is uniform in ±2^24 around a value |δ·x| <= 64


def test_coordinator_decrypts_only_aggregates_and_passives_see_ciphertexts_and_queries(
    tmp_path, monkeypatch
) -> None:
    decrypted: list[np.ndarray] = []
    both_parts: list[np.ndarray] = []  # the same slots decoded as complex numbers, as a curious key holder may
    true_z_p: dict[tuple[str, int], np.ndarray] = {}  # every passive z_p of training, in plaintext (at its owner)
    true_z_a: list[np.ndarray] = []  # the active party's own logits X_a W_aᵀ + b of each training step, in order
    deltas: list[he.EncryptedMatrix] = []
    block_sum_replies: list[np.ndarray] = []

    decrypt, decrypt_complex = he.CkksBackend._decrypt, he.CkksBackend.decrypt_complex

    def watched_decrypt(self, ct):  # type: ignore[no-untyped-def]
        decrypted.append(decrypt(self, ct))
        both_parts.append(decrypt_complex(self, ct))
        return decrypted[-1]

    def watched_complex(self, ct):  # type: ignore[no-untyped-def]  # masked products: two feature groups each
        both_parts.append(decrypt_complex(self, ct))
        decrypted.append(both_parts[-1].real)
        return both_parts[-1]

    monkeypatch.setattr(he.CkksBackend, "_decrypt", watched_decrypt)
    monkeypatch.setattr(he.CkksBackend, "decrypt_complex", watched_complex)

    backward, family_call = passive.PassiveParty.backward, passive.PassiveParty.family_call

    def watched_family_call(self, session_id, caller, name, **payload):  # type: ignore[no-untyped-def]
        if name == "share_training_logits":  # the next step's z_p, under the block before it
            s = self.session(session_id)
            x = self.data.X[s.rows[payload["sample_index"]]]
            true_z_p[self.party_id, payload["step"]] = x @ s.trainer.weights.T
        return family_call(self, session_id, caller, name, **payload)

    owner_share = ring_mask.owner_share

    def watched_owner_share(values, masks):  # type: ignore[no-untyped-def]
        true_z_a.append(np.array(values))
        return owner_share(values, masks)

    monkeypatch.setattr(ring_mask, "owner_share", watched_owner_share)

    def watched_backward(self, session_id, step, sample_index, delta, digest):  # type: ignore[no-untyped-def]
        deltas.append(delta)
        return backward(self, session_id, step, sample_index, delta, digest)

    monkeypatch.setattr(passive.PassiveParty, "family_call", watched_family_call)
    monkeypatch.setattr(passive.PassiveParty, "backward", watched_backward)

    # At inference a passive party is asked for shares: every such request passive-1 receives (its engine's input,
    # as its ShareLogitsBatch servicer decoded it), and every query id the coordinator admitted.
    received: list[list[tuple[str, list[int]]]] = []
    share_batch = passive.PassiveParty.share_logits_batch

    def watched_share_batch(self, session_id, queries):  # type: ignore[no-untyped-def]
        if self.party_id == "passive-1":
            received.append([(query_id, index.tolist()) for query_id, index in queries])
        return share_batch(self, session_id, queries)

    monkeypatch.setattr(passive.PassiveParty, "share_logits_batch", watched_share_batch)

    with federation(tmp_path / "fed", dataset="wine", n_passive=2) as fed:
        for name in ("passive-1", "passive-2"):
            link = fed.parties[name].engine.coordinator
            original = link.block_sums

            def watched_sums(*args, _original=original, **kwargs):  # type: ignore[no-untyped-def]
                block_sum_replies.append(_original(*args, **kwargs))
                return block_sum_replies[-1]

            link.block_sums = watched_sums
        coordinator = fed.parties["coordinator"].engine
        submit, stored = coordinator.submit_shares, []  # a Predict's round (ShareLogitsBatch -> SubmitShares)

        def watched_submit(session_id, caller, shares):  # type: ignore[no-untyped-def]
            stored.extend(share for _, _, share in shares)
            return submit(session_id, caller, shares)

        coordinator.submit_shares = watched_submit
        admit, admitted = coordinator.admit_queries, []

        def watched_admit(session_id, queries):  # type: ignore[no-untyped-def]
            outcomes = admit(session_id, queries)
            admitted.extend(query_id for query_id, _ in outcomes)
            return outcomes

        coordinator.admit_queries = watched_admit
        # The training forward: each passive share (SubmitTrainingShare) and the owner's (ComputeTrainingScores).
        key_holder_call, owner_scores = coordinator.family_call, coordinator.training_scores
        training_shares: dict[tuple[str, int], bytes] = {}
        own_shares: list[tuple[int, bytes]] = []

        def watched_key_holder_call(session_id, caller, name, **payload):  # type: ignore[no-untyped-def]
            if name == "submit_training_share":
                training_shares[caller, payload["step"]] = payload["share"]
            return key_holder_call(session_id, caller, name, **payload)

        def watched_scores(session_id, step, share, *args):  # type: ignore[no-untyped-def]
            own_shares.append((step, share))
            return owner_scores(session_id, step, share, *args)

        coordinator.family_call, coordinator.training_scores = watched_key_holder_call, watched_scores
        info = fed.operator.create_session("ckks", seed=0)
        common = fed.operator.align(info.session_id)
        list(fed.operator.train(info.session_id, common[:120], 2))
        n_training = len(decrypted)
        queried = common[120:140]
        released = fed.operator.predict(info.session_id, queried).scores
        n_stored = len(stored)
        # A round of three concurrent requests, one row in two of them (the round closes once all three have joined).
        active = fed.parties["active"].engine
        monkeypatch.setattr(active_engine, "PREDICT_BATCH_REQUESTS", 3)
        monkeypatch.setattr(active, "predict_window", 60.0)
        monkeypatch.setattr(active, "_batchers", {})
        round_ids = [common[140:142], common[142:145], common[140:141]]
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda ids: fed.operator.predict(info.session_id, ids), round_ids))

        # The true aggregate and each passive share of the queried rows, from the parties' own state.
        sid = info.session_id
        s_a = active.session(sid)
        index = np.array([s_a.index_of[i] for i in queried])
        round_rows = sorted([int(s_a.index_of[i]) for i in ids] for ids in round_ids)
        own = active.data.X[s_a.rows[index]] @ s_a.trainer.weights.T + s_a.trainer.bias
        inference_shares = []
        for name in ("passive-1", "passive-2"):
            engine = fed.parties[name].engine
            s_p = engine.session(sid)
            inference_shares.append(engine.data.X[s_p.rows[index]] @ s_p.trainer.weights.T)

    # Coordinator, training: the forward decrypts nothing (no logit is ever decrypted); what it decrypts are the
    # masked products of the block sums, masked in both parts of a complex slot (the imaginary parts carry [[δ]]'s
    # noise times the party's values otherwise).
    training = decrypted[:n_training]
    assert training and all(np.median(np.abs(v)) > MASK_FLOOR for v in training)
    imaginary = [c.imag for c in both_parts[:n_training]]
    assert all(np.median(np.abs(i)) > MASK_FLOOR for i in imaginary)
    # ...and it is sent z_p + r_p by each passive party and z_a − Σ r_p by the owner: each share alone is a one-time
    # pad (words far from the value it carries), their sum in Z_2^64 is z = z_a + Σ z_p, what it learns by design.
    steps = [step for step, _ in own_shares]
    assert steps == list(range(1, len(true_z_a) + 1)) and len(steps) >= 4
    assert set(training_shares) == set(true_z_p) == {(p, s) for p in ("passive-1", "passive-2") for s in steps}
    for (step, owners), z_a in zip(own_shares, true_z_a, strict=True):
        words = [ring_mask.from_bytes(owners, z_a.shape, "share")]
        z = z_a.copy()
        for party in ("passive-1", "passive-2"):
            z_p = true_z_p[party, step]
            words.append(ring_mask.from_bytes(training_shares[party, step], z_p.shape, "share"))
            assert np.median(np.abs(ring_mask.decode(words[-1]) - z_p)) > 2.0**30
            z += z_p
        assert np.median(np.abs(ring_mask.decode(words[0]) - z_a)) > 2.0**30
        np.testing.assert_allclose(ring_mask.open_sum(words, ring_mask.SCORE_BOUND), z, atol=1e-6)

    # Coordinator, inference: it decrypts nothing; each share it stores is masked words, and the scores it releases
    # are those of the aggregate z of the admitted rows.
    z = own + sum(inference_shares)
    assert len(decrypted) == n_training
    assert n_stored == 2
    for words, share in zip(stored[:n_stored], inference_shares, strict=True):
        seen = ring_mask.decode(ring_mask.from_bytes(words, share.shape, "share"))
        assert np.median(np.abs(seen - share)) > 2.0**30
    np.testing.assert_allclose(released, lr.confidence_scores(z), atol=1e-6)

    # Passive parties: δ arrives encrypted; block sums arrive masked (the party alone can unmask its gradient).
    assert deltas and all(isinstance(ct, ts.CKKSVector) for d in deltas for ct in d.ciphertexts)
    assert block_sum_replies and all(np.median(np.abs(r)) > MASK_FLOOR for r in block_sum_replies)

    # Passive parties, inference: each query's id (the coordinator's) and rows (common indices) in the clear, the
    # round's size and which rows two of its queries share; the request carries nothing else, no score or share.
    assert [len(request) for request in received] == [1, 3]
    assert received[0][0][1] == index.tolist()
    assert sorted(rows for _, rows in received[1]) == round_rows
    assert [query_id for request in received for query_id, _ in request] == admitted
    asked = [row for _, rows in received[1] for row in rows]
    assert len(asked) - len(set(asked)) == 1  # the row in two requests of the round: it reads which one
    assert {f.name for f in passive_pb2.ShareLogitsBatchRequest.DESCRIPTOR.fields} == {"session_id", "queries"}
    assert {f.name for f in common_pb2.QueryRows.DESCRIPTOR.fields} == {"query_id", "sample_index"}
    rows = _table(ROOT / "docs" / "protocol.md").splitlines()
    passive_row = next(line for line in rows if line.startswith("| passive party |"))
    assert "at inference, each query's id and rows" in passive_row.split("|")[2]


def _table(path: Path, marker: str = "what-each-party-learns") -> str:
    text = path.read_text()
    match = re.search(rf"<!-- {marker} -->\n(.*?)<!-- /{marker} -->", text, re.S)
    assert match, f"{path} has no marked {marker!r} table"
    return match.group(1).strip()


def _parties(table: str) -> list[str]:
    """The first cell of every row below the header."""
    return [line.strip("|").split("|")[0].strip() for line in table.splitlines()[2:]]


def test_the_table_cites_tests_that_exist_and_the_readme_summarises_every_party() -> None:
    full, summary = _table(ROOT / "docs" / "protocol.md"), _table(ROOT / "README.md", "party-summary")
    for table in (full, summary):
        assert len({line.count("|") for line in table.splitlines()}) == 1, "a cell breaks the table's columns"
    assert _parties(summary) == _parties(full), "the README's summary must have one row per party of the full table"
    cited = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", full + summary)
    assert len(cited) >= 10
    for path, name in cited:
        source = (ROOT / path).read_text()
        assert re.search(rf"^def {name}\(", source, re.M), f"{path}::{name} is cited but does not exist"
    assert "what-each-party-learns -->" not in (ROOT / "README.md").read_text()  # one full table, in the docs
