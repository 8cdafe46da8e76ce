"""kubeinfer's additions to Triton's statistics rows, named once for the server that writes them and the
operator that reads them."""

from __future__ import annotations

#: a version's request latency histogram in its HTTP statistics row (``GET /v2/models/<m>/stats``):
#: ``{"bounds_us": [upper bounds], "counts": [requests per bucket, +Inf last]}``; gRPC keeps Triton's fields
LATENCY_KEY = "kubeinfer_request_duration_us"
