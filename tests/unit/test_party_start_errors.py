"""A party process that stops at start (a bad shard, a defense its data cannot take) fails the caller with the
end of that party's log, not only "exited": the reason is written for its operator."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from vflsec.client.federation.launcher import wait_for


def test_a_party_that_exits_at_start_fails_with_the_end_of_its_log(tmp_path: Path) -> None:
    log = tmp_path / "passive-1.log"
    log.write_text(
        "starting passive-1\n\nValueError: masquerade drop=binary: every column of this party is binary (flag)\n"
    )
    with grpc.insecure_channel("127.0.0.1:9") as channel:  # never asked: the party has already exited
        with pytest.raises(RuntimeError, match=r"passive-1 exited during start-up; the end of .*passive-1.log:\n"
                           r"starting passive-1\nValueError: masquerade drop=binary: every column"):  # fmt: skip
            wait_for(channel, "passive-1", 5.0, alive=lambda: False, log_file=log)
        with pytest.raises(RuntimeError, match=r"^passive-1 exited during start-up$"):  # no log to show
            wait_for(channel, "passive-1", 5.0, alive=lambda: False, log_file=tmp_path / "missing.log")
