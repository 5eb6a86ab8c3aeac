"""Where a party process's time goes: cProfile on every thread, merged, then grouped into phases.

``vflsec serve`` runs under :func:`profile_threads` when ``VFLSEC_PROFILE_DIR`` is set (``bench he --profile``
sets it for the party processes it starts); each party writes ``<dir>/<party>.pstats`` when it stops.
:func:`phases` groups the self time (cProfile's ``tottime``, so nothing is counted twice) of every function
by the phase it belongs to, by name: TenSEAL's encrypt, ct x pt / ct + ct, (de)serialisation, decrypt;
protobuf; waiting on gRPC; the rest is Python and numpy.
"""

from __future__ import annotations

import contextlib
import cProfile
import os
import pstats
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

ENV = "VFLSEC_PROFILE_DIR"

# The HE operations: the cumulative time of services/crypto/he.py's backend primitives (TenSEAL underneath).
HE_OPS = {
    "_encrypt": "he_encrypt",
    "_encrypt_at": "he_encrypt",  # an encryption in a form below the first data level (LR's [[p]], trees' [[Y]])
    "_decrypt": "he_decrypt",
    "decrypt_complex": "he_decrypt",  # SEAL's decryption and complex decoding (masked products' two parts)
    "_serialize": "he_serialisation",
    "_deserialize": "he_serialisation",
    "_mul_plain": "he_ct_x_pt",
    "masked_sum": "he_ct_x_pt",  # a masked product through SEAL: encodings, ct x pt, mask, its Enc(0), its save
    "make_ahead": "he_encrypt",  # encryptions of zero made in a party's idle time (Backend.make_ahead)
    "_add": "he_add",
    "_add_plain": "he_add",
    "check_form": "he_check_form",
}
# Inside those operations (their time is already counted there).
_WITHIN_HE = (
    "_check", "_level", "_zero_at", "_form_of", "_last_prime", "_transparent_safe", "_seal", "_vector",
    "_vector_message", "_level_data",
)
# Everything else by self time: the phase of the first pattern its "file:function" key contains.
PHASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    # Not the epoch's cost: handler threads waiting for work, the server's poller, the alignment (PSI).
    ("idle", ("SimpleQueue' objects", "CompletionQueue' objects", "_server.py:_serve")),
    ("psi", ("psi.py", "oprf.py", "curve.py", "pysodium", "psi_pool")),  # the alignment (OPRF or ECDH)
    ("grpc_wait", ("SegregatedCall' objects", "_channel.py")),  # a blocking call to a peer, until it answers
    ("lock_wait", ("acquire' of '_thread.lock'",)),  # e.g. a fan-out's futures: also waiting on peers
    ("protobuf", ("protobuf", "SerializeToString", "FromString", "ParseFromString")),
    ("grpc", ("grpc", "cygrpc")),
)


@contextlib.contextmanager
def profile_threads(out: Path) -> Iterator[None]:
    """cProfile every thread started inside (the gRPC server's handler threads); their merged stats go to
    ``out`` on exit."""
    profiles: list[cProfile.Profile] = []

    def start(*_: object) -> None:  # runs once in each new thread, then cProfile's own hook replaces it
        if _plumbing(threading.current_thread()):
            sys.setprofile(None)
            return
        profile = cProfile.Profile()
        profiles.append(profile)
        profile.enable()

    threading.setprofile(start)  # not the calling thread: it only waits for SIGTERM
    try:
        yield
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
        stats: pstats.Stats | None = None
        for profile in list(profiles):
            profile.create_stats()
            if not profile.stats:  # type: ignore[attr-defined]
                continue
            if stats is None:
                stats = pstats.Stats(profile)
            else:
                stats.add(profile)
        if stats is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            stats.dump_stats(str(out))


def _plumbing(thread: threading.Thread) -> bool:
    """A process pool's own threads (the PSI workers' feeder and manager): they only wait for and pipe the
    workers' data during alignment, and would count their poll and pipe writes as the epoch's Python time."""
    return thread.name.startswith("QueueFeederThread") or type(thread).__name__ == "_ExecutorManagerThread"


def maybe_profile(party: str) -> contextlib.AbstractContextManager[None]:
    folder = os.environ.get(ENV)
    return profile_threads(Path(folder) / f"{party}.pstats") if folder else contextlib.nullcontext()


def phase_of(filename: str, function: str) -> str:
    key = f"{filename}:{function}"
    for phase, patterns in PHASES:
        if any(p in key for p in patterns):
            return phase
    return "python"


def _is_he_op(key: tuple[str, int, str]) -> bool:
    return key[0].endswith(os.path.join("crypto", "he.py")) and key[2] in HE_OPS


def _share_under_he(stats: dict, key: tuple[str, int, str], field: int, memo: dict) -> float:
    """The share of ``key``'s time (``field`` 2: its own, 3: its cumulative) spent in calls made, directly or not, from
    an HE operation: that time is already in the operation's cumulative time. Split by caller as cProfile records it
    (a caller's calls count as under HE in the share its own cumulative time is); a cycle counts as outside."""
    callers = stats[key][4]
    total = sum(times[field] for times in callers.values())
    if total <= 0:
        return 0.0
    under = 0.0
    for caller, times in callers.items():
        if _is_he_op(caller):
            weight = 1.0
        elif caller in memo:
            weight = memo[caller]
        else:
            memo[caller] = 0.0
            weight = memo[caller] = _share_under_he(stats, caller, 3, memo) if caller in stats else 0.0
        under += times[field] * weight
    return under / total


def phases(path: Path, top: int = 0) -> dict:
    """Seconds per phase, summed over threads, of one party's stats: the HE operations by cumulative time,
    everything else by self time (TenSEAL's and SEAL's own frames are inside the HE operations), each less what it
    spent under an HE operation (counted there); with ``top``, also the ``top`` functions by self time."""
    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    seconds: dict[str, float] = {}
    rows = []
    memo: dict = {}
    for key, (_cc, _nc, tottime, cumtime, _callers) in stats.items():
        filename, _line, function = key
        in_he = filename.endswith(os.path.join("crypto", "he.py"))
        # SEAL's serialisation and the level encryptors run under he.py's operations only
        in_levels = filename.endswith(os.path.join("crypto", "level_keys.py"))
        if _is_he_op(key):
            phase, spent = HE_OPS[function], cumtime * (1.0 - _share_under_he(stats, key, 3, memo))
        elif any(lib in f"{filename}:{function}" for lib in ("tenseal", "_sealapi_cpp")) or (
            (in_he and function in _WITHIN_HE) or in_levels
        ):  # TenSEAL's and SEAL's own calls: inside the HE operations above
            continue
        else:
            phase, spent = phase_of(filename, function), tottime * (1.0 - _share_under_he(stats, key, 2, memo))
        seconds[phase] = seconds.get(phase, 0.0) + spent
        rows.append((tottime, phase, f"{Path(filename).name}:{function}"))
    result: dict = {"seconds": dict(sorted(seconds.items(), key=lambda kv: -kv[1]))}
    if top:  # self time: an HE operation shows here as its TenSEAL built-in
        result["top"] = [{"function": f, "phase": p, "seconds": t} for t, p, f in sorted(rows, reverse=True)[:top]]
    return result
