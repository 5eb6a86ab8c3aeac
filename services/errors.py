"""Errors the engines raise; the servicers turn each into its gRPC status (see ``services/transport/server.py``).

A code is the name of a ``grpc.StatusCode`` (plain text: the engines that raise these import no gRPC)."""

from __future__ import annotations


class ServiceError(Exception):
    code: str = "INTERNAL"


class InvalidArgument(ServiceError):
    code = "INVALID_ARGUMENT"


class NotFound(ServiceError):
    code = "NOT_FOUND"


class FailedPrecondition(ServiceError):
    code = "FAILED_PRECONDITION"


class AlreadyExists(ServiceError):
    code = "ALREADY_EXISTS"


class PermissionDenied(ServiceError):
    code = "PERMISSION_DENIED"


class ResourceExhausted(ServiceError):
    code = "RESOURCE_EXHAUSTED"


class PeerFailed(ServiceError):
    """A call this service made to another party failed (its status ``code`` and ``details``); that status is
    passed on."""

    def __init__(self, peer: str, code: str, details: str) -> None:
        super().__init__(f"call to {peer} failed: {code}: {details}")
        self.code = code
