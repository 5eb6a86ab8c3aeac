"""A party whose one session cannot be restored still starts (review 8b M3): a passive party's drop=binary session
whose kept K the operator removed when switching to drop=random, a coordinator's session whose key file is lost, are
set aside, their files kept, and a call on them says why; every other session restores."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vflsec.services.crypto import he
from vflsec.services.data.datasets import PartyData
from vflsec.services.defenses.release import ParamReleaseChain, ScoreReleaseChain
from vflsec.services.engines.checkpoint import StateDir
from vflsec.services.engines.coordinator import Coordinator
from vflsec.services.engines.passive import PassiveParty
from vflsec.services.errors import FailedPrecondition


class _Coordinator:
    """The one call JoinSession makes to the coordinator: a plain session opened by "active"."""

    def public_context(self, session_id: str) -> tuple[str, bytes, str]:
        return "plain", he.make_keyholder("plain").public_context(), "active"


def _party(state: Path, spec: str) -> PassiveParty:
    rng = np.random.default_rng(0)
    x = np.column_stack([(rng.random(300) < 0.3).astype(np.float64), rng.normal(size=(300, 3))])  # one binary column
    data = PartyData(np.array([f"r{i}" for i in range(300)]), x, ["flag", "c1", "c2", "c3"])
    return PassiveParty(
        "passive-1", data, _Coordinator(), StateDir(state), allowed_backends=("plain",), embedding_release=[spec]
    )


def _join(party: PassiveParty, session_id: str) -> None:
    party.join(session_id, "plain", 2, {"topology": "active-top", "party": 1}, "active", "splitnn")


def test_a_session_whose_kept_basis_was_removed_is_set_aside_and_the_party_starts(tmp_path: Path, caplog) -> None:
    state = tmp_path / "state"
    _join(_party(state, "masquerade:m=4"), "binary")  # drop=binary (the default): its Q needs K
    _join(_party(state, "masquerade:m=4,drop=random"), "random")
    (state / "secrets" / "masquerade_basis.npy").unlink()  # the operator deems K no longer needed
    with caplog.at_level("ERROR"):
        party = _party(state, "masquerade:m=4,drop=random")
    assert list(party.sessions) == ["random"] and party.session("random").owner == "active"
    assert "session 'binary' not restored: binary.npz: restoring it failed: ValueError: masquerade drop=binary " in (
        caplog.text
    )
    assert (state / "binary.npz").exists() and len(list(state.glob("binary.*.fixed"))) == 1  # nothing lost
    with pytest.raises(FailedPrecondition, match=r"session 'binary' has a checkpoint .*drop=binary needs K"):
        party.owned("binary", "active", closing=True)
    assert list(_party(state, "masquerade:m=4").sessions) == ["binary", "random"]  # K back: both restore


def test_a_coordinator_session_missing_its_key_file_is_set_aside_with_its_epoch_keys(tmp_path: Path) -> None:
    def coordinator() -> Coordinator:
        chains = ScoreReleaseChain.from_specs(()), ParamReleaseChain.from_specs(())
        return Coordinator(*chains, {}, state=StateDir(tmp_path), allowed_backends=("plain",))

    first = coordinator()
    for sid in ("s1", "s2", "s3"):
        first.open_session(sid, "plain", 2, ["passive-1"], owner="active")
    (tmp_path / "s1.bin").unlink()  # the session's key file, lost
    kept = sorted(p.name for p in (tmp_path / "epochs").glob("s1.*"))
    assert kept
    with np.load(tmp_path / "s3.npz") as data:  # as written before training-key epochs
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(bytes(arrays["__meta__"]).decode())
    del meta["epochs"]
    np.savez(tmp_path / "s3.npz", **{**arrays, "__meta__": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)})
    restarted = coordinator()
    assert list(restarted.sessions) == ["s2"] and restarted.session("s2").owner == "active"
    with pytest.raises(FailedPrecondition, match=r"'s3' has .*failed: ValueError: its checkpoint predates"):
        restarted.session("s3")
    assert sorted(p.name for p in (tmp_path / "epochs").glob("s1.*")) == kept  # not dropped as orphans
    with pytest.raises(FailedPrecondition, match=r"'s1' has a checkpoint .*s1\.npz: restoring it failed: FileNotFound"):
        restarted.owned("s1", "active", closing=True)
