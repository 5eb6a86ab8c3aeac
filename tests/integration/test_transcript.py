"""What the active party sees, recorded by the recorder plugin: no plaintext training score or passive logit,
and never the secret key."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.integration.conftest import federation
from vflsec.services import plugins
from vflsec.services.crypto import he

TRAINING_KINDS = {plugins.ENCRYPTED_SCORES, plugins.GRADIENT, plugins.TRAINING_DATA}


def test_active_party_transcript(tmp_path) -> None:
    record = tmp_path / "record"
    spec = {"path": "vflsec.services.plugins:Recorder", "options": {"dir": str(record)}}
    with federation(tmp_path / "fed", dataset="wine", n_passive=2, plugins=[spec]) as fed:
        info = fed.operator.create_session("ckks", batch_size=32, seed=0)
        common = fed.operator.align(info.session_id)
        list(fed.operator.train(info.session_id, common[:96], 1))
        training_done = len((record / "transcript.jsonl").read_text().splitlines())
        fed.operator.predict(info.session_id, common[96:110])
        fed.operator.fetch_model(info.session_id)
        secret = fed.parties["coordinator"].engine.session(info.session_id).backend.secret_key_bytes()

    entries = [json.loads(line) for line in (record / "transcript.jsonl").read_text().splitlines()]
    kinds = [e["kind"] for e in entries]
    training, after = entries[:training_done], entries[training_done:]
    assert {e["kind"] for e in training} == {plugins.PUBLIC_CONTEXT, plugins.SESSION} | TRAINING_KINDS
    # 3 batches: 3 x [[p]], 3 own gradients; nothing of any z_p (the passive shares go to the coordinator).
    training_kinds = [e["kind"] for e in training]
    assert training_kinds.count(plugins.ENCRYPTED_SCORES) == training_kinds.count(plugins.GRADIENT) == 3
    # During training the only plaintext arrays from others are the active party's own gradient blocks
    # (its own training rows are offered to plugins too, as its own data).
    received = [e for e in training if e["source"] != "active"]
    assert {name for e in received for name in e["arrays"]} == {"weights", "bias"}
    assert {e["kind"] for e in training if e["source"] == "active"} == {plugins.TRAINING_DATA}
    # At inference, as in training, the passive parties send their masked shares to the coordinator: none comes here.
    assert [e["kind"] for e in after] == [plugins.RELEASED_SCORES, plugins.RELEASED_MODEL]

    context = (record / f"{kinds.index(plugins.PUBLIC_CONTEXT):06d}.context.0.bin").read_bytes()
    public = he.open_public("ckks", context)
    assert not public.can_decrypt
    blobs = sorted(record.glob("*.bin"))
    assert len(blobs) >= 4  # the context and 3 x [[p]] of training
    # The secret key's polynomial data: a window from its middle must not occur in any received message.
    window = secret[len(secret) // 2 : len(secret) // 2 + 64]
    for path in blobs:
        data = path.read_bytes()
        assert window not in data, path.name
        assert secret[-64:] not in data, path.name
    for path in record.glob("*.ciphertexts.*.bin"):
        ct = public.deserialize(path.read_bytes())
        with pytest.raises(PermissionError):
            public.decrypt(ct)

    released = np.load(record / f"{kinds.index(plugins.RELEASED_SCORES):06d}.npz")
    assert released["scores"].shape == (14, 3) and released["own_features"].shape[0] == 14
    assert entries[kinds.index(plugins.RELEASED_SCORES)]["sample_ids"] == common[96:110]
