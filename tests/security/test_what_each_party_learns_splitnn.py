"""The split-NN rows of the "what each party learns" table (coordinator-top under CKKS), against a live federation.

The test watches the coordinator's every decryption (whatever it decrypts is what it learns) and what a passive
party receives, as tests/security/test_what_each_party_learns.py does for LR.
"""

from __future__ import annotations

import numpy as np

from tests.security.conftest import federation
from vflsec.services.crypto import he
from vflsec.services.engines import passive
from vflsec.services.models.splitnn import steps


def test_coordinator_decrypts_only_the_sum_of_embeddings(tmp_path, monkeypatch) -> None:
    decrypted: list[np.ndarray] = []
    outputs: list[tuple[int, np.ndarray]] = []  # (id of the bottom, its training output), in call order
    feedback: list[object] = []
    decrypt, forward, backward = he.CkksBackend._decrypt, steps.Bottom.forward, passive.PassiveParty.backward

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
        slots = fed.parties["coordinator"].engine.session(info.session_id).backend.slots

    per_party = {party: [out for owner, out in outputs if owner == ident] for party, ident in bottoms.items()}
    assert [len(v) for v in per_party.values()] == [3, 3, 3]  # 3 batches of 40
    assert len(decrypted) == 3  # one ciphertext of 40 x 8 per step: the key holder opens nothing else
    for i, ciphertext in enumerate(decrypted):
        total = sum(per_party[party][i] for party in per_party)
        opened = he.MatrixLayout.for_matrix(total.shape, 1, slots).unpack([ciphertext])
        np.testing.assert_allclose(opened, total, atol=1e-4)  # the sum h of the batch ...
        for party in ("passive-1", "passive-2"):
            assert np.abs(opened - per_party[party][i]).max() > 1e-2  # ... never one party's h_p
    # Passive parties: each step's feedback is ∂L/∂h in the clear (batch x E), the same for every party.
    assert len(feedback) == 6 and all(isinstance(f, np.ndarray) and f.shape == (40, 8) for f in feedback)
    np.testing.assert_array_equal(feedback[0], feedback[1])
