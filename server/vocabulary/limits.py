"""What one request may ask of the server, and the running count that enforces it while decoding.

An inference server takes arbitrary bytes from the network: every size a request declares (body,
shape, element count, BYTES element length, number of inputs) is checked against these limits before
memory is allocated for it, and a refusal names the flag that raises the limit. Both front ends and
the tensor decoders share one ``Limits`` (set from the command line in ``cli``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InvalidArgument, PayloadTooLarge

MIB = 1 << 20


#: largest product of the non-zero dims of an empty tensor: numpy refuses a shape whose non-zero dims
#: times the item size reach 2**63 ("array is too big"), and 2**56 x 8-byte elements (INT64, FP64, BYTES'
#: object pointers; 16 bytes would still fit) stays far below it. 2**60 did not (2**60 x 8 = 2**63).
MAX_EMPTY_SPAN = 2**56


@dataclass(frozen=True)
class Limits:
    #: largest HTTP request body (Triton's ``--http-max-input-size``, same 64 MiB default)
    http_max_input_size: int = 64 * MIB
    #: largest gRPC message, both directions
    grpc_max_message_bytes: int = 256 * MIB
    #: request line plus headers (HTTP) and metadata (gRPC)
    max_header_bytes: int = 16 * 1024
    #: elements in one input tensor (the product of its shape)
    max_tensor_elements: int = 1 << 27
    #: elements in all the inputs of one request together
    max_request_elements: int = 1 << 28
    #: bytes in one BYTES element
    max_bytes_element_size: int = 64 * MIB
    #: inputs in one request
    max_inputs: int = 1024
    #: requests of one gRPC ModelStreamInfer stream that run at once; the stream reads no further meanwhile
    grpc_max_stream_inflight: int = 128
    #: seconds one inference request may take end to end (0: no limit)
    request_timeout: float = 300.0
    #: seconds an HTTP request's head may take to arrive, from its first byte or the connection (0: no limit)
    http_header_timeout: float = 30.0
    #: seconds an HTTP request's body may take to arrive once its head has (0: no limit)
    http_body_timeout: float = 60.0
    #: open HTTP connections past which requests are answered 503 (0: no limit)
    http_max_connections: int = 1000


DEFAULT_LIMITS = Limits()


def body_too_large(size: int | str, limit: int) -> PayloadTooLarge:
    """Triton's wording, so clients that match on it keep working."""
    return PayloadTooLarge(
        f"Request size of {size} bytes exceeds the maximum allowed value of {limit} bytes. "
        "Use --http-max-input-size to increase the limit."
    )


class RequestBudget:
    """Counts one request's inputs and elements as they are decoded; raises before data is allocated."""

    __slots__ = ("limits", "inputs", "elements")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.inputs = 0
        self.elements = 0

    def check_input_count(self, count: int) -> None:
        if count > self.limits.max_inputs:
            raise InvalidArgument(
                f"the request has {count} inputs, over the limit of {self.limits.max_inputs} (--max-inputs)"
            )

    def add_input(self, name: str, shape: list[int]) -> int:
        """Account for one input of ``shape`` (already checked non-negative); returns its element count."""
        self.inputs += 1
        self.check_input_count(self.inputs)
        count = 0 if 0 in shape else 1
        if not count:
            # an empty tensor still needs a shape numpy can represent: its other dims times the element
            # size must fit in 63 bits ([0, 3e9, 3e9] raised "array is too big": found by fuzzing)
            span = 1
            for d in shape:
                span *= d or 1
                if span > MAX_EMPTY_SPAN:
                    raise InvalidArgument(
                        f"input '{name}' with shape {shape} cannot be represented: its non-zero dims span more "
                        f"than {MAX_EMPTY_SPAN} elements"
                    )
        limit = self.limits.max_tensor_elements
        for d in shape if count else ():
            count *= d
            if count > limit:  # stop multiplying early: dims like [2**62, 2**62] stay cheap
                break
        if count > limit:
            raise InvalidArgument(
                f"input '{name}' with shape {shape} has more than {limit} elements, the limit per tensor "
                "(--max-tensor-elements)"
            )
        self.elements += count
        if self.elements > self.limits.max_request_elements:
            raise InvalidArgument(
                f"the request's inputs hold more than {self.limits.max_request_elements} elements together, "
                "the limit per request (--max-request-elements)"
            )
        return count

    def check_bytes_element(self, name: str, index: int, length: int) -> None:
        if length > self.limits.max_bytes_element_size:
            raise InvalidArgument(
                f"input '{name}': BYTES element {index} is {length} bytes, over the limit of "
                f"{self.limits.max_bytes_element_size} (--max-bytes-element-size)"
            )
