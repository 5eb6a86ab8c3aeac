"""The engines' one session table, and the model-family registry they reach LR through."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from vflsec.services.engines.checkpoint import StateDir
from vflsec.services.engines.sessions import RowSet, SessionTable
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


@dataclass
class Aligned:
    """A session with an O(rows) array set once (``rows``) beside per-step state (``step``)."""

    FIXED_STATE = ("rows",)
    owner: str
    rows: np.ndarray
    step: int = 0

    def to_state(self) -> tuple[dict[str, np.ndarray], dict]:
        return {"rows": self.rows, "step": np.array([self.step])}, {"owner": self.owner}


def aligned_table(path: Path) -> SessionTable[Aligned]:
    def restore(sid: str, arrays: dict[str, np.ndarray], meta: dict) -> Aligned:
        return Aligned(meta["owner"], np.array(arrays["rows"]), int(arrays["step"][0]))

    return SessionTable(StateDir(path), restore)


def test_arrays_set_once_are_written_once_and_restored_with_every_step(tmp_path: Path) -> None:
    t = aligned_table(tmp_path)
    s = Aligned("active", np.arange(100_000))
    with t.lock:
        t.add("s1", s)
    (companion,) = tmp_path.glob("*.fixed")
    stamp = companion.stat().st_mtime_ns
    for step in range(1, 4):
        s.step = step
        t.save("s1", s)
    assert list(tmp_path.glob("*.fixed")) == [companion] and companion.stat().st_mtime_ns == stamp
    assert (tmp_path / "s1.npz").stat().st_size < 10_000  # the step's checkpoint no longer carries the rows

    restored = aligned_table(tmp_path).get("s1")
    assert restored.step == 3 and np.array_equal(restored.rows, np.arange(100_000))

    s.rows = np.arange(5)  # a new object (e.g. a re-alignment after a failed one): a new companion, the old gone
    t.save("s1", s)
    (replaced,) = tmp_path.glob("*.fixed")
    assert replaced != companion and np.array_equal(aligned_table(tmp_path).get("s1").rows, np.arange(5))
    t.close("s1")
    assert not list(tmp_path.iterdir())


def test_a_companion_no_checkpoint_names_is_dropped_at_start(tmp_path: Path) -> None:
    t = aligned_table(tmp_path)
    with t.lock:
        t.add("s1", Aligned("active", np.arange(10)))
    orphan = tmp_path / "s1.0123456789abcdef.fixed"  # a kill between a companion's write and its checkpoint's
    orphan.write_bytes(b"partial")
    assert aligned_table(tmp_path).get("s1").rows.size == 10 and not orphan.exists()


def test_row_set_is_a_bitmap_of_seen_rows_and_reads_old_checkpoints() -> None:
    rows = RowSet([5, 1], limit=100)
    rows.update(np.array([1, 70]), limit=100)
    assert len(rows) == 3 and 70 in rows and 2 not in rows and 10**9 not in rows
    assert rows.array().tolist() == [1, 5, 70]
    assert rows.members(np.array([0, 1, 70, 71, 10**9])).tolist() == [False, True, True, False, False]
    assert RowSet.restore({"seen_bits": rows.packed()}, "seen").array().tolist() == [1, 5, 70]
    assert RowSet.restore({"seen": np.array([3, 4])}, "seen").array().tolist() == [3, 4]  # before the bitmap
    assert len(RowSet.restore({}, "seen")) == 0
    with pytest.raises(ValueError, match="negative"):
        rows.update([-1], limit=100)


def _two_aligned_sessions(path: Path) -> dict[str, Path]:
    t = aligned_table(path)
    with t.lock:
        t.add("s1", Aligned("active", np.arange(10)))
        t.add("s2", Aligned("active", np.arange(20)))
    return {p.name.split(".")[0]: p for p in path.glob("*.fixed")}


def test_a_missing_companion_skips_its_session_only_and_keeps_its_files(tmp_path: Path, caplog) -> None:
    companions = _two_aligned_sessions(tmp_path)
    companions["s1"].unlink()
    with caplog.at_level("ERROR"):
        t = aligned_table(tmp_path)
    assert "s1" not in t and t.get("s2").rows.size == 20  # every other session is restored
    assert "session 's1' not restored: s1.npz" in caplog.text and companions["s1"].name in caplog.text
    assert (tmp_path / "s1.npz").exists() and companions["s2"].exists()
    with t.lock, pytest.raises(FailedPrecondition, match="'s1' has a checkpoint this party could not restore"):
        t.check_absent("s1")  # not overwritten by a new session of the same ID
    with pytest.raises(FailedPrecondition, match=r"'s1' has a checkpoint this party could not restore \(s1\.npz: "):
        t.owned("s1", "active", closing=True)  # a call on it says why, not "unknown session"


def test_a_session_whose_restore_raises_is_set_aside_and_every_other_restored(tmp_path: Path, caplog) -> None:
    t = table(tmp_path)
    with t.lock:
        t.add("s1", Toy("active", 1))
        t.add("s2", Toy("active", 2))

    def restore(sid: str, arrays: dict, meta: dict) -> Toy:
        if sid == "s1":  # e.g. a secret its defense needs was removed since it was checkpointed
            raise ValueError("masquerade drop=binary needs K")
        return Toy(meta["owner"], int(arrays["value"][0]))

    with caplog.at_level("ERROR"):
        restarted = SessionTable(StateDir(tmp_path), restore)
    assert "s1" not in restarted and restarted.get("s2") == Toy("active", 2) and len(restarted) == 1
    why = "s1.npz: restoring it failed: ValueError: masquerade drop=binary needs K"
    assert restarted.state.unreadable == {"s1": why}
    assert f"session 's1' not restored: {why} (its files stay in {tmp_path})" in caplog.text
    assert (tmp_path / "s1.npz").exists()  # nothing recorded is lost
    for call in (lambda: restarted.get("s1"), lambda: restarted.owned("s1", "active", closing=True)):
        with pytest.raises(FailedPrecondition, match=f"'s1' has a checkpoint this party could not restore \\({why}\\)"):
            call()
    with restarted.lock, pytest.raises(FailedPrecondition, match="the operator repairs or removes it first"):
        restarted.check_absent("s1")
    assert table(tmp_path).get("s1") == Toy("active", 1)  # once repaired, it restores as it was


def test_a_companion_name_that_is_not_the_sessions_own_is_refused(tmp_path: Path) -> None:
    companions = _two_aligned_sessions(tmp_path)
    for named in (companions["s2"].name, f"../{companions['s1'].name}", "/etc/passwd"):
        np.savez(
            tmp_path / "s1.npz",
            step=np.array([0]),
            __meta__=np.frombuffer(b'{"owner": "active"}', dtype=np.uint8),
            __fixed__=np.frombuffer(named.encode(), dtype=np.uint8),
        )
        t = aligned_table(tmp_path)
        assert "s1" not in t and "not a companion of its own" in t.state.unreadable["s1"]
        assert t.get("s2").rows.size == 20 and companions["s2"].exists()
        with pytest.raises(ValueError, match=r"checkpoint 's1' cannot be read: s1\.npz: it names"):
            StateDir(tmp_path).load_all()  # a ledger skips nothing


def test_a_session_id_leaves_room_for_its_files_suffixes(tmp_path: Path) -> None:
    longest = "s" * 100
    SessionTable.check_new(longest)
    t = aligned_table(tmp_path)
    with t.lock:
        t.add(longest, Aligned("active", np.arange(4)))  # with its companion ".<16 hex>.fixed"
    t.state.save_bytes(f"{longest}.e123456", b"keys")  # a training-key epoch's file
    assert aligned_table(tmp_path).get(longest).rows.size == 4
    with pytest.raises(InvalidArgument, match="invalid session_id"):
        SessionTable.check_new("s" * 101)
