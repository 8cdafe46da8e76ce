"""The protocol-neutral vocabulary every layer speaks: requests and responses, typed errors, tensors and
data types, and the small interface schedulers and backends use to reach the registry.

No I/O, no threads, no knowledge of HTTP, gRPC, backends or the runtime: anything may import it.
"""
