"""Issue 16's command timed with the former defaults and today's, side by side in one run (``vflsec bench cli``).

Each run is the real command in its own process (``vflsec attack ... --json``: start-up, the dealer, every party
a process, PSI, training, the query, the attacks). Besides its wall time the bench reports the CPU seconds of the
command's whole process tree (parties, PSI pool workers and their forkservers included: this process becomes
their child subreaper, so every descendant is reaped here and its CPU counted), because this machine is shared
and a wall time alone says as much about the other jobs as about the code. The former defaults are the same
command with ``--epochs 30`` (the fixed default before the epochs followed the training rows); everything else,
the code included, is today's for both.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# The command (issue 16, "Fast runs"), without --backend.
COMMAND = (
    "attack", "--dataset", "bank", "--passive-features", "random:0.4", "--predictions", "1000",
    "--attacks", "esa,half_star,rcc2",
)  # fmt: skip
# What the former defaults add to it.
FORMER_DEFAULTS = ("--epochs", "30")
PHASES = ("load", "deal", "align", "train", "predict", "attack")
_PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper() -> bool:
    """Orphaned descendants (a party's forkserver and its pool workers) get reparented to this process, so their
    CPU time reaches RUSAGE_CHILDREN once reaped. Linux only; False where it is not available."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    return False


def _children() -> set[int]:
    """This process's live (or not yet reaped) children, from /proc."""
    me, found = os.getpid(), set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == me:
                found.add(int(stat.parent.name))
    return found


def _reap_new(before: set[int]) -> None:
    """Wait for every descendant reparented here since ``before`` (they exit once the command's parties have
    gone); children this process had before are left alone."""
    while new := _children() - before:
        for pid in new:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_command(args: Sequence[str], timeout: float) -> dict[str, Any]:
    """One ``vflsec`` command with ``--json``: its report's timings and accuracy, its wall and tree CPU seconds."""
    load, before = os.getloadavg()[0], _children()
    cpu, start = _children_cpu(), time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "vflsec.client.cli", *args, "--json"], capture_output=True, text=True, timeout=timeout
    )
    wall = time.perf_counter() - start
    _reap_new(before)
    cpu = _children_cpu() - cpu
    if done.returncode != 0:
        raise RuntimeError(f"vflsec {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "wall_seconds": wall,
        "cpu_seconds": cpu,
        "load_average_1min": load,
        "phase_seconds": {p: report.get(f"{p}_seconds") for p in PHASES},
        "epochs": report.get("epochs_trained"),
        "batch_size": report.get("batch_size"),
        "accuracy": report["accuracy"],
        "mse_clipped": {name: r.get("mse_clipped") for name, r in report["attacks"].items()},
    }


def run(
    backends: Sequence[str] = ("plain", "ckks"),
    command: Sequence[str] = COMMAND,
    timeout: float = 3600.0,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Per backend: the command with the former defaults, then with today's; wall and CPU ratios former / today."""
    log = log or (lambda line: None)
    result: dict[str, Any] = {
        "command": " ".join(["vflsec", *command]),
        "former_defaults": " ".join(FORMER_DEFAULTS),
        "cpu_counted_tree": _become_subreaper(),
        "cores": os.cpu_count(),
        "backends": {},
    }
    for backend in backends:
        runs = {}
        for name, extra in (("former", FORMER_DEFAULTS), ("today", ())):
            log(f"{backend}, {name} defaults ...")
            runs[name] = run_command([*command, "--backend", backend, *extra], timeout)
            log(f"{backend}, {name} defaults: {summary(runs[name])}")
        runs["wall_ratio"] = runs["former"]["wall_seconds"] / runs["today"]["wall_seconds"]
        runs["cpu_ratio"] = runs["former"]["cpu_seconds"] / runs["today"]["cpu_seconds"]
        runs["accuracy_change_pp"] = 100 * (runs["today"]["accuracy"] - runs["former"]["accuracy"])
        result["backends"][backend] = runs
    return result


def summary(run: dict[str, Any]) -> str:
    phases = ", ".join(f"{p} {s:.1f}" for p, s in run["phase_seconds"].items() if s is not None)
    return (
        f"{run['wall_seconds']:.1f} s wall, {run['cpu_seconds']:.1f} CPU-s, load {run['load_average_1min']:.1f}, "
        f"{run['epochs']} epochs, accuracy {run['accuracy']:.4f} ({phases})"
    )


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{result['command']} --backend B   (former: + {result['former_defaults']})",
        f"{'backend':<8}{'defaults':<9}{'wall s':>9}{'CPU s':>9}{'load':>6}{'epochs':>7}{'accuracy':>10}",
    ]
    for backend, runs in result["backends"].items():
        for name in ("former", "today"):
            r = runs[name]
            lines.append(
                f"{backend:<8}{name:<9}{r['wall_seconds']:>9.1f}{r['cpu_seconds']:>9.1f}"
                f"{r['load_average_1min']:>6.1f}{r['epochs']:>7}{r['accuracy']:>10.4f}"
            )
        lines.append(
            f"{backend:<8}{'ratio':<9}{runs['wall_ratio']:>8.2f}x{runs['cpu_ratio']:>8.2f}x"
            f"{'':>13}{runs['accuracy_change_pp']:>+9.2f}pp"
        )
    return "\n".join(lines)
