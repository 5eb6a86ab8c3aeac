"""The split-NN rows of the "what each party learns" table (coordinator-top under CKKS), against a live federation.

The test watches every embedding share the coordinator sums and its every decryption (what it opens is what it
learns), and what a passive party receives, as tests/security/test_what_each_party_learns.py does for LR.
"""

from __future__ import annotations

import numpy as np

from tests.security.conftest import federation
from vflsec.services.crypto import he, ring_mask
from vflsec.services.engines import passive
from vflsec.services.models.splitnn import roles, steps


def test_coordinator_sees_each_embedding_share_masked_and_only_their_sum(tmp_path, monkeypatch) -> None:
    decrypted: list[np.ndarray] = []
    summed: list[list[np.ndarray]] = []  # every step's shares as the coordinator sums them, the owner's first
    outputs: list[tuple[int, np.ndarray]] = []  # (id of the bottom, its training output), in call order
    feedback: list[object] = []
    decrypt, forward, backward = he.CkksBackend._decrypt, steps.Bottom.forward, passive.PassiveParty.backward
    open_masked = roles.open_masked

    def watched_sum(shares):  # type: ignore[no-untyped-def]
        summed.append([np.array(share) for share in shares])
        return open_masked(shares)

    def watched_decrypt(self, ct):  # type: ignore[no-untyped-def]
        decrypted.append(decrypt(self, ct))
        return decrypted[-1]

    def watched_forward(self, x, *, train):  # type: ignore[no-untyped-def]
        out = forward(self, x, train=train)
        if train:
            outputs.append((id(self), out))
        return out

    def watched_backward(self, session_id, step, sample_index, delta, digest):  # type: ignore[no-untyped-def]
        feedback.append(delta)
        return backward(self, session_id, step, sample_index, delta, digest)

    monkeypatch.setattr(he.CkksBackend, "_decrypt", watched_decrypt)
    monkeypatch.setattr(roles, "open_masked", watched_sum)  # where the key holder role sums the shares
    monkeypatch.setattr(steps.Bottom, "forward", watched_forward)
    monkeypatch.setattr(passive.PassiveParty, "backward", watched_backward)
    with federation(tmp_path / "fed", dataset="wine", n_passive=2) as fed:
        info = fed.operator.create_session(
            "ckks", family="splitnn", settings={"embedding": 8, "top_hidden": [16]}, batch_size=40, seed=0
        )
        common = fed.operator.align(info.session_id)
        list(fed.operator.train(info.session_id, common[:120], 1))
        bottoms = {
            party: id(fed.parties[party].engine.sessions[info.session_id].trainer.bottom)
            for party in ("active", "passive-1", "passive-2")
        }

    per_party = {party: [out for owner, out in outputs if owner == ident] for party, ident in bottoms.items()}
    assert [len(v) for v in per_party.values()] == [3, 3, 3]  # 3 batches of 40
    assert decrypted == []  # training decrypts nothing: no key functional, no budget spent
    assert len(summed) == 3 and all(len(shares) == 3 for shares in summed)
    for i, shares in enumerate(summed):
        total = sum(per_party[party][i] for party in per_party)
        np.testing.assert_allclose(steps.open_masked(shares), total, atol=2.0**-22)  # the sum h of the batch ...
        for share in shares:  # ... while each share decodes to words unrelated to any party's h_p
            seen = ring_mask.decode(share)
            assert np.abs(seen).mean() > 1e6
            for h_p in (per_party[party][i] for party in per_party):
                assert abs(np.corrcoef(seen.ravel(), h_p.ravel())[0, 1]) < 0.3
    # Passive parties: each step's feedback is ∂L/∂h in the clear (batch x E), the same for every party.
    assert len(feedback) == 6 and all(isinstance(f, np.ndarray) and f.shape == (40, 8) for f in feedback)
    np.testing.assert_array_equal(feedback[0], feedback[1])
