"""A passive party whose one session cannot be restored under today's configuration still starts (review 8b M3): a
drop=binary session whose kept K the operator removed when switching to drop=random is set aside, its files kept,
and a call on it says why; the session joined under drop=random restores."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vflsec.services.crypto import he
from vflsec.services.data.datasets import PartyData
from vflsec.services.engines.checkpoint import StateDir
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
    party.join(session_id, "plain", 2, {"topology": "active-top", "party": 1}, "active", bytes(32), "splitnn")


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
