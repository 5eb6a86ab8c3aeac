"""The coordinator's query-budget ledger (checkpoint.CountLedger): durable when ``save`` returns, one slot rewritten in
place per save, and a crash in a save leaves the last durable count readable."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from vflsec.services.engines import checkpoint
from vflsec.services.engines.checkpoint import CountLedger, StateDir

PAGE = CountLedger.PAGE


def _slot_bytes(file: Path, slot: int) -> bytes:
    return file.read_bytes()[slot * PAGE : slot * PAGE + 32]


def test_counts_survive_a_restart_and_each_save_writes_the_other_slot(tmp_path: Path) -> None:
    ledger = CountLedger(tmp_path)
    assert ledger.load_all() == {}
    ledger.save("active", 10)
    file = tmp_path / "active.count"
    assert file.stat().st_size == 2 * PAGE and stat.S_IMODE(file.stat().st_mode) == 0o600
    first = _slot_bytes(file, 0)
    ledger.save("active", 25)
    assert _slot_bytes(file, 0) == first  # the durable count's slot is not touched by the next save
    ledger.save("active", 31)
    assert _slot_bytes(file, 0) != first
    ledger.save("other", 4)
    assert CountLedger(tmp_path).load_all() == {"active": 31, "other": 4}
    restarted = CountLedger(tmp_path)
    restarted.load_all()
    restarted.save("active", 40)  # a restarted ledger goes on from the latest slot
    assert CountLedger(tmp_path).load_all()["active"] == 40


def test_a_save_is_flushed_to_disk_before_it_returns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = CountLedger(tmp_path)
    ledger.save("active", 1)  # the file is created through StateDir's atomic write (its own fsyncs)
    events: list[str] = []
    pwrite, fdatasync = os.pwrite, os.fdatasync

    def recorded_pwrite(fd: int, data: bytes, offset: int) -> int:
        events.append("write")
        return pwrite(fd, data, offset)

    def recorded_fdatasync(fd: int) -> None:
        fdatasync(fd)
        events.append(f"flushed {os.readlink(f'/proc/self/fd/{fd}')}")

    monkeypatch.setattr(checkpoint.os, "pwrite", recorded_pwrite)
    monkeypatch.setattr(checkpoint.os, "fdatasync", recorded_fdatasync)
    ledger.save("active", 2)
    events.append("returned")
    assert events == ["write", f"flushed {tmp_path / 'active.count'}", "returned"]


def test_a_torn_write_leaves_the_last_durable_count(tmp_path: Path) -> None:
    ledger = CountLedger(tmp_path)
    for count in (5, 9, 12):  # slots: 0 holds 12 (sequence 3), 1 holds 9
        ledger.save("active", count)
    file = tmp_path / "active.count"
    with file.open("r+b") as fh:  # a crash in the next save (12 -> 20) tore its slot, 1
        fh.seek(PAGE + 10)
        fh.write(b"\xff\x00\xff")
    assert CountLedger(tmp_path).load_all() == {"active": 12}
    with file.open("r+b") as fh:  # slot 0 spoiled too (a damaged disk, not a crash)
        fh.seek(20)
        fh.write(b"\x01")
    with pytest.raises(ValueError, match=r"active\.count has no readable count"):
        CountLedger(tmp_path).load_all()  # refused, never read as zero


def test_a_failed_flush_is_retried_in_the_same_slot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = CountLedger(tmp_path)
    ledger.save("active", 5)
    ledger.save("active", 7)  # slot 1, the durable count
    durable = _slot_bytes(tmp_path / "active.count", 1)

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(checkpoint.os, "fdatasync", failing)
    with pytest.raises(OSError):
        ledger.save("active", 8)  # wrote slot 0; not known to be on disk
    monkeypatch.undo()
    ledger.save("active", 9)
    assert _slot_bytes(tmp_path / "active.count", 1) == durable  # the retry did not overwrite the durable slot
    assert CountLedger(tmp_path).load_all() == {"active": 9}


def test_a_file_of_the_wrong_size_is_refused(tmp_path: Path) -> None:
    (tmp_path / "active.count").write_bytes(b"\x00" * 100)
    with pytest.raises(ValueError, match=r"active\.count holds 100 bytes"):
        CountLedger(tmp_path).load_all()


def test_an_earlier_npz_ledger_is_taken_over(tmp_path: Path) -> None:
    StateDir(tmp_path).save("active", {}, {"scored": 42})
    StateDir(tmp_path).save("other", {}, {"scored": 3})
    ledger = CountLedger(tmp_path)
    ledger.save("other", 8)  # both files for one owner (a crash during a take-over): the larger count
    assert CountLedger(tmp_path).load_all() == {"active": 42, "other": 8}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["active.count", "active.npz", "other.count", "other.npz"]
    assert CountLedger(tmp_path).load_all() == {"active": 42, "other": 8}


def test_a_release_before_the_count_files_refuses_to_start_on_them(tmp_path: Path) -> None:
    """Review 19: the earlier release reads its ledger from owners/<owner>.npz only (StateDir.load_all, unchanged), so
    after the take-over a rollback restarted every owner's budget from zero. The npz files now hold a marker it
    refuses, for owners taken over and for new ones alike."""
    StateDir(tmp_path).save("active", {}, {"scored": 9000})
    ledger = CountLedger(tmp_path)
    assert ledger.load_all() == {"active": 9000}
    ledger.save("active", 9500)
    ledger.save("new-owner", 3)
    with pytest.raises(ValueError, match=r"cannot be read: active\.npz: it names .moved to <owner>\.count"):
        StateDir(tmp_path).load_all()  # the earlier release's ledger load
    (tmp_path / "active.npz").unlink()
    with pytest.raises(ValueError, match=r"new-owner\.npz: it names .moved to <owner>\.count"):
        StateDir(tmp_path).load_all()
    (tmp_path / "new-owner.npz").unlink()  # a kill between a new file and its marker: the next start puts it back
    assert CountLedger(tmp_path).load_all() == {"active": 9500, "new-owner": 3}
    assert sorted(p.name for p in tmp_path.glob("*.npz")) == ["active.npz", "new-owner.npz"]


def test_without_a_folder_nothing_is_written_and_a_bad_owner_is_refused(tmp_path: Path) -> None:
    memory = CountLedger(None)
    memory.save("active", 3)
    assert memory.load_all() == {}
    with pytest.raises(ValueError, match="invalid ledger owner"):
        CountLedger(tmp_path).save("../x", 1)


def test_a_short_write_is_an_error_not_a_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 19: pwrite's count was not read, so a write of part of the slot returned as durable, and a restart read
    the previous count."""
    ledger = CountLedger(tmp_path)
    ledger.save("active", 100)
    ledger.save("active", 200)
    pwrite = os.pwrite
    monkeypatch.setattr(checkpoint.os, "pwrite", lambda fd, data, offset: pwrite(fd, data[:20], offset))
    with pytest.raises(OSError, match="short write"):
        ledger.save("active", 300)
    monkeypatch.undo()
    ledger.save("active", 300)  # the same slot again
    assert CountLedger(tmp_path).load_all() == {"active": 300}


def test_a_save_never_writes_the_slot_holding_the_latest_count(tmp_path: Path) -> None:
    """Review 19: the slot was chosen by the sequence number's parity, so a file whose latest count sits in the other
    slot (copied, restored, edited) had that count overwritten: a torn write then went back to the older one."""
    ledger = CountLedger(tmp_path)
    image = ledger._slot(3, 30) + bytes(PAGE - 32) + ledger._slot(2, 20) + bytes(PAGE - 32)
    (tmp_path / "active.count").write_bytes(image[PAGE:] + image[:PAGE])  # seq 3 in slot 1, seq 2 in slot 0
    restarted = CountLedger(tmp_path)
    assert restarted.load_all() == {"active": 30}
    restarted.save("active", 40)
    assert _slot_bytes(tmp_path / "active.count", 1) == ledger._slot(3, 30)  # the latest stays until 40 is durable
    assert CountLedger(tmp_path).load_all() == {"active": 40}
