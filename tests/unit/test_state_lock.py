"""One party process per state folder (review 19 L4): a second one would sweep the first one's in-flight
temporary files at start and keep its own count of every owner's query budget."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vflsec.services.engines import checkpoint


def test_a_held_folder_is_refused_before_anything_in_it_is_swept(tmp_path: Path) -> None:
    holder = checkpoint.StateDir(tmp_path, exclusive=True)
    in_flight = tmp_path / ".owners.abc123.tmp"  # the holder's write between mkstemp and rename
    in_flight.write_bytes(b"x")
    with pytest.raises(checkpoint.StateInUse, match=f"state folder {tmp_path} is held by another running"):
        checkpoint.StateDir(tmp_path, exclusive=True)
    assert in_flight.exists()
    checkpoint.StateDir(tmp_path / "sub")  # not exclusive (a party's own subfolders): no lock taken
    holder.release()
    holder.release()  # twice is harmless
    taken = checkpoint.StateDir(tmp_path, exclusive=True)
    assert not in_flight.exists()  # the new holder swept what nobody writes any more
    taken.release()


def test_another_process_is_refused_and_a_dead_holder_leaves_the_folder_free(tmp_path: Path) -> None:
    hold = (
        "import sys, time; from pathlib import Path; from vflsec.services.engines import checkpoint; "
        "checkpoint.StateDir(Path(sys.argv[1]), exclusive=True); print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(checkpoint.StateInUse):
            checkpoint.StateDir(tmp_path, exclusive=True)
    finally:
        holder.kill()  # a kill -9 drops the flock with the process
        holder.wait()
    checkpoint.StateDir(tmp_path, exclusive=True).release()
