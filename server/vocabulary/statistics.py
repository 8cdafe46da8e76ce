"""kubeinfer's additions to Triton's statistics rows, named once for the server that writes them and the
operator that reads them."""

from __future__ import annotations

#: a version's request latency histogram in its HTTP statistics row (``GET /v2/models/<m>/stats``):
#: ``{"bounds_us": [upper bounds], "counts": [requests per bucket, +Inf last]}``; gRPC keeps Triton's fields
LATENCY_KEY = "kubeinfer_request_duration_us"

#: the requests that named no version and that the model's traffic weights (``kubeinfer.version_traffic``)
#: sent to this version, in its HTTP statistics row once it has any: ``{"success": {"count", "ns"}, "fail":
#: {"count", "ns"}, LATENCY_KEY: {"bounds_us", "counts"}}``. The operator judges a canary by these alone: a
#: caller that names a version is outside the weighted split and must not move its numbers (gRPC keeps
#: Triton's fields)
ROUTED_KEY = "kubeinfer_routed"
