"""services/crypto/spill.py: the secret order on disk keeps every value with its row, is a uniform shuffle, and
leaves no file behind however it ends."""

from __future__ import annotations

import gc
import itertools
import math
import signal
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vflsec.services.crypto import oprf, psi, spill


def _values(rows: np.ndarray) -> np.ndarray:
    return np.array([f"value-{r:09d}".encode() for r in rows], dtype="S16")


@pytest.mark.parametrize(("total", "bucket"), [(0, 8), (1, 8), (1000, 64), (1000, 4096)])
def test_every_value_leaves_once_with_its_row(tmp_path: Path, monkeypatch, total: int, bucket: int) -> None:
    monkeypatch.setattr(spill, "BUCKET_VALUES", bucket)  # several buckets, or one
    rows = np.arange(total, dtype=np.int32)
    with spill.Shuffle(total, 16, tmp_path) as shuffle:
        for a in range(0, total, 97):  # in pieces, as U chunks come
            shuffle.add(rows[a : a + 97], _values(rows[a : a + 97]))
        order = np.asarray(shuffle.seal())
        data = b"".join(shuffle.chunks(100))
        assert all(len(chunk) <= 1600 for chunk in shuffle.chunks(100))
    sent = np.frombuffer(data, dtype="S16")
    assert sorted(order.tolist()) == rows.tolist()  # a permutation of the rows
    assert np.array_equal(sent, _values(order))  # each value at its row's position
    assert list(tmp_path.iterdir()) == []  # closed: nothing left


def test_the_order_is_uniform(tmp_path: Path, monkeypatch) -> None:
    """All 3! orders of 3 values over 2 buckets: each seen about equally often (chi-square, 5 degrees of freedom:
    p < 1e-6 for a statistic over 36)."""
    monkeypatch.setattr(spill, "BUCKET_VALUES", 2)
    counts = dict.fromkeys(itertools.permutations(range(3)), 0)
    trials = 300
    for _ in range(trials):
        with spill.Shuffle(3, 16, tmp_path) as shuffle:
            shuffle.add(np.arange(3, dtype=np.int32), _values(np.arange(3)))
            counts[tuple(np.asarray(shuffle.seal()).tolist())] += 1
    expected = trials / math.factorial(3)
    assert sum((c - expected) ** 2 / expected for c in counts.values()) < 36


def test_files_are_private_and_removed_on_error_and_by_the_collector(tmp_path: Path) -> None:
    shuffle = spill.Shuffle(10, 16, tmp_path)
    assert stat.S_IMODE(shuffle.path.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in shuffle.path.iterdir())
    with pytest.raises(ValueError, match="11 values added, 10 announced"):
        shuffle.add(np.zeros(11, np.int32), _values(np.arange(11)))
    with pytest.raises(ValueError, match="no value before the order is sealed"):
        next(shuffle.chunks(4))
    with pytest.raises(ValueError, match="0 values added, 10 announced"):
        shuffle.seal()
    shuffle.close()
    shuffle.close()  # idempotent
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError), spill.Shuffle(10, 16, tmp_path):  # an error inside: removed on the way out
        raise RuntimeError
    assert list(tmp_path.iterdir()) == []
    forgotten = spill.Shuffle(10, 16, tmp_path)
    forgotten.add(np.zeros(3, np.int32), _values(np.arange(3)))
    del forgotten
    gc.collect()
    assert list(tmp_path.iterdir()) == []


def test_the_oprf_sender_spills_its_values_and_removes_them(tmp_path: Path) -> None:
    """P's values exist on disk, in the party's own directory, between the first U chunk and close()."""
    salt = b"salt"
    hashed = oprf.item_hashes([f"id{i}" for i in range(300)], salt)
    m = oprf.bins(300)
    hash_key, table = oprf.place(hashed, m)
    base_sender, base_receiver = oprf.BaseOtSender(), oprf.BaseOtReceiver()
    answers = base_receiver.answer(base_sender.point)
    seed = bytes(range(16))
    sender = oprf.Sender(hashed, hash_key, m, base_receiver, seed, spill_dir=str(tmp_path))
    receiver = oprf.Receiver(oprf.Bins(table, hashed), *base_sender.keys(answers), seed)
    for chunk in receiver.u_chunks():
        sender.add(chunk)
    (spilled,) = tmp_path.iterdir()
    assert sum(f.stat().st_size for f in spilled.iterdir()) == 3 * 300 * (4 + 16)  # row and value per slot
    sender.verify(receiver.proof(sender.challenge))
    alignment = psi.intersect([receiver.values()], [sender.values()])
    assert sorted(psi.rows_from_positions(alignment.passive_positions[0], sender.rows)) == list(range(300))
    sender.close()
    assert list(tmp_path.iterdir()) == []


_KILLED = """
import os, signal, sys
import numpy as np
from vflsec.services.crypto import spill
folder = spill.Shuffle(10, 16, sys.argv[1]) if sys.argv[2] == "shuffle" else spill.Ranges(4, 16, sys.argv[1])
folder.add(np.arange(4, dtype=np.int32), np.array([b"v" * 16] * 4, dtype="S16"))
print(folder.path.name, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed(tmp_path: Path, kind: str = "shuffle") -> subprocess.CompletedProcess:
    """A process that filled a spill folder of ``kind`` (shuffle / ranges) in tmp_path, then was killed -9."""
    return subprocess.run([sys.executable, "-c", _KILLED, str(tmp_path), kind], capture_output=True, text=True)


def test_a_killed_process_folder_goes_at_the_next_sweep_a_live_one_stays(tmp_path: Path) -> None:
    """Review 19: a kill -9 skipped close() and the collector, and the values stayed on disk for good."""
    killed = _killed(tmp_path)
    assert killed.returncode == -signal.SIGKILL
    left = tmp_path / killed.stdout.strip()
    assert left.is_dir() and any(left.iterdir())
    making = tmp_path / f"{spill._PREFIX}making"  # a shuffle between mkdtemp and its first file: empty, kept
    making.mkdir(mode=0o700)
    with spill.Shuffle(10, 16, tmp_path) as live:  # locked by this process: kept
        live.add(np.arange(2, dtype=np.int32), _values(np.arange(2)))
        assert spill.sweep(tmp_path) == [left.name]
        assert not left.exists() and making.is_dir() and any(live.path.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == [making.name]


def test_a_swapped_folder_is_never_read(tmp_path: Path) -> None:
    """Review 19: files were opened by path, so whoever could rename entries of the parent (a writable, non-sticky
    TMPDIR) could put a folder of its own, with rows of its choosing, in place of ours before the seal."""
    with spill.Shuffle(3, 16, tmp_path) as shuffle:
        shuffle.add(np.arange(3, dtype=np.int32), _values(np.arange(3)))
        ours = shuffle.path
        ours.rename(tmp_path / "moved")
        planted = np.zeros(3, dtype=[("row", "<i4"), ("value", "S16")])
        planted["row"], planted["value"] = 7, b"x" * 16
        ours.mkdir()
        (ours / "bucket-0").write_bytes(planted.tobytes())
        order = np.asarray(shuffle.seal())
        sent = np.frombuffer(b"".join(shuffle.chunks(2)), dtype="S16")
    assert sorted(order.tolist()) == [0, 1, 2] and np.array_equal(sent, _values(order))
    assert not any((tmp_path / "moved").iterdir())  # ours emptied where it went


def test_a_passive_party_sweeps_its_temporary_folder_at_start(tmp_path: Path, monkeypatch) -> None:
    from vflsec.services.data.datasets import PartyData
    from vflsec.services.engines.passive import PassiveParty

    killed = _killed(tmp_path)
    monkeypatch.setattr(spill.tempfile, "tempdir", str(tmp_path))  # the party's TMPDIR
    assert (tmp_path / killed.stdout.strip()).is_dir()
    PassiveParty("passive-1", PartyData(np.array(["r0"]), np.zeros((1, 1)), ["c"]), None)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_the_active_party_sweeps_a_killed_match_and_keeps_a_live_one(tmp_path: Path, monkeypatch) -> None:
    """A's outputs and the passive values it matches wait on disk too (Ranges, Parts): locked alike, swept alike."""
    from vflsec.services.data.datasets import PartyData
    from vflsec.services.engines.active import ActiveParty

    killed = _killed(tmp_path, "ranges")
    assert killed.returncode == -signal.SIGKILL and any((tmp_path / killed.stdout.strip()).iterdir())
    monkeypatch.setattr(spill.tempfile, "tempdir", str(tmp_path))  # the party's TMPDIR
    with spill.Ranges(2, 16, tmp_path) as live:
        live.add(np.arange(3, dtype=np.int32), _values(np.arange(3)))
        data = PartyData(np.array(["r0"]), np.zeros((1, 1)), ["c"], y=np.zeros(1))
        ActiveParty("active", data, [], None, {"passive-1": None})  # type: ignore[arg-type]
        assert [p.name for p in tmp_path.iterdir()] == [live.path.name]
        tags, values = zip(*(live.part(r) for r in range(2)), strict=True)  # read through the held folder
        order = np.argsort(np.concatenate(tags))
        assert np.array_equal(np.concatenate(values)[order], _values(np.arange(3)))
    assert list(tmp_path.iterdir()) == []


def _random(n: int) -> np.ndarray:
    return np.frombuffer(np.random.default_rng(n).bytes(16 * n), dtype="S16")


@pytest.mark.parametrize("count", [1, 3, 40])
def test_ranges_keep_every_value_with_its_tag_and_cut_by_value(tmp_path: Path, count: int) -> None:
    values = _random(5000)
    with spill.Ranges(count, 16, tmp_path) as ranges:
        for start in range(0, 5000, 777):  # several adds: each range's file appended to
            ranges.add(np.arange(start, min(start + 777, 5000), dtype=np.int32), values[start : start + 777])
        parts = [ranges.part(r) for r in range(count)]
        assert ranges.size == 5000
    tags = np.concatenate([t for t, _ in parts])
    assert sorted(tags.tolist()) == list(range(5000))
    assert all(np.array_equal(values[t], v) for t, v in parts)
    bounds = [(v.view(np.uint8).reshape(-1, 16)[:, :4].copy().view(">u4").ravel()) for _, v in parts]
    for r, prefix in enumerate(bounds):  # range r: first 4 bytes in the r-th slice of [0, 2^32)
        assert ((prefix.astype(np.uint64) * count) >> 32 == r).all()
    assert all(abs(len(p) - 5000 / count) < 6 * math.sqrt(5000 / count) + 1 for p in bounds)  # uniform values
    assert spill.Ranges.count_for(0) == 1 and spill.Ranges.count_for(spill.RANGE_VALUES + 1) == 2


def test_ranges_are_private_and_removed_on_error_and_by_the_collector(tmp_path: Path) -> None:
    ranges = spill.Ranges(4, 16, tmp_path)
    ranges.add(np.arange(10, dtype=np.int32), _random(10))
    assert stat.S_IMODE(ranges.path.stat().st_mode) == 0o700
    assert len(list(ranges.path.iterdir())) == 4
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in ranges.path.iterdir())
    ranges.close()
    ranges.close()  # idempotent
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError), spill.Ranges(4, 16, tmp_path):
        raise RuntimeError
    assert list(tmp_path.iterdir()) == []
    forgotten = spill.Ranges(4, 16, tmp_path)
    forgotten.add(np.arange(3, dtype=np.int32), _random(3))
    del forgotten
    gc.collect()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="0 parts: at least one"):
        spill.Ranges(0, 16, tmp_path)


def test_the_oprf_receiver_keeps_its_outputs_by_range_and_removes_them(tmp_path: Path) -> None:
    """A's outputs and the party's values wait on disk in A's directory; the match removes the party's, close A's,
    and the intersection is the same as matching in memory."""
    salt, seed = b"salt", bytes(range(16))
    mine, theirs = [f"id{i}" for i in range(400)], [f"id{i}" for i in range(100, 700)]
    hashed, own = oprf.item_hashes(mine, salt), oprf.item_hashes(theirs, salt)
    m = oprf.bins(400)
    hash_key, table = oprf.place(hashed, m)
    base_sender, base_receiver = oprf.BaseOtSender(), oprf.BaseOtReceiver()
    answers = base_receiver.answer(base_sender.point)
    sender = oprf.Sender(own, hash_key, m, base_receiver, seed)
    receiver = oprf.Receiver(oprf.Bins(table, hashed), *base_sender.keys(answers), seed, spill_dir=str(tmp_path))
    for chunk in receiver.u_chunks():
        sender.add(chunk)
    sender.verify(receiver.proof(sender.challenge))
    (outputs,) = tmp_path.iterdir()
    assert sum(f.stat().st_size for f in outputs.iterdir()) == 400 * (4 + 16)  # row and output per own ID
    expected = psi.match(receiver.values(), sender.values(), "passive-1")
    match = receiver.match("passive-1")
    for _, _, data in sender.value_chunks():
        match.add(np.frombuffer(data, dtype="S16"))
    assert len(list(tmp_path.iterdir())) == 2  # ours and the party's
    common, positions = match.result()
    assert list(tmp_path.iterdir()) == [outputs]
    assert np.array_equal(common, expected[0]) and np.array_equal(positions, expected[1])
    assert np.flatnonzero(common).tolist() == list(range(100, 400))
    assert sorted(np.asarray(sender.rows)[positions[common]].tolist()) == list(range(300))
    receiver.close()
    sender.close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("per_range", [64, 1 << 18])
def test_uniqueness_by_range_names_the_repeat_and_leaves_nothing(tmp_path: Path, monkeypatch, per_range: int) -> None:
    monkeypatch.setattr(spill, "RANGE_VALUES", per_range)  # many ranges, or one
    values = _random(3000).copy()
    psi.require_unique_by_range(values, "ids", str(tmp_path))  # distinct: no error
    assert list(tmp_path.iterdir()) == []
    values[2345] = values[17]
    with pytest.raises(ValueError, match="duplicate ids at rows 17 and 2345"):
        psi.require_unique_by_range(values, "ids", str(tmp_path))
    assert list(tmp_path.iterdir()) == []  # removed on the error too
    with pytest.raises(ValueError, match="duplicate ids at rows 17 and 2345"):
        psi._require_unique(values, "ids")  # the in-memory check's verdict


@pytest.mark.parametrize(("total", "block"), [(0, 4), (1, 4), (1000, 64), (1000, 4096)])
def test_a_column_reads_back_what_was_added_a_block_at_a_time(tmp_path: Path, total: int, block: int) -> None:
    rows = np.random.default_rng(total).integers(-1, 1 << 30, total).astype(np.int32)
    with spill.Column(np.int32, tmp_path) as column:
        for a in range(0, total, 97):
            column.add(rows[a : a + 97])
        assert stat.S_IMODE(column.path.stat().st_mode) == 0o700
        assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in column.path.iterdir())
        blocks = list(column.blocks(block))
        assert [start for start, _ in blocks] == list(range(0, total, block))
        assert all(len(b) <= block for _, b in blocks)
        assert len(column) == total and np.array_equal(np.concatenate([b for _, b in blocks] or [rows[:0]]), rows)
        assert np.array_equal(np.asarray(column), rows)
    assert list(tmp_path.iterdir()) == []


def test_the_sealed_order_outlives_the_shuffle_while_held_and_goes_when_dropped(tmp_path: Path) -> None:
    shuffle = spill.Shuffle(5, 16, tmp_path)
    shuffle.add(np.arange(5, dtype=np.int32), _values(np.arange(5)))
    order = shuffle.seal()
    shuffle.close()
    assert [p.name.startswith("vflsec-psi-") for p in tmp_path.iterdir()] == [True]  # the order's folder alone
    assert sorted(np.asarray(order).tolist()) == list(range(5))
    del order
    gc.collect()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError), spill.Column(np.int32, tmp_path) as column:  # an error: removed on the way out
        column.add(np.arange(3, dtype=np.int32))
        raise RuntimeError
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("block", [1, 3, 7, 1 << 21])
def test_positions_map_through_an_order_on_disk_as_through_one_in_memory(tmp_path: Path, monkeypatch, block) -> None:
    """psi.rows_from_positions reads a spilled order block by block: the same rows, the same refusals."""
    monkeypatch.setattr(spill, "COLUMN_BLOCK", block)
    monkeypatch.setattr(psi, "_POSITIONS_BLOCK", 4)
    rng = np.random.default_rng(7)
    order = rng.permutation(np.concatenate([np.arange(20), np.full(10, -1)])).astype(np.int32)  # -1: padding
    real = np.flatnonzero(order >= 0)
    with spill.Column(np.int32, tmp_path) as column:
        column.add(order)
        column.blocks = lambda per_block=block, blocks=column.blocks: blocks(per_block)  # the patched block size
        for positions in (rng.permutation(real)[:13], real[:1], real[:0]):
            expected = psi.rows_from_positions(positions, order)
            assert np.array_equal(psi.rows_from_positions(positions, column), expected)
            consumed = positions.astype(np.int64)
            assert np.array_equal(psi.rows_from_positions(consumed, column, consume=True), expected)
            assert np.array_equal(consumed, expected)  # the positions became the rows
        padding = int(np.flatnonzero(order < 0)[0])
        for bad in ([real[0], padding], [real[0], real[0]], [-1], [len(order)], [[real[0]]]):
            with pytest.raises(ValueError, match="do not name distinct IDs"):
                psi.rows_from_positions(bad, column)


def test_a_checkpoint_copies_an_order_on_disk_in_and_reads_it_back(tmp_path: Path, monkeypatch) -> None:
    from vflsec.services.engines.checkpoint import StateDir

    order = np.random.default_rng(3).permutation(1000).astype(np.int32)
    with spill.Column(np.int32, tmp_path) as column:
        column.add(order)
        monkeypatch.setattr(spill.Column, "__array__", None)  # the checkpoint must not read it whole
        state = StateDir(tmp_path / "state")
        state.save("s1", {"psi_permutation": column, "rows": np.arange(4)}, {"k": 1}, fixed=("psi_permutation",))
        state.save("s1", {"psi_permutation": column, "rows": np.arange(5)}, {"k": 2}, fixed=("psi_permutation",))
    arrays, meta = StateDir(tmp_path / "state").load_all()["s1"]
    assert np.array_equal(arrays["psi_permutation"], order) and arrays["psi_permutation"].dtype == np.int32
    assert np.array_equal(arrays["rows"], np.arange(5)) and meta == {"k": 2}
    assert len(list((tmp_path / "state").glob("*.fixed"))) == 1  # the order written once, not at every save
