"""CPU the benchmarks' party processes used: user + system seconds from Linux /proc, read before and after the timed
work so that start-up and alignment are left out."""

from __future__ import annotations

import os
from collections.abc import Mapping


def party_pids(federation: object) -> dict[str, int]:
    """Each party's process id, for a federation of party processes (launcher.run_processes); empty in process."""
    return {party: proc.pid for party, proc in getattr(federation, "processes", {}).items()}


def cpu_seconds(pids: Mapping[str, int]) -> dict[str, float]:
    """User + system CPU seconds so far of this process (the client, and in process the parties too) and of each
    party process."""
    times = os.times()
    cpu = {"client" if pids else "in-process": times.user + times.system}
    for party, pid in pids.items():
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        cpu[party] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return cpu


def since(before: Mapping[str, float], pids: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds each process used since ``before`` (:func:`cpu_seconds`)."""
    return {name: seconds - before[name] for name, seconds in cpu_seconds(pids).items()}
