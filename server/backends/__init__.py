"""Backends execute one model version; they know nothing about HTTP or gRPC.

Built in (``loader._BUILTIN``, imported only when a model needs them): ``onnxruntime``, ``tensorrt``,
``pytorch``, ``tensorflow`` and ``python``; third-party backends are discovered through the
``kubeinfer.backends`` entry-point group (the test suite's ``sleep`` backend is one).
"""
