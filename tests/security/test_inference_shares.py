"""Review finding 2: the coordinator holds W_p after training, so a passive party's inference share
z_p = X_p W_pᵀ alone would give it X_p whenever d_p <= k. Each share carries a zero-sum mask in Z_2^64 under the
passive party's own key (services/crypto/ring_mask.py): the coordinator plays the attack on every share it stores and
learns nothing, while the scores it releases are those of the unmasked model; inference decrypts nothing."""

from __future__ import annotations

import numpy as np

from tests.security.conftest import federation
from vflsec.services.crypto import entropy, he, ring_mask
from vflsec.services.engines.active import ActiveSession
from vflsec.services.engines.passive import PassiveSession
from vflsec.services.models import lr


def test_coordinator_cannot_solve_features_from_a_stored_share(tmp_path, monkeypatch) -> None:
    decrypted: list[np.ndarray] = []
    decrypt = he.CkksBackend._decrypt

    def watched_decrypt(self, ct):  # type: ignore[no-untyped-def]
        decrypted.append(decrypt(self, ct))
        return decrypted[-1]

    # wine: k = 3 logits; passive-1 holds d_p = 3 columns, so W_p (3 x 3) is invertible and z_p gives X_p.
    with federation(tmp_path / "fed", dataset="wine", n_passive=1, passive_features=3) as fed:
        coordinator = fed.parties["coordinator"].engine
        stored: list[tuple[str, np.ndarray, bytes]] = []
        submit = coordinator.submit_shares  # a Predict's round (ShareLogitsBatch -> SubmitShares)

        def watched_submit(session_id, caller, shares):  # type: ignore[no-untyped-def]
            stored.extend((caller, sample_index.copy(), share) for _, sample_index, share in shares)
            return submit(session_id, caller, shares)

        coordinator.submit_shares = watched_submit
        info = fed.operator.create_session("ckks", seed=0)
        sid = info.session_id
        common = fed.operator.align(sid)
        list(fed.operator.train(sid, common[:100], 2))
        queried = common[100:150]
        monkeypatch.setattr(he.CkksBackend, "_decrypt", watched_decrypt)
        released = fed.operator.predict(sid, queried).scores
        monkeypatch.undo()

        active, passive = fed.parties["active"].engine, fed.parties["passive-1"].engine
        s_a, s_p = active.session(sid), passive.session(sid)
        index = np.array([s_a.index_of[i] for i in queried])
        x_p = passive.data.X[s_p.rows[index]]
        true_share = x_p @ s_p.trainer.weights.T
        z = active.data.X[s_a.rows[index]] @ s_a.trainer.weights.T + s_a.trainer.bias + true_share
        w_p = coordinator.session(sid).passive_weights["passive-1"]

        # Restarts: both parties' checkpoints carry the same share-mask key.
        (arrays_a, meta_a), (arrays_p, meta_p) = active.state.load_all()[sid], passive.state.load_all()[sid]
        restored_a = ActiveSession.from_state(sid, arrays_a, meta_a, [str(i) for i in active.data.ids])
        restored_p = PassiveSession.from_state(arrays_p, meta_p)
        assert restored_a.share_mask_keys == {"passive-1": restored_p.share_mask_key} == s_a.share_mask_keys
        assert len(restored_p.share_mask_key) == 32

        # A mask the owner does not cancel (here: the owner's key replaced) is not refused (a refusal on the decrypted
        # sum would be an oracle of the passive value, rule 4): the sum is clipped and scored, noise to the owner.
        s_a.share_mask_keys["passive-1"] = entropy.new_key()
        noise = fed.operator.predict(sid, common[150:160]).scores
        assert noise.shape == (10, 3) and np.isfinite(noise).all()

    assert w_p.shape == (3, 3) and np.linalg.cond(w_p) < 1e6
    # The attack works on an unmasked share: X_p = z_p W_p^{-T} to ~1e-9.
    np.testing.assert_allclose(np.linalg.solve(w_p, true_share.T).T, x_p, atol=1e-6)

    assert [(caller, rows.tolist()) for caller, rows, _ in stored[:1]] == [("passive-1", index.tolist())]
    masked = ring_mask.decode(ring_mask.from_bytes(stored[0][2], true_share.shape, "share"))
    assert np.median(np.abs(masked - true_share)) > 2.0**30  # uniform words: values of order 2^39
    recovered = np.linalg.solve(w_p, masked.T).T
    assert np.median(np.abs(recovered - x_p)) > 1e3  # features are min-max scaled to [0, 1]
    assert abs(np.corrcoef(masked.ravel(), true_share.ravel())[0, 1]) < 0.3

    assert decrypted == []  # predicting decrypted nothing: the shares were summed in Z_2^64
    # Released scores are the unmasked model's (no release chain is configured), to the 2^-24 fixed point.
    np.testing.assert_allclose(released, lr.confidence_scores(z), rtol=0, atol=1e-6)
