"""The `[policy] allowed_backends` rule, shared by the coordinator and the passive parties.

`plain` hides nothing, so a party takes part in a plain session only when its own operator allows it: a new
session on another backend is refused, and a restored one whose backend the policy no longer names is refused
on every call but CloseSession.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vflsec.services.errors import PermissionDenied


@dataclass(frozen=True)
class BackendPolicy:
    who: str  # names the party in messages, e.g. "this coordinator's" or "passive-1's"
    allowed: tuple[str, ...]

    @classmethod
    def of(cls, who: str, allowed: Sequence[str]) -> BackendPolicy:
        return cls(who, tuple(allowed))

    def require(self, backend_name: str) -> None:
        """PermissionDenied unless a new session may run on ``backend_name``."""
        if backend_name not in self.allowed:
            raise PermissionDenied(
                f"backend {backend_name!r} is not allowed by {self.who} [policy] allowed_backends {list(self.allowed)}"
            )

    def refusal(self, session_id: str, backend_name: str) -> str | None:
        """Why a restored session on ``backend_name`` may not go on, if the policy changed since it opened."""
        if backend_name in self.allowed:
            return None
        return (
            f"session {session_id!r} runs on {backend_name!r}, which {self.who} [policy] allowed_backends "
            f"{list(self.allowed)} no longer allows; close it"
        )
