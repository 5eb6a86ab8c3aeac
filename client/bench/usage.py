"""What the benchmarks' processes used, from Linux /proc: CPU seconds (read before and after the timed work, so that
start-up and alignment are left out) and memory, of a process and every process it started (pool workers, their
forkserver)."""

from __future__ import annotations

import os
from collections.abc import Mapping


def party_pids(federation: object) -> dict[str, int]:
    """Each party's process id, for a federation of party processes (launcher.run_processes); empty in process."""
    return {party: proc.pid for party, proc in getattr(federation, "processes", {}).items()}


def cpu_seconds(pids: Mapping[str, int]) -> dict[str, float]:
    """User + system CPU seconds so far of this process (the client, and in process the parties too) and of each
    party process with its descendants (:func:`tree_cpu_seconds`)."""
    times, stats = os.times(), proc_stats()  # /proc read once for every party
    cpu = {"client" if pids else "in-process": times.user + times.system}
    cpu.update({party: tree_cpu_seconds(pid, stats) for party, pid in pids.items()})
    return cpu


def since(before: Mapping[str, float], pids: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds each process used since ``before`` (:func:`cpu_seconds`)."""
    return {name: seconds - before[name] for name, seconds in cpu_seconds(pids).items()}


def tree_cpu_seconds(root: int, stats: dict[int, list[str]] | None = None) -> float:
    """CPU seconds of ``root`` and its descendants, including reaped ones (the pool workers, reaped by the
    forkserver, count in its children's times); ``stats``: :func:`proc_stats` already read."""
    stats = proc_stats() if stats is None else stats
    tick = os.sysconf("SC_CLK_TCK")
    return sum(sum(int(v) for v in stats[pid][11:15]) for pid in process_tree(stats, root) if pid in stats) / tick


def proc_stats() -> dict[int, list[str]]:
    """pid -> the fields of /proc/pid/stat after the command name (field 3 onwards)."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    stats[int(entry)] = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
    return stats


def process_tree(stats: dict[int, list[str]], root: int) -> set[int]:
    """``root`` and every process descended from it, by the parent ids in ``stats``."""
    tree, frontier = {root}, {root}
    while frontier:
        frontier = {pid for pid, fields in stats.items() if int(fields[1]) in frontier}
        tree |= frontier
    return tree


def tree_rss_mb(root: int, stats: dict[int, list[str]] | None = None) -> float:
    """Resident memory of ``root`` and all its descendants (pool workers included), in MB; a shared page counts
    once per process, so this errs high; ``stats``: :func:`proc_stats` already read."""
    stats = proc_stats() if stats is None else stats
    tree = process_tree(stats, root)
    return sum(int(stats[pid][21]) for pid in tree if pid in stats) * os.sysconf("SC_PAGE_SIZE") / 2**20


def tree_pss_mb(root: int, stats: dict[int, list[str]] | None = None) -> float:
    """Proportional set size of ``root`` and its descendants, in MB: a page shared by k processes counts 1/k in
    each, so the sum is what the tree occupies (the pool workers share most of their pages with their
    forkserver); ``stats``: :func:`proc_stats` already read."""
    total = 0
    for pid in process_tree(proc_stats() if stats is None else stats, root):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as rollup:
                total += next(int(line.split()[1]) for line in rollup if line.startswith("Pss:"))
        except (OSError, StopIteration):
            continue
    return total / 1024
