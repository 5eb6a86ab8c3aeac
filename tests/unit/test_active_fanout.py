"""The active party's fan-out to its passive parties ends every call before it reports a failure, so an Align that
failed at one party is never retried while the call to another is still running (it would then hold that
party's one PSI exchange and refuse the retry)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from vflsec.services.engines.active import ActiveParty


def test_a_failure_is_reported_only_after_every_other_call_ended() -> None:
    finished = threading.Event()

    def call(party: str, client: object) -> str:
        if party == "passive-1":
            raise RuntimeError("passive-1 refused")
        time.sleep(0.3)  # the slower party: still running when passive-1 fails
        finished.set()
        return party

    with ThreadPoolExecutor(max_workers=2) as pool:
        engine = SimpleNamespace(_pool=pool, passives={"passive-1": object(), "passive-2": object()})
        with pytest.raises(RuntimeError, match="passive-1 refused"):
            ActiveParty._each_passive(engine, call)
        assert finished.is_set()


def test_results_come_in_party_order() -> None:
    def call(party: str, client: object) -> str:
        time.sleep(0.1 if party == "passive-1" else 0.0)
        return party

    with ThreadPoolExecutor(max_workers=2) as pool:
        engine = SimpleNamespace(_pool=pool, passives={"passive-1": object(), "passive-2": object()})
        assert ActiveParty._each_passive(engine, call) == ["passive-1", "passive-2"]
