"""The protocol-neutral vocabulary every layer speaks: requests and responses (and ``ResponseStream``, the
responses of a decoupled model), typed errors, tensors and data types, custom metric families, and the
small interface schedulers and backends use to reach the registry.

No I/O, no knowledge of HTTP, gRPC, backends or the runtime: anything may import it.
"""
