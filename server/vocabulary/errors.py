"""Typed errors, mapped once to HTTP status codes and gRPC status codes.

Front ends never invent status codes: they read ``http_status`` / ``grpc_code`` from the error.
The table follows Triton (NOT_FOUND 404, UNAVAILABLE 503, UNSUPPORTED 501, INTERNAL 500, the rest 400).
"""

from __future__ import annotations


class ServerError(Exception):
    """Base of every error a client may see; the message is shown verbatim."""

    http_status = 400
    grpc_code = "UNKNOWN"
    #: label used by ``nv_inference_request_failure{reason=...}``
    failure_reason = "OTHER"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidArgument(ServerError):
    http_status = 400
    grpc_code = "INVALID_ARGUMENT"


class NotFound(ServerError):
    http_status = 404
    grpc_code = "NOT_FOUND"


class Unavailable(ServerError):
    http_status = 503
    grpc_code = "UNAVAILABLE"


class QueueRejected(Unavailable):
    """Queue full or queue timeout: the scheduler refused the request."""

    failure_reason = "REJECTED"


class Cancelled(ServerError):
    http_status = 400
    grpc_code = "CANCELLED"
    failure_reason = "CANCELED"


class PayloadTooLarge(ServerError):
    """A request bigger than a size limit (HTTP body); gRPC answers its own oversize messages alike."""

    http_status = 413
    grpc_code = "RESOURCE_EXHAUSTED"


class DeadlineExceeded(ServerError):
    """The request did not finish within the server's request timeout."""

    http_status = 504
    grpc_code = "DEADLINE_EXCEEDED"


class Unsupported(ServerError):
    http_status = 501
    grpc_code = "UNIMPLEMENTED"


class AlreadyExists(ServerError):
    http_status = 400
    grpc_code = "ALREADY_EXISTS"


class InternalError(ServerError):
    http_status = 500
    grpc_code = "INTERNAL"


class BackendError(ServerError):
    """The model itself failed while executing (a raising model.py, an ORT runtime error)."""

    http_status = 500
    grpc_code = "INTERNAL"
    failure_reason = "BACKEND"


def internal_error_message(exc: BaseException) -> str:
    """What a client sees for an unexpected exception (a bug): HTTP 500 and gRPC INTERNAL alike."""
    return f"internal error: {type(exc).__name__}: {exc}"
