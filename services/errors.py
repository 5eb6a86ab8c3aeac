"""Errors the engines raise; the servicers turn each into its gRPC status (see ``services/transport/server.py``)."""

from __future__ import annotations

import grpc


class ServiceError(Exception):
    code: grpc.StatusCode = grpc.StatusCode.INTERNAL


class InvalidArgument(ServiceError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(ServiceError):
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(ServiceError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class AlreadyExists(ServiceError):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(ServiceError):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(ServiceError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class PeerFailed(ServiceError):
    """A call this service made to another party failed; carries that party's status."""

    def __init__(self, peer: str, error: grpc.RpcError) -> None:
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNAVAILABLE
        details = error.details() if hasattr(error, "details") else str(error)
        super().__init__(f"call to {peer} failed: {code.name}: {details}")
        self.code = grpc.StatusCode.UNAVAILABLE if code == grpc.StatusCode.UNAVAILABLE else code
