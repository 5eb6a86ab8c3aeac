"""One session table for the three engines: sessions by ID, checkpointed to a StateDir, with the owner check; and
the parties' cache of the coordinator's rotating training keys."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from vflsec.services.crypto import he
from vflsec.services.engines import checkpoint
from vflsec.services.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from vflsec.services.models import family as families


class Session(Protocol):
    def to_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]: ...


class RowSet:
    """Row indices (of the aligned rows) a session has seen, e.g. in training batches: a bitmap that grows to
    the largest index. Adding a batch costs O(batch) and its checkpoint n/8 bytes; the Python set it replaces
    was sorted at every step's checkpoint, which made an epoch quadratic in the rows.

    Every update names its ``limit`` (the aligned row count where the engine knows it, else the PSI cap on
    them): the bitmap takes a byte per row up to the largest index, so one index of 2^33 from a peer would
    otherwise take 8 GB."""

    def __init__(self, rows: np.ndarray | Sequence[int] = (), *, limit: int = 0) -> None:
        self._bits = np.zeros(0, dtype=bool)
        if len(rows):
            self.update(rows, limit=limit)

    @staticmethod
    def check(rows: np.ndarray | Sequence[int], *, limit: int) -> np.ndarray:
        """``rows`` as int64 indices, each in [0, limit) (else ValueError, nothing changed)."""
        index = np.asarray(rows, dtype=np.int64).ravel()
        if index.size and int(index.min()) < 0:
            raise ValueError(f"row index {int(index.min())} is negative")
        if index.size and int(index.max()) >= limit:
            raise ValueError(f"row index {int(index.max())} is beyond the {limit} rows a session can align")
        return index

    def update(self, rows: np.ndarray | Sequence[int], *, limit: int) -> None:
        index = self.check(rows, limit=limit)
        if index.size == 0:
            return
        top = int(index.max()) + 1
        if top > self._bits.size:
            grown = np.zeros(min(max(top, 2 * self._bits.size), limit), dtype=bool)
            grown[: self._bits.size] = self._bits
            self._bits = grown
        self._bits[index] = True

    def clear(self) -> None:
        self._bits = np.zeros(0, dtype=bool)

    def __len__(self) -> int:
        return int(np.count_nonzero(self._bits))

    def __contains__(self, row: int) -> bool:
        return 0 <= row < self._bits.size and bool(self._bits[row])

    def members(self, rows: np.ndarray | Sequence[int]) -> np.ndarray:
        """Which of ``rows`` are in the set (a boolean mask over them)."""
        index = np.asarray(rows, dtype=np.int64).ravel()
        inside = (index >= 0) & (index < self._bits.size)
        hit = np.zeros(index.size, dtype=bool)
        hit[inside] = self._bits[index[inside]]
        return hit

    def array(self) -> np.ndarray:
        """The rows, ascending."""
        return np.flatnonzero(self._bits).astype(np.int64)

    def packed(self) -> np.ndarray:
        return np.packbits(self._bits)

    @classmethod
    def restore(cls, arrays: dict[str, np.ndarray], name: str) -> RowSet:
        """From ``arrays[name + "_bits"]`` (:meth:`packed`), or ``arrays[name]`` (the indices, as checkpoints
        before the bitmap held them); empty if neither."""
        rows = cls()
        if f"{name}_bits" in arrays:
            rows._bits = np.unpackbits(np.asarray(arrays[f"{name}_bits"], dtype=np.uint8)).astype(bool)
        elif name in arrays:  # our own checkpoint: its rows were bounded when recorded
            rows.update(arrays[name], limit=int(np.max(arrays[name], initial=-1)) + 1)
        return rows


S = TypeVar("S", bound=Session)

# (epoch, rotation, public keys) of the training-key epoch a party used last.
EpochKeys = tuple[int, int, he.Backend]


def checked_rows(rows: np.ndarray | Sequence[int], limit: int, what: str) -> np.ndarray:
    """:meth:`RowSet.check` for a peer's indices: out of range is INVALID_ARGUMENT naming the bound."""
    try:
        return RowSet.check(rows, limit=limit)
    except ValueError as exc:
        raise InvalidArgument(f"{what}: {exc}") from None


def epoch_keys(
    cached: EpochKeys | None, step: int, backend: str, fetch: Callable[[int], tuple[int, int, bytes]]
) -> EpochKeys:
    """The public keys of step ``step``'s epoch: ``cached`` while the step is in it, else ``fetch(step)`` ->
    (epoch, rotation, public context) from the coordinator, checked to be that step's epoch."""
    if cached is not None and step // cached[1] == cached[0]:
        return cached
    epoch, rotation, context = fetch(step)
    if rotation < 1 or step // rotation != epoch:
        raise FailedPrecondition(f"the coordinator gave epoch {epoch} of {rotation} steps for step {step}")
    return epoch, rotation, he.open_public(backend, context)


class SessionTable(Generic[S]):
    """Sessions restored from ``state`` at start-up (``restore(session_id, arrays, meta)``), saved after every change.

    ``refusal(session_id, s)`` says why a restored session may not go on under the current configuration (then
    every call but closing gets FAILED_PRECONDITION); ``duplicate`` is the AlreadyExists wording of a second create.
    A checkpoint that cannot be read, or whose ``restore`` raises, is set aside (StateDir.set_aside): the party starts
    with every other session, and every call on that one, closing too, gets FAILED_PRECONDITION saying why.
    """

    def __init__(
        self,
        state: checkpoint.StateDir,
        restore: Callable[[str, dict[str, np.ndarray], dict[str, Any]], S],
        *,
        refusal: Callable[[str, S], str | None] = lambda session_id, s: None,
        duplicate: str = "already exists",
    ) -> None:
        self.state = state
        self.refusal = refusal
        self.duplicate = duplicate
        self.lock = threading.Lock()  # guards creation (the table itself); each session has its own lock
        self._sessions: dict[str, S] = {}
        for sid, (arrays, meta) in state.load_all(skip_unreadable=True).items():
            try:
                self._sessions[sid] = restore(sid, arrays, meta)
            except Exception as exc:  # e.g. a secret its defense needs was removed since: it stops no other session
                state.set_aside(sid, f"{sid}.npz: restoring it failed: {type(exc).__name__}: {exc}")

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._sessions))

    def __len__(self) -> int:
        return len(self._sessions)

    def __getitem__(self, session_id: str) -> S:
        """The session as stored, without the checks of :meth:`get` (KeyError if unknown)."""
        return self._sessions[session_id]

    def items(self) -> list[tuple[str, S]]:
        return list(self._sessions.items())

    def get(self, session_id: str, *, closing: bool = False) -> S:
        try:
            s = self._sessions[session_id]
        except KeyError:
            self._check_restored(session_id)
            raise NotFound(f"unknown session {session_id!r}") from None
        refusal = None if closing else self.refusal(session_id, s)
        if refusal is not None:
            raise FailedPrecondition(refusal)
        return s

    def owned(self, session_id: str, caller: str, *, closing: bool = False) -> S:
        """The session, if ``caller`` owns it: another identity of the same CA gets PERMISSION_DENIED."""
        s = self.get(session_id, closing=closing)
        if caller != s.owner:  # type: ignore[attr-defined]  # tables of owned sessions only
            raise PermissionDenied(f"{caller} does not own session {session_id!r}")
        return s

    @staticmethod
    def check_new(session_id: str) -> None:
        if not checkpoint.valid_session_id(session_id):
            raise InvalidArgument(f"invalid session_id {session_id!r}")

    def check_absent(self, session_id: str) -> None:
        """Caller holds :attr:`lock` until :meth:`add`."""
        if session_id in self._sessions:
            raise AlreadyExists(f"session {session_id!r} {self.duplicate}")
        self._check_restored(session_id)  # its files wait for the operator: not overwritten

    def _check_restored(self, session_id: str) -> None:
        """A session whose checkpoint could not be read or restored at start-up: FAILED_PRECONDITION with why."""
        if session_id in self.state.unreadable:
            raise FailedPrecondition(
                f"session {session_id!r} has a checkpoint this party could not restore "
                f"({self.state.unreadable[session_id]}): the operator repairs or removes it first"
            )

    def add(self, session_id: str, s: S) -> None:
        """Save, then publish (caller holds :attr:`lock`, after :meth:`check_absent`)."""
        self.save(session_id, s)
        self._sessions[session_id] = s

    def save(self, session_id: str, s: S) -> None:
        """Checkpoint ``s`` (nothing to do, not even :meth:`to_state`, when sessions live in memory only). A
        session's ``FIXED_STATE`` names the arrays it sets once and never changes in place (StateDir.save)."""
        if self.state.enabled:
            self.state.save(session_id, *s.to_state(), fixed=getattr(s, "FIXED_STATE", ()))

    def close(self, session_id: str) -> S | None:
        s = self._sessions.pop(session_id, None)
        self.state.remove(session_id)
        return s


class FamilySession(Protocol):
    family: str
    trainer: Any


def family_step(session_id: str, s: FamilySession, name: str) -> Callable[..., Any]:
    """The operation ``name`` of the session's trainer behind a vflsec.v1 message (LR's training_scores and
    block_sums). A session whose family has none is refused before anything is admitted, decrypted or changed."""
    step = getattr(s.trainer, name, None)
    if step is None:
        raise _no_step(session_id, s, name)
    return step


def declared_step(session_id: str, s: FamilySession, host: str, name: str, role: str) -> families.FamilyStep:
    """The family's own step ``name`` hosted by role ``host`` (ModelFamily.steps), if a caller of certificate role
    ``role`` may call it: a session whose family declares none is refused (FAILED_PRECONDITION) before anything is
    admitted, decrypted or changed, a caller the step does not name gets PERMISSION_DENIED."""
    step = families.get(s.family).steps.get(host, {}).get(name)
    if step is None:
        raise _no_step(session_id, s, name)
    if role not in step.callers:
        raise PermissionDenied(f"the {role} party may not call {name.replace('_', ' ')} of session {session_id!r}")
    return step


def _no_step(session_id: str, s: FamilySession, name: str) -> FailedPrecondition:
    return FailedPrecondition(f"session {session_id!r} trains {s.family}, which has no {name.replace('_', ' ')}")
