"""Typed errors, mapped once to HTTP status codes and gRPC status codes.

Front ends never invent status codes: they read ``http_status`` / ``grpc_code`` from the error.
The table is Triton's, one class per ``TRITONSERVER_Error_Code``: server/src/http_server.cc
``HttpCodeFromError`` (INTERNAL 500, NOT_FOUND 404, UNAVAILABLE 503, UNSUPPORTED 501; UNKNOWN,
INVALID_ARG, ALREADY_EXISTS and CANCELLED 400) and src/grpc/grpc_utils.cc ``CodeToStatus`` (UNKNOWN,
INTERNAL, NOT_FOUND, INVALID_ARGUMENT, UNAVAILABLE, UNIMPLEMENTED for UNSUPPORTED, ALREADY_EXISTS,
CANCELLED). Checked against Triton 2.51 with a model returning each code (tests/integration/test_errors.py).
"""

from __future__ import annotations


class ServerError(Exception):
    """Base of every error a client may see; the message is shown verbatim."""

    http_status = 400
    grpc_code = "UNKNOWN"
    #: label used by ``nv_inference_request_failure{reason=...}``
    failure_reason = "OTHER"

    def __init__(self, message: str, failure_reason: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if failure_reason is not None:
            self.failure_reason = failure_reason

    def __str__(self) -> str:
        return self.message


class Unknown(ServerError):
    """TRITONSERVER_ERROR_UNKNOWN: 400 / UNKNOWN."""


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


class DecoupledModelCall(Unsupported):
    """A one-response call (HTTP ``/infer``, gRPC ``ModelInfer``, BLS ``exec()``) to a decoupled model.

    Each caller answers with Triton's own text for its protocol (``HTTP_MESSAGE``/``GRPC_MESSAGE``,
    from server/src/http_server.cc ``CheckTransactionPolicy`` and src/grpc/infer_handler.cc).
    """

    HTTP_MESSAGE = "HTTP end point doesn't support models with decoupled transaction policy"
    GRPC_MESSAGE = "ModelInfer RPC doesn't support models with decoupled transaction policy"


#: Triton's error code names (``TRITONSERVER_Error_Code`` / ``pb_utils.TritonError``) → error class
BY_CODE: dict[str, type[ServerError]] = {
    "UNKNOWN": Unknown,
    "INTERNAL": InternalError,
    "NOT_FOUND": NotFound,
    "INVALID_ARG": InvalidArgument,
    "UNAVAILABLE": Unavailable,
    "UNSUPPORTED": Unsupported,
    "ALREADY_EXISTS": AlreadyExists,
    "CANCELLED": Cancelled,
}


def error_for_code(code: str, message: str, failure_reason: str | None = None) -> ServerError:
    """The typed error for a Triton error code name; unknown names are INTERNAL (as Triton's default)."""
    return BY_CODE.get(code, InternalError)(message, failure_reason)


def code_of(error: ServerError) -> str:
    """The Triton error code name of ``error`` (the inverse of ``error_for_code``)."""
    for name, cls in BY_CODE.items():
        if type(error) is cls:
            return name
    return _CODE_BY_GRPC.get(error.grpc_code, "INTERNAL")


_CODE_BY_GRPC = {
    "UNKNOWN": "UNKNOWN",
    "INTERNAL": "INTERNAL",
    "NOT_FOUND": "NOT_FOUND",
    "INVALID_ARGUMENT": "INVALID_ARG",
    "UNAVAILABLE": "UNAVAILABLE",
    "UNIMPLEMENTED": "UNSUPPORTED",
    "ALREADY_EXISTS": "ALREADY_EXISTS",
    "CANCELLED": "CANCELLED",
}
