"""The profile behind `bench he --profile`: every thread started inside is recorded, and real CKKS work lands in
its phases (cumulative time of the backend primitives), not in "python"."""

from __future__ import annotations

import pstats
import threading
from pathlib import Path

import numpy as np

from vflsec.client import profiling
from vflsec.services.crypto import he


def test_threads_started_inside_are_profiled_and_he_work_is_phased(tmp_path: Path) -> None:
    keys = he.CkksBackend.keyholder()
    out = tmp_path / "party.pstats"

    def work() -> None:
        # Enough HE work (~0.1 s) that a scheduler stall inside a Python frame of a loaded machine stays a small
        # fraction of it: with 3 rounds (~25 ms) stalls put python at up to 0.44 of the HE phases (45 runs).
        for _ in range(10):
            ct = keys.encrypt(np.linspace(-1.0, 1.0, 16))
            keys.decrypt(keys.deserialize(keys.serialize(ct)))
            lowered = keys.encrypt(np.linspace(-1.0, 1.0, 16), form=he.LOWERED)  # a masked product through SEAL
            keys.decrypt_complex(keys.masked_sum([lowered], [np.ones(16)], np.zeros(16)))

    with profiling.profile_threads(out):
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    work()  # after the block: not recorded
    seconds = profiling.phases(out, top=5)["seconds"]
    phased = ("he_encrypt", "he_decrypt", "he_serialisation", "he_ct_x_pt")
    for phase in phased:
        assert seconds.get(phase, 0.0) > 0.0, seconds
    # TenSEAL's and SEAL's own frames, and the Python an HE operation runs, are inside those phases, not counted again
    # as Python (review 26, F3): the phases add up to the threads' time, no more.
    assert seconds.get("python", 0.0) < sum(seconds[phase] for phase in phased)
    own_time = sum(row[2] for row in pstats.Stats(str(out)).stats.values())  # type: ignore[attr-defined]
    assert sum(seconds.values()) <= 1.01 * own_time


def test_phase_of_names_waits_and_grpc() -> None:
    assert profiling.phase_of("~", "<method 'get' of '_queue.SimpleQueue' objects>") == "idle"
    assert profiling.phase_of("/x/grpc/_channel.py", "_blocking") == "grpc_wait"
    assert profiling.phase_of("/x/services/engines/active.py", "train_step") == "python"
