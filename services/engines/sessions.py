"""One session table for the three engines: sessions by ID, checkpointed to a StateDir, with the owner check; and
the parties' cache of the coordinator's rotating training keys."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from vflsec.services.crypto import he
from vflsec.services.engines import checkpoint
from vflsec.services.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, PermissionDenied


class Session(Protocol):
    def to_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]: ...


S = TypeVar("S", bound=Session)

# (epoch, rotation, public keys) of the training-key epoch a party used last.
EpochKeys = tuple[int, int, he.Backend]


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
        self._sessions: dict[str, S] = {
            sid: restore(sid, arrays, meta) for sid, (arrays, meta) in state.load_all().items()
        }

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

    def add(self, session_id: str, s: S) -> None:
        """Save, then publish (caller holds :attr:`lock`, after :meth:`check_absent`)."""
        self.save(session_id, s)
        self._sessions[session_id] = s

    def save(self, session_id: str, s: S) -> None:
        if self.state.enabled:  # the state is built only to be written (a training step saves several times)
            self.state.save(session_id, *s.to_state())

    def close(self, session_id: str) -> S | None:
        s = self._sessions.pop(session_id, None)
        self.state.remove(session_id)
        return s
