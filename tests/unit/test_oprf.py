"""The OT-extension PSI's pieces (services/crypto/oprf.py): the bit transpose, cuckoo placement, the base OTs,
the extension's correlation q_j = t_j ^ (r_j & s), and the whole protocol's intersection on sets of known
overlap, through the same functions the engines call (no gRPC here: tests/integration/test_psi_oprf.py)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

import numpy as np
import pytest

from vflsec.services.crypto import oprf, psi, spill


def _bits(n_rows: int, n_bytes: int) -> np.ndarray:
    return np.frombuffer(os.urandom(n_rows * n_bytes), dtype=np.uint8).reshape(n_rows, n_bytes)


@pytest.mark.parametrize(("rows", "cols"), [(8, 1), (64, 8), (256, 64), (1024, 3)])
def test_transpose_matches_the_bit_by_bit_transpose(rows: int, cols: int) -> None:
    bits = _bits(rows, cols)
    expected = np.packbits(np.unpackbits(bits, axis=1).T, axis=1)
    assert np.array_equal(oprf.transpose(bits), expected)
    assert np.array_equal(oprf.transpose(oprf.transpose(bits)), bits)


@pytest.mark.parametrize("n", [1, 10, 1000, 50_000])
def test_cuckoo_places_every_item_in_one_of_its_bins_one_item_per_bin(n: int) -> None:
    hashed = oprf.item_hashes([f"id-{i}" for i in range(n)], psi.new_salt())
    m = oprf.bins(n)
    hash_key, table = oprf.place(hashed, m)
    placed = table[table >= 0]
    assert np.array_equal(np.sort(placed), np.arange(n))  # total, and each item once: one item per bin
    candidates = oprf.bins_of(hash_key, hashed, m)
    at = np.flatnonzero(table >= 0)
    assert np.all((candidates[table[at]] == at[:, None]).any(axis=1))  # each in one of its own 3 bins


def test_cuckoo_that_cannot_settle_is_a_failure_not_a_wrong_table() -> None:
    candidates = np.zeros((5, 3), dtype=np.int64)  # five items, all wanting bin 0 of 4
    with pytest.raises(oprf.CuckooFailure, match="5 ids into 4 bins did not settle"):
        oprf.cuckoo(candidates, 4, rounds=50)


def test_base_ot_keys_agree_on_the_chosen_side_only() -> None:
    sender, receiver = oprf.BaseOtSender(), oprf.BaseOtReceiver()
    k0, k1 = sender.keys(receiver.answer(sender.point))
    choices = np.unpackbits(receiver.choices)
    assert all(k == (b1 if c else b0) for k, b0, b1, c in zip(receiver.keys, k0, k1, choices, strict=True))
    assert len(receiver.keys) == oprf.CODE_BITS
    assert all(k != (b0 if c else b1) for k, b0, b1, c in zip(receiver.keys, k0, k1, choices, strict=True))
    assert len(set(k0) | set(k1)) == 2 * oprf.CODE_BITS  # every key distinct


BAD_POINTS = {
    "identity": bytes(32),
    "non-canonical (s = p)": (2**255 - 19).to_bytes(32, "little"),
    "negative (s = 1)": (1).to_bytes(32, "little"),
    "short": bytes(31),
}


@pytest.mark.parametrize("kind", list(BAD_POINTS))
def test_bad_points_are_refused_on_both_sides(kind: str) -> None:
    with pytest.raises(ValueError, match="the base-OT point S is not a canonical point of ristretto255"):
        oprf.BaseOtReceiver().answer(BAD_POINTS[kind])
    sender = oprf.BaseOtSender()
    answers = oprf.BaseOtReceiver().answer(sender.point)
    answers[7] = BAD_POINTS[kind]
    with pytest.raises(ValueError, match="base-OT point 7 is not a canonical point of ristretto255"):
        sender.keys(answers)


def test_an_answer_equal_to_s_is_refused() -> None:
    sender = oprf.BaseOtSender()
    answers = oprf.BaseOtReceiver().answer(sender.point)
    answers[3] = sender.point
    with pytest.raises(ValueError, match="base-OT point 3 equals S"):
        sender.keys(answers)


def test_extension_gives_q_equal_t_xor_r_and_s() -> None:
    m = 2 * oprf.ROWS_PER_CHUNK + 128  # three chunks, the last one short
    sender, receiver = oprf.BaseOtSender(), oprf.BaseOtReceiver()
    k0, k1 = sender.keys(receiver.answer(sender.point))
    s = receiver.choices
    t0, t1, ts = oprf._Columns(k0), oprf._Columns(k1), oprf._Columns(receiver.keys)
    for a in range(0, m, oprf.ROWS_PER_CHUNK):
        n = min(oprf.ROWS_PER_CHUNK, m - a)
        r = _bits(n, oprf.CODE_BYTES)
        t = t0.rows(n)
        u = t ^ t1.rows(n) ^ r
        q = ts.rows(n) ^ (u & s)
        assert np.array_equal(q, t ^ (r & s))


def _protocol(active: list[str], passive: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One exchange through the engines' functions: (A's values per row, P's values as sent, P's row per value)."""
    salt = psi.new_salt()
    hashed = oprf.item_hashes(active, salt)
    m = oprf.bins(len(active))
    hash_key, table = oprf.place(hashed, m)
    base_sender, base_receiver = oprf.BaseOtSender(), oprf.BaseOtReceiver()
    answers = base_receiver.answer(base_sender.point)
    code_seed = os.urandom(oprf.KEY_BYTES)
    sender = oprf.Sender(oprf.item_hashes(passive, salt), hash_key, m, base_receiver, code_seed)
    receiver = oprf.Receiver(oprf.Bins(table, hashed), *base_sender.keys(answers), code_seed)
    for chunk in receiver.u_chunks():
        sender.add(chunk)
    sender.verify(receiver.proof(sender.challenge))  # an honest U passes
    return receiver.values(), sender.values(), sender.rows


@pytest.mark.parametrize(("n_active", "n_passive", "common"), [(500, 700, 300), (400, 400, 0), (400, 400, 400),
                                                               (1, 1, 1), (3, 2000, 3)])
def test_intersection_is_exact_on_sets_of_known_overlap(n_active: int, n_passive: int, common: int) -> None:
    active = [f"c{i}" for i in range(common)] + [f"a{i}" for i in range(n_active - common)]
    passive = [f"p{i}" for i in range(n_passive - common)] + [f"c{i}" for i in range(common)]
    mine, theirs, rows = _protocol(active, passive)
    assert len(theirs) == len(rows) == 3 * n_passive  # exactly 3 values per own ID, padding included
    assert len(set(theirs.tolist())) == len(theirs)
    if not common:
        assert not set(mine.tolist()) & set(theirs.tolist())
        return
    alignment = psi.intersect([mine], [theirs])
    assert sorted(alignment.active_rows.tolist()) == list(range(common))
    passive_rows = psi.rows_from_positions(alignment.passive_positions[0], rows)
    assert [passive[r] for r in passive_rows] == [active[r] for r in alignment.active_rows]


def test_positions_naming_padding_or_one_row_twice_are_refused_alike() -> None:
    rows = np.array([4, -1, 0, 4, 2])  # sent value k is row rows[k]; -1: padding
    assert psi.rows_from_positions([2, 0, 4], rows).tolist() == [0, 4, 2]
    for bad in ([2, 1], [3, 2, 0], [5], [2, 2]):  # padding, one row twice, out of range, repeated: one refusal
        with pytest.raises(ValueError) as err:
            psi.rows_from_positions(bad, rows)
        assert str(err.value) == psi.BAD_POSITIONS


def test_u_chunks_of_the_wrong_size_or_count_are_refused() -> None:
    receiver = oprf.BaseOtReceiver()
    receiver.answer(oprf.BaseOtSender().point)
    hashed = oprf.item_hashes(["x", "y"], b"salt")
    m = oprf.bins(2)
    sender = oprf.Sender(hashed, os.urandom(16), m, receiver, os.urandom(16))
    with pytest.raises(ValueError, match=f"U chunk 0 holds 64 bytes, not {(m + oprf.CHECKS) * oprf.CODE_BYTES}"):
        sender.add(bytes(64))
    with pytest.raises(ValueError, match="no value before U passed the consistency check"):
        sender.values()
    with pytest.raises(ValueError, match="the proof came after 0 of 1 U chunks"):
        zero = oprf.Proof(np.zeros((oprf.CHECKS, 12), np.uint8), np.zeros((oprf.CHECKS, oprf.CODE_BYTES), np.uint8))
        sender.verify(zero)
    sender.add(bytes((m + oprf.CHECKS) * oprf.CODE_BYTES))
    with pytest.raises(ValueError, match="a U chunk beyond the 1 announced"):
        sender.add(bytes(64))
    with pytest.raises(ValueError, match="no value before U passed"):
        sender.values()


def test_bins_cover_the_ids_with_margin_in_whole_blocks() -> None:
    for n in (1, 100, 10**6):
        m = oprf.bins(n)
        assert m % oprf.BIN_ALIGN == 0 and m >= 1.27 * n


def _values(n: int) -> np.ndarray:
    return np.frombuffer(os.urandom(16 * n), dtype="S16")


def test_matching_values_as_they_arrive_equals_matching_the_whole_list() -> None:
    mine = _values(5000)
    theirs = np.concatenate([_values(4000), mine[:3000]])[np.random.default_rng(0).permutation(7000)]
    stream = psi.StreamMatch(mine, "passive-1")
    for start in range(0, len(theirs), 999):
        stream.add(theirs[start : start + 999])
    common, positions = stream.result()
    expected_common, expected_positions = psi.match(mine, theirs, "passive-1")
    assert common.sum() == 3000 and np.array_equal(common, expected_common)
    assert np.array_equal(positions[common], expected_positions[common])
    assert np.array_equal(theirs[positions[common]], mine[common])


def test_a_value_of_ours_sent_twice_is_refused_naming_both_positions() -> None:
    mine = _values(10)
    for chunks in ([np.array([mine[3], mine[5], mine[3]])], [np.array([mine[3]]), np.array([mine[0], mine[3]])]):
        stream = psi.StreamMatch(mine, "passive-1")
        with pytest.raises(ValueError, match="duplicate values sent by passive-1 at rows 0 and 2"):
            for chunk in chunks:
                stream.add(chunk)
    stream = psi.StreamMatch(mine, "passive-1")
    stream.add(np.array([b"x" * 16, b"x" * 16, mine[1]]))  # a repeat matching nothing of ours changes nothing
    assert stream.result()[0].tolist() == [i == 1 for i in range(10)] and stream.result()[1][1] == 2


# --- the linear code and the consistency check (OOS17) ---
def _words(n: int) -> np.ndarray:
    return _bits(n, oprf.WORD_BYTES).copy()


def test_the_code_is_linear_and_its_tables_encode_as_the_matrix_product() -> None:
    code = oprf.LinearCode(os.urandom(oprf.KEY_BYTES))
    a, b = _words(300), _words(300)
    assert np.array_equal(code.encode(a ^ b), code.encode(a) ^ code.encode(b))  # C(a ^ b) = C(a) ^ C(b)
    g = np.unpackbits(code.generator, axis=1).astype(np.int64)  # (96, 640)
    assert g.shape == (oprf.WORD_BITS, oprf.CODE_BITS)
    product = np.packbits((np.unpackbits(a, axis=1).astype(np.int64) @ g) % 2, axis=1)
    assert np.array_equal(code.encode(a), product)
    assert not code.encode(np.zeros((1, oprf.WORD_BYTES), np.uint8)).any()
    weights = np.unpackbits(code.encode(a[a.any(axis=1)]), axis=1).sum(axis=1)
    assert weights.min() >= 100  # random nonzero codewords: weight ~256 (minimum distance >= 100 but w.p. 2^-51)
    assert not np.array_equal(oprf.LinearCode(os.urandom(16)).generator, code.generator)  # P's seed, its code


def test_the_accumulator_is_the_xor_of_each_checks_rows() -> None:
    bits = np.frombuffer(os.urandom(5000 * oprf.CHECKS), np.uint8).reshape(5000, oprf.CHECKS) & 1
    rows = _bits(5000, 76)
    acc = oprf.accumulate(bits, rows)
    for c in (0, 17, oprf.CHECKS - 1):
        assert np.array_equal(acc[c], np.bitwise_xor.reduce(rows[bits[:, c] == 1], axis=0))
    # in pieces, as chunks arrive, equals all at once
    assert np.array_equal(oprf.accumulate(bits[:1234], rows[:1234]) ^ oprf.accumulate(bits[1234:], rows[1234:]), acc)


def test_the_challenge_stream_is_the_same_whatever_the_chunking() -> None:
    seed = os.urandom(16)
    whole = oprf.Challenge(seed).next(1000)
    x = oprf.Challenge(seed)
    assert np.array_equal(np.concatenate([x.next(8), x.next(992)]), whole)
    assert whole.shape == (1000, oprf.CHECKS) and 0.45 < whole.mean() < 0.55


def _exchange(n: int = 200) -> tuple[Callable[[], oprf.Sender], oprf.Receiver, list[bytes]]:
    """(a maker of P's Sender: the same keys, choice bits and code, a fresh challenge each; A's Receiver; A's U)."""
    salt = psi.new_salt()
    hashed = oprf.item_hashes([f"id{i}" for i in range(n)], salt)
    m = oprf.bins(n)
    hash_key, table = oprf.place(hashed, m)
    base_sender, base_receiver = oprf.BaseOtSender(), oprf.BaseOtReceiver()
    answers = base_receiver.answer(base_sender.point)
    seed = os.urandom(oprf.KEY_BYTES)
    receiver = oprf.Receiver(oprf.Bins(table, hashed), *base_sender.keys(answers), seed)
    return lambda: oprf.Sender(hashed, hash_key, m, base_receiver, seed), receiver, list(receiver.u_chunks())


def test_one_flipped_bit_fails_exactly_the_checks_holding_its_row_when_s_has_that_bit() -> None:
    new_sender, receiver, chunks = _exchange()
    j = 37  # a bin; the challenge says which checks hold it
    s_bits = np.unpackbits(new_sender()._s)
    for bit, expect_fail in ((int(np.flatnonzero(s_bits)[0]), True), (int(np.flatnonzero(s_bits == 0)[0]), False)):
        rows = np.frombuffer(chunks[0], np.uint8).reshape(-1, oprf.CODE_BYTES).copy()
        rows[j, bit // 8] ^= 0x80 >> (bit % 8)
        checked = new_sender()  # P's same keys and s: only U's one bit differs
        for chunk in [rows.tobytes(), *chunks[1:]]:
            checked.add(chunk)
        x = oprf.Challenge(checked.challenge).next(receiver.bins.m)[j]
        proof = receiver.proof(checked.challenge)  # A's honest answer for the codeword it meant
        expected = proof.rows ^ (checked._code.encode(proof.words) & checked._s)
        failing = (expected != checked._acc).any(axis=1)
        # a check fails iff it holds row j and s has the flipped bit (P's q_j moved by that bit of s)
        assert failing.tolist() == [bool(expect_fail and x[c]) for c in range(oprf.CHECKS)]
        if expect_fail:
            with pytest.raises(oprf.CheckFailed):
                checked.verify(proof)
        else:
            checked.verify(proof)  # a flip where s is 0 changes nothing P sees: nothing to learn from it either


def test_an_honest_u_passes_and_a_wrong_proof_fails() -> None:
    new_sender, receiver, chunks = _exchange()
    sender = new_sender()
    for chunk in chunks:
        sender.add(chunk)
    proof = receiver.proof(sender.challenge)
    bad = oprf.Proof(proof.words, proof.rows.copy())
    bad.rows[5, 0] ^= 1
    with pytest.raises(oprf.CheckFailed, match="consistency check"):
        sender.verify(bad)
    with pytest.raises(ValueError, match="no value before"):
        sender.values()
    sender.verify(proof)
    assert len(sender.values()) == 3 * 200
    with pytest.raises(ValueError, match="the proof's words hold 3 bytes, not 768"):
        oprf.Proof.from_bytes(b"abc", proof.rows.tobytes())


@pytest.mark.parametrize("rows_per_chunk", [104, 128, 1024])  # pads straddling two chunks, alone in one, all in one
def test_the_check_and_the_values_agree_whatever_the_chunking(monkeypatch, rows_per_chunk: int) -> None:
    monkeypatch.setattr(oprf, "ROWS_PER_CHUNK", rows_per_chunk)
    active = [f"c{i}" for i in range(60)] + [f"a{i}" for i in range(40)]
    passive = [f"c{i}" for i in range(60)] + [f"p{i}" for i in range(50)]
    assert oprf.bins(len(active)) == 384 and oprf.row_chunks(384) == -(-(384 + oprf.CHECKS) // rows_per_chunk)
    mine, theirs, _ = _protocol(active, passive)  # the check passes (inside) ...
    alignment = psi.intersect([mine], [theirs])  # ... and the intersection is exact
    assert sorted(alignment.active_rows.tolist()) == list(range(60))


@pytest.mark.parametrize("per_range", [64, 1 << 18])
def test_matching_by_range_equals_matching_in_memory(tmp_path, monkeypatch, per_range: int) -> None:
    monkeypatch.setattr(spill, "RANGE_VALUES", per_range)  # many ranges, or one
    mine = _values(5000)
    theirs = np.concatenate([_values(9000), mine[:3000]])[np.random.default_rng(0).permutation(12000)]
    ours = spill.Ranges(spill.Ranges.count_for(len(mine)), 16, tmp_path)
    ours.add(np.arange(5000, dtype=np.int32), mine)
    match = psi.RangeMatch(ours, len(mine), "passive-1", str(tmp_path))
    for start in range(0, len(theirs), 999):
        match.add(theirs[start : start + 999])
    common, positions = match.result()
    expected_common, expected_positions = psi.match(mine, theirs, "passive-1")
    assert common.sum() == 3000 and np.array_equal(common, expected_common)
    assert np.array_equal(positions, expected_positions)
    assert np.array_equal(theirs[positions[common]], mine[common])
    ours.close()
    assert list(tmp_path.iterdir()) == []


def test_matching_by_range_refuses_repeats_and_removes_the_party_values(tmp_path) -> None:
    mine = _values(10)

    def matched(theirs: np.ndarray, ours: np.ndarray = mine) -> tuple[np.ndarray, np.ndarray]:
        ranges = spill.Ranges(3, 16, tmp_path)
        ranges.add(np.arange(len(ours), dtype=np.int32), ours)
        match = psi.RangeMatch(ranges, len(ours), "passive-1", str(tmp_path))
        try:
            match.add(theirs)
            return match.result()
        finally:
            assert list(tmp_path.iterdir()) == [ranges.path]  # the party's values removed, error or not
            ranges.close()

    with pytest.raises(ValueError, match="duplicate values sent by passive-1 at rows 0 and 2"):
        matched(np.array([mine[3], mine[5], mine[3]]))
    with pytest.raises(ValueError, match="duplicate active values for passive-1 at rows 1 and 4"):
        matched(mine[:2], np.array([mine[0], mine[1], mine[2], mine[3], mine[1]]))
    common, positions = matched(np.array([b"x" * 16, b"x" * 16, mine[1]]))  # a repeat matching nothing of ours
    assert common.tolist() == [i == 1 for i in range(10)] and positions[1] == 2


@pytest.mark.parametrize(("rows_per_chunk", "range_bins"), [(104, 64), (128, 100), (1024, 128), (104, 1 << 18)])
def test_the_senders_slots_by_bin_range_give_the_same_values(monkeypatch, rows_per_chunk: int, range_bins: int) -> None:
    """P's slots wait on disk by bin range, a range read back when U reaches it (ranges smaller than a chunk,
    straddling chunks, or one for all): the check passes and the intersection is exact."""
    monkeypatch.setattr(oprf, "ROWS_PER_CHUNK", rows_per_chunk)
    monkeypatch.setattr(oprf, "RANGE_BINS", range_bins)
    active = [f"c{i}" for i in range(60)] + [f"a{i}" for i in range(40)]
    passive = [f"p{i}" for i in range(150)] + [f"c{i}" for i in range(60)]
    mine, theirs, rows = _protocol(active, passive)
    assert len(theirs) == 3 * len(passive) and len(set(theirs.tolist())) == len(theirs)
    alignment = psi.intersect([mine], [theirs])
    assert sorted(alignment.active_rows.tolist()) == list(range(60))
    passive_rows = psi.rows_from_positions(alignment.passive_positions[0], rows)
    assert [passive[r] for r in passive_rows] == [active[r] for r in alignment.active_rows]


def test_the_senders_slots_are_removed_once_u_is_complete_or_on_close(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(oprf, "RANGE_BINS", 128)
    monkeypatch.setattr(oprf, "ROWS_PER_CHUNK", 128)  # U in 7 chunks: a sender closed after one is mid-U
    hashed = oprf.item_hashes([f"id{i}" for i in range(400)], b"salt")
    m = oprf.bins(400)
    hash_key, table = oprf.place(hashed, m)
    base_sender, base_receiver = oprf.BaseOtSender(), oprf.BaseOtReceiver()
    answers = base_receiver.answer(base_sender.point)
    chunks = list(oprf.Receiver(oprf.Bins(table, hashed), *base_sender.keys(answers), bytes(16)).u_chunks())
    for complete in (True, False):
        sender = oprf.Sender(hashed, hash_key, m, base_receiver, bytes(16), spill_dir=str(tmp_path))
        slots = sender._slots.path
        assert len(list(slots.iterdir())) == -(-m // 128)
        assert stat.S_IMODE(slots.stat().st_mode) == 0o700
        assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in slots.iterdir())
        assert sum(f.stat().st_size for f in slots.iterdir()) <= 3 * 400 * oprf._SLOT.itemsize
        for chunk in chunks if complete else chunks[:1]:
            sender.add(chunk)
        assert slots.exists() != complete  # gone once every value is made
        sender.close()
        assert list(tmp_path.iterdir()) == []


def test_the_receivers_bins_on_disk_hold_each_bins_row_and_word_and_are_removed(tmp_path, monkeypatch) -> None:
    hashed = oprf.item_hashes([f"id{i}" for i in range(300)], b"salt")
    m = oprf.bins(300)
    _, table = oprf.place(hashed, m)
    with pytest.raises(RuntimeError):  # a failure while writing: nothing left behind
        monkeypatch.setattr(oprf, "words_of", lambda _: (_ for _ in ()).throw(RuntimeError()))
        oprf.Bins(table, hashed, str(tmp_path))
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    bins = oprf.Bins(table, hashed, str(tmp_path))
    (directory,) = tmp_path.iterdir()
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700 and (bins.m, bins.n) == (m, 300)
    records = np.concatenate([bins.read(a, a + 100) for a in range(0, m + 200, 100)])  # past the end: clipped
    assert np.array_equal(records["item"], table)
    full = table >= 0
    assert np.array_equal(records["word"][full], oprf.words_of(hashed[table[full]]))
    assert not records["word"][~full].any()
    bins.close()
    bins.close()
    assert list(tmp_path.iterdir()) == []


def test_hashes_on_disk_give_the_same_bins_and_values_as_in_memory(tmp_path, monkeypatch) -> None:
    """A's and P's h(x) spilled (hash_column) and read a block at a time: the same hashes, bins on disk and values
    as from the array in memory; the column's file is private and goes on close, or on an error while hashing."""
    monkeypatch.setattr(oprf, "_BLOCK", 64)  # several blocks
    monkeypatch.setattr(oprf, "RANGE_BINS", 128)  # several bin ranges
    ids, salt = np.array([f"id{i}" for i in range(500)]), b"salt"
    hashed = oprf.item_hashes(ids, salt)
    with oprf.hash_column(ids, salt, str(tmp_path)) as column:
        (directory,) = tmp_path.iterdir()
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in directory.iterdir())
        assert np.array_equal(np.asarray(column).view(np.uint8).reshape(-1, 16), hashed)
        m = oprf.bins(len(ids))
        hash_key, table = oprf.place(column, m)
        candidates = oprf.bins_of(hash_key, hashed, m)
        assert sorted(table[table >= 0].tolist()) == list(range(len(ids)))  # every id placed once
        assert all(b in candidates[item] for b, item in enumerate(table) if item >= 0)  # in one of its bins
        from_disk, in_memory = oprf.Bins(table, column, str(tmp_path)), oprf.Bins(table, hashed, str(tmp_path))
        assert np.array_equal(from_disk.read(0, m), in_memory.read(0, m))
        from_disk.close(), in_memory.close()
        base_sender, base_receiver = oprf.BaseOtSender(), oprf.BaseOtReceiver()
        base_sender.keys(base_receiver.answer(base_sender.point))
        senders = [oprf.Sender(h, hash_key, m, base_receiver, bytes(16), str(tmp_path)) for h in (column, hashed)]
        assert all(
            np.array_equal(senders[0]._slots.records(r), senders[1]._slots.records(r))
            for r in range(senders[0]._slots.count)
        )
        for sender in senders:
            sender.close()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="sample id at row 130 is a int"):  # named by its row in the whole list
        oprf.hash_column([*ids[:130], 7], salt, str(tmp_path))
    real, calls = oprf.item_hashes, []

    def failing(part: np.ndarray, salt: bytes) -> np.ndarray:
        calls.append(len(part))
        if len(calls) > 2:
            raise ZeroDivisionError
        return real(part, salt)

    monkeypatch.setattr(oprf, "item_hashes", failing)
    with pytest.raises(ZeroDivisionError):  # an error half-way: nothing left behind
        oprf.hash_column(ids, salt, str(tmp_path))
    assert calls == [64, 64, 64] and list(tmp_path.iterdir()) == []
