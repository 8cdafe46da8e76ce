"""Backends execute one model version; they know nothing about HTTP or gRPC.

Built-in: ``onnxruntime``; more (``python``, ``tensorrt`` and third-party ones) are discovered through
the ``kubeinfer.backends`` entry-point group.
"""
