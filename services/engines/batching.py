"""Concurrent requests gathered into one batch: the active party's batched Predicts (docs/protocol.md, "Inference and
release"). Per-request cost (one admission, one share and one release RPC each, and their checkpoints) dominated
serving; a batch pays them once while every request keeps its own admission and release.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

# A batch gathers while submitters keep joining it, each within a window of the last, for at most this many windows.
# Concurrent callers come back as a cohort spread over several milliseconds (each reply and each new request pass
# through one GIL at either end); a fixed window cut a cohort into a large round and small ones, each costing every
# party its calls (docs/performance.md, session 15: 12-14 requests a round with one window, 17-18 gathering).
GATHER_WINDOWS = 5

Item = TypeVar("Item")
Outcome = TypeVar("Outcome")


def _held() -> threading.Lock:
    """A lock taken at once: released by whoever ends the wait. A bare lock, not an Event (a Condition and a waiter
    lock per wait): under load, Condition.wait was 15 % of the active party's Python in a profile, 2 % after."""
    lock = threading.Lock()
    lock.acquire()
    return lock


@dataclass
class _Slot(Generic[Item]):
    item: Item
    done: threading.Lock = field(default_factory=_held)  # released once its outcome is set
    outcome: object = None


@dataclass
class _Batch:
    slots: list[_Slot] = field(default_factory=list)
    rows: int = 0
    full: bool = False
    ready: threading.Lock = field(default_factory=_held)  # released when full: its leader need not wait out the window
    joined: float = 0.0  # when the last submitter joined (time.monotonic())


class Batcher(Generic[Item, Outcome]):
    """Runs concurrent submissions in batches: the first submitter of a batch waits for others to join until none has
    joined for ``window`` seconds, at most ``windows`` windows in all (less once the batch holds ``max_items`` items or
    ``max_rows`` rows), and then, while ``rounds`` batches are running, until one ends (the batch still gathering:
    the busier the service, the larger its batches); then it runs ``run`` on all of them in its own thread. A
    submitter arriving meanwhile opens the next batch. ``run`` returns one outcome per item, in order: a value, or an
    exception that only that item's submitter raises."""

    def __init__(
        self,
        run: Callable[[list[Item]], Sequence[Outcome | BaseException]],
        window: float,
        max_rows: int,
        max_items: int,
        rounds: int = 2,
        windows: float = GATHER_WINDOWS,
    ) -> None:
        if window <= 0 or max_rows < 1 or max_items < 1 or rounds < 1 or windows < 1:
            raise ValueError(
                f"invalid batching: {window=} (> 0), {max_rows=}, {max_items=}, {rounds=}, {windows=} (>= 1)"
            )
        self._run, self.window, self.max_rows, self.max_items = run, window, max_rows, max_items
        self.windows = windows
        self._lock = threading.Lock()
        self._open: _Batch | None = None
        self._rounds = threading.BoundedSemaphore(rounds)

    def submit(self, item: Item, rows: int) -> Outcome:
        slot = _Slot(item)
        with self._lock:
            batch = self._open
            leader = batch is None or len(batch.slots) >= self.max_items or batch.rows + rows > self.max_rows
            if leader:
                batch = self._open = _Batch()
            batch.slots.append(slot)
            batch.joined = time.monotonic()
            batch.rows += rows
            if not batch.full and (len(batch.slots) >= self.max_items or batch.rows >= self.max_rows):
                batch.full = True
                batch.ready.release()
        if leader:
            self._gather(batch)
            with self._rounds:
                with self._lock:
                    if self._open is batch:  # closed: later submitters open the next batch
                        self._open = None
                self._complete(batch.slots)
        slot.done.acquire()
        if isinstance(slot.outcome, BaseException):
            raise slot.outcome
        return slot.outcome  # type: ignore[return-value]

    def _gather(self, batch: _Batch) -> None:
        """Until ``batch`` is full, or no submitter has joined it for a window, or ``windows`` windows have passed."""
        end = time.monotonic() + self.windows * self.window
        while True:
            wait = min(batch.joined + self.window, end) - time.monotonic()
            if wait <= 0 or batch.ready.acquire(timeout=wait):
                return

    def _complete(self, slots: list[_Slot]) -> None:
        try:
            outcomes = list(self._run([slot.item for slot in slots]))
            if len(outcomes) != len(slots):
                raise RuntimeError(f"a batch of {len(slots)} items had {len(outcomes)} outcomes")
        except BaseException as exc:  # the whole batch failed (e.g. a peer down): every submitter hears of it
            outcomes = [exc] * len(slots)
        for slot, outcome in zip(slots, outcomes, strict=True):
            slot.outcome = outcome
            slot.done.release()
