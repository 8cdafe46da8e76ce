"""``kubeinfer perf``: load-test any KServe v2 server (kubeinfer, Triton, MLServer) over HTTP or gRPC.

perf_analyzer's flag names where they overlap, so scripts carry over:

    kubeinfer perf -m resnet -u 127.0.0.1:8001 -i grpc --concurrency-range 1:16:4 --json out.json --plot out.png
    kubeinfer perf -m add_sub --request-rate-range 100:400:100 --request-distribution poisson -f out.csv

Closed loop (``--concurrency-range start:end:step``, requests in flight) or open loop
(``--request-rate-range``, constant or Poisson arrivals). Each level: a warm-up, then windows of
``--measurement-interval`` ms until the last three agree within ``--stability-percentage`` (throughput
and the ``--percentile`` latency) or ``--max-trials`` is reached. Per level: throughput, latency
percentiles, errors (counted, with their messages), the server-side split from the statistics API
(queue, compute input/infer/output, average batch), the load generator's own CPU use, and the
server's CPU per request when ``--server-pid`` names a local server process.
"""

from .cli import add_arguments, run

__all__ = ["add_arguments", "run"]
