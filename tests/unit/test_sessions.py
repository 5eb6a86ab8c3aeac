"""The engines' one session table, and the model-family registry they reach LR through."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from vflsec.services.engines.checkpoint import StateDir
from vflsec.services.engines.sessions import SessionTable
from vflsec.services.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from vflsec.services.models import family


@dataclass
class Toy:
    owner: str
    value: int
    refused: str | None = None

    def to_state(self) -> tuple[dict[str, np.ndarray], dict]:
        return {"value": np.array([self.value])}, {"owner": self.owner}


def table(path: Path | None) -> SessionTable[Toy]:
    return SessionTable(
        StateDir(path),
        lambda sid, arrays, meta: Toy(meta["owner"], int(arrays["value"][0])),
        refusal=lambda sid, s: s.refused,
        duplicate="already joined",
    )


def test_a_session_is_saved_restored_owned_and_closed(tmp_path: Path) -> None:
    t = table(tmp_path)
    with t.lock:
        t.check_absent("s1")
        t.add("s1", Toy("active", 1))
    with pytest.raises(AlreadyExists, match="session 's1' already joined"):
        t.check_absent("s1")
    t["s1"].value = 7
    t.save("s1", t["s1"])

    restored = table(tmp_path)  # a restarted engine
    assert restored.get("s1") == Toy("active", 7) and len(restored) == 1 and "s1" in restored
    assert restored.owned("s1", "active").value == 7
    with pytest.raises(PermissionDenied, match="other does not own session 's1'"):
        restored.owned("s1", "other")
    with pytest.raises(NotFound, match="unknown session 's2'"):
        restored.get("s2")

    restored.close("s1")
    assert not table(tmp_path) and not restored


def test_a_refused_session_can_only_be_closed() -> None:
    t = table(None)
    with t.lock:
        t.add("s", Toy("active", 1, refused="the policy changed"))
    with pytest.raises(FailedPrecondition, match="the policy changed"):
        t.owned("s", "active")
    assert t.owned("s", "active", closing=True).value == 1


def test_session_ids_name_files_so_they_are_checked() -> None:
    with pytest.raises(InvalidArgument, match=r"invalid session_id '\.\./x'"):
        SessionTable.check_new("../x")


def test_families_are_found_by_name() -> None:
    lr = family.get()
    assert lr.name == family.DEFAULT == "lr" and family.get("lr") is lr
    assert lr.new_key_holder(2, ["p"], lr.settings({})).share_width == 1
    assert lr.new_key_holder(5, ["p"], lr.settings({})).share_width == 5
    assert family.get("splitnn").name == "splitnn"
    assert lr.block_width(4, active=True) == 5 and lr.block_width(4, active=False) == 4
    assert family.get("tree").name == "tree" and family.get("forest").name == "forest"
    with pytest.raises(ValueError, match="unknown model family 'gbdt'"):
        family.get("gbdt")
