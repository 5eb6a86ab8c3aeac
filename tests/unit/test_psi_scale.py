"""PSI at scale: the process-pool path returns exactly the known intersection, row for row, leaves no worker
behind, and reports bad input (bad point deep in a chunk, non-string ids, mismatched salts) precisely."""

from __future__ import annotations

import os
from multiprocessing import forkserver, resource_tracker

import numpy as np
import pytest

from vflsec.services.crypto import psi


def _descendants(root: int) -> set[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parents[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def _workers_left() -> set[int]:
    # multiprocessing's forkserver and resource tracker stay for the life of this process; the workers must not.
    servers = {forkserver._forkserver._forkserver_pid, resource_tracker._resource_tracker._pid}
    return _descendants(os.getpid()) - servers


def _align(active_ids: list[str], passive_ids: list[str], workers: int) -> tuple[list[str], list[str]]:
    """The protocol through the public API; returns the common samples as (active id, passive id) columns."""
    salt, key = psi.new_salt(), psi.PsiKey()
    sent = key.blind_ids(active_ids, salt, workers=workers)
    reply = psi.passive_reply(psi.PsiKey(), passive_ids, sent, salt, workers=workers)
    alignment = psi.active_align(key, [reply.reblinded_active], [reply.blinded_own], workers=workers)
    rows = psi.rows_from_positions(alignment.passive_positions[0], reply.permutation)
    return [active_ids[r] for r in alignment.active_rows], [passive_ids[r] for r in rows]


def _case(n: int) -> tuple[list[str], list[str], set[str]]:
    rng = np.random.default_rng(n)  # input rows only; the protocol draws from OS entropy
    common = [f"c{i}" for i in range(int(0.9 * n))]
    active = common + [f"a{i}" for i in range(n - len(common))]
    passive = common + [f"p{i}" for i in range(n - len(common))]
    return [active[i] for i in rng.permutation(n)], [passive[i] for i in rng.permutation(n)], set(common)


def _check_exact(n: int) -> None:
    active, passive, common = _case(n)
    left, right = _align(active, passive, workers=2)  # > 1 chunk and 2 workers: the pool path, on any machine
    assert left == right  # common index i is the same sample on both sides
    assert len(left) == len(common) and set(left) == common
    assert not _workers_left()


def test_20k_alignment_through_the_pool_is_exact_row_for_row() -> None:
    _check_exact(20_000)


@pytest.mark.slow
def test_100k_alignment_through_the_pool_is_exact_row_for_row() -> None:
    _check_exact(100_000)


def test_bad_point_deep_in_a_later_chunk_names_its_index_and_stops_the_pool() -> None:
    key = psi.PsiKey()
    points = key.blind_ids([f"x{i}" for i in range(psi.CHUNK + 10)], psi.new_salt(), workers=2)
    bad = psi.CHUNK + 7
    points[bad] = bytes(32)  # the identity
    with pytest.raises(ValueError, match=f"point at index {bad} is not a canonical point"):
        key.reblind(points, workers=2)
    with pytest.raises(ValueError, match=f"list sent by passive-7: point at index {bad}"):
        psi.active_align(key, [points], [points], names=["passive-7"], workers=2)
    assert not _workers_left()


def test_non_string_ids_are_refused_with_their_row() -> None:
    with pytest.raises(ValueError, match="sample id at row 2 is a int, not a string"):
        psi.PsiKey().blind_ids(["a", "b", 3], psi.new_salt())  # type: ignore[list-item]
    with pytest.raises(ValueError, match="sample id at row 1 is a bytes"):
        psi.passive_reply(psi.PsiKey(), ["a", b"b"], [], psi.new_salt())  # type: ignore[list-item]


def test_passive_duplicate_is_reported_at_its_own_rows_not_its_shuffled_positions() -> None:
    ids = [f"id{i}" for i in range(50)] + ["id7"]
    with pytest.raises(ValueError, match="duplicate ids at rows 7 and 50"):
        psi.passive_reply(psi.PsiKey(), ids, [], psi.new_salt())


def test_mismatched_salts_find_nothing_in_common() -> None:
    ids = [f"id{i}" for i in range(100)]
    key = psi.PsiKey()
    sent = key.blind_ids(ids, psi.new_salt())
    reply = psi.passive_reply(psi.PsiKey(), ids, sent, psi.new_salt())  # a passive party hashing with another salt
    assert psi.active_align(key, [reply.reblinded_active], [reply.blinded_own]).size == 0


def test_empty_sides_align_to_nothing() -> None:
    key, salt = psi.PsiKey(), psi.new_salt()
    reply = psi.passive_reply(psi.PsiKey(), [], key.blind_ids(["a"], salt), salt)
    assert reply.blinded_own == [] and psi.active_align(key, [reply.reblinded_active], [[]]).size == 0
    reply = psi.passive_reply(psi.PsiKey(), ["a"], [], salt)
    assert psi.active_align(key, [reply.reblinded_active], [reply.blinded_own]).size == 0


def test_worker_count_comes_from_the_environment_or_the_cpus(monkeypatch) -> None:
    monkeypatch.delenv(psi.WORKERS_ENV, raising=False)
    assert psi.default_workers() == len(os.sched_getaffinity(0))
    monkeypatch.setenv(psi.WORKERS_ENV, "3")
    assert psi.default_workers() == 3
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(psi.WORKERS_ENV, bad)
        with pytest.raises(ValueError, match=f"{psi.WORKERS_ENV} must be a positive integer"):
            psi.default_workers()
    with pytest.raises(ValueError, match="workers must be at least 1, got 0"):
        psi.PsiKey().reblind([], workers=0)


def test_reply_stream_yields_chunks_in_order_and_one_stopped_early_leaves_no_worker() -> None:
    ids = [f"x{i}" for i in range(3 * psi.MIN_CHUNK)]
    key, salt = psi.PsiKey(), psi.new_salt()
    sent = key.blind(ids, salt, workers=2)
    stream = psi.passive_stream(psi.PsiKey(), ids, sent, salt, workers=2)
    first, second = next(stream.chunks), next(stream.chunks)
    assert [(name, chunk.index, chunk.chunks, chunk.points) for name, chunk in (first, second)] == [
        (psi.DOUBLE, 0, 3, len(ids)),
        (psi.DOUBLE, 1, 3, len(ids)),
    ]
    stream.chunks.close()  # a cut call: the pool is shut down at once, nothing computed later is sent
    assert not _workers_left()
