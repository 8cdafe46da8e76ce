"""kubeinfer.server: a Triton-compatible KServe v2 inference server.

Layers, outermost first: ``http``/``grpc`` front ends → ``core`` (registry, lifecycle) →
``scheduling`` (default, dynamic batcher, ensemble) → ``backends`` (onnxruntime, tensorrt, python).
"""

__version__ = "0.1.0"
SERVER_NAME = "kubeinfer"
