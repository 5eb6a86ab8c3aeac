"""Review 20: a deviating active party's crafted [[δ]] (LR) must be refused on its form alone, never by an error that
depends on the passive party's features (rule 4).

Probe: the SEAL evaluator path (he.CkksBackend.masked_sum) skips a plaintext that encodes to zero and multiplies the
others with SEAL's multiply_plain, which raises "result ciphertext is transparent" for a ciphertext whose second
polynomial is zero. With such a chunk in [[δ]], Backward failed (INTERNAL, SEAL's message) when passive-1's features
on the chunk's rows were nonzero and succeeded when they were all zero: the active party read "are these rows' passive
features all zero?" from the outcome. Now the passive party checks δ's form (2 polynomials, none of them zero, [[p]]'s
level and scale) before it multiplies anything, and refuses whatever its features are.

Review 24: the same for a δ of honest form beyond the masked range: the key holder clips, never refuses.
"""

from __future__ import annotations

import types

import grpc
import numpy as np
import pytest
import tenseal.sealapi as sealapi

from tests.security.conftest import federation
from vflsec.services.crypto import he
from vflsec.services.models.lr import trainers as lr_trainers


def _transparent_first(backend: he.Backend, em: he.EncryptedMatrix) -> he.WireMatrix:
    """δ's wire form with its first ciphertext replaced by a transparent one (c1 = 0) of the same level and scale."""
    wire = he.matrix_to_wire(backend, em)
    raw = em.ciphertexts[0].ciphertext()[0]
    crafted = sealapi.Ciphertext(backend._ctx.data.seal_context(), raw.parms_id())
    crafted.resize(2)
    crafted.scale = raw.scale
    blob = he._vector_message(he._seal_bytes(crafted), backend.size(em.ciphertexts[0]), raw.scale)
    return he.WireMatrix(wire.shape, wire.replicas, wire.rows_per_ct, [blob, *wire.ciphertexts[1:]])


def _loud(backend: he.Backend, em: he.EncryptedMatrix) -> he.WireMatrix:
    """δ of honest form, 2^25 on every row: a passive party's product slot 2^25·x + m leaves the masked range
    (2^24 + 65) exactly where its x is nonzero (review 24, F3)."""
    loud = he.encrypt_matrix(backend, np.full(em.shape, 2.0**25), em.replicas, form=he.LOWERED)
    return he.matrix_to_wire(backend, loud)


def _outcome(tmp_path, monkeypatch, zero_features: bool, craft=_transparent_first) -> tuple[str, str]:
    crafted_he = types.SimpleNamespace(**{name: getattr(he, name) for name in dir(he) if not name.startswith("__")})
    crafted_he.matrix_to_wire = craft
    monkeypatch.setattr(lr_trainers, "he", crafted_he)  # the active party's δ, as it sends it
    with federation(tmp_path, dataset="breast_cancer", n_passive=1, passive_features=2) as fed:
        passive = fed.parties["passive-1"].engine
        if zero_features:  # passive-1's data on the batch's rows: all zero
            features = passive._features
            monkeypatch.setattr(passive, "_features", lambda s, index: np.zeros_like(features(s, index)))
        sid = fed.operator.create_session("ckks", batch_size=64, seed=0).session_id
        common = fed.operator.align(sid)
        try:
            list(fed.operator.train(sid, common[:64], 1))
        except grpc.RpcError as exc:
            return exc.code().name, exc.details()
        return "OK", ""


@pytest.mark.long
def test_a_transparent_delta_is_refused_whatever_the_passive_features(tmp_path, monkeypatch) -> None:
    nonzero = _outcome(tmp_path / "nonzero", monkeypatch, zero_features=False)
    monkeypatch.undo()
    zero = _outcome(tmp_path / "zero", monkeypatch, zero_features=True)
    assert nonzero == zero  # the active party cannot tell the two apart
    assert nonzero[0] == "INVALID_ARGUMENT" and "delta: ciphertext 0 has a zero second polynomial" in nonzero[1]


def test_a_delta_beyond_the_masked_range_fails_nothing_whatever_the_passive_features(tmp_path, monkeypatch) -> None:
    """Review 24, F3: the key holder refused a product with a slot beyond the masked range, and the owner saw the
    refusal as a failed Backward: with δ = 2^25 it read whether passive-1's x was nonzero. Slots are clipped now."""
    nonzero = _outcome(tmp_path / "nonzero", monkeypatch, zero_features=False, craft=_loud)
    monkeypatch.undo()
    zero = _outcome(tmp_path / "zero", monkeypatch, zero_features=True, craft=_loud)
    assert nonzero == zero == ("OK", "")
