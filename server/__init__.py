"""kubeinfer.server: a Triton-compatible KServe v2 inference server.

Layers, bottom to top; a module imports only from its own layer or the ones below
(``tests/unit/test_layers.py`` holds this, and that no two packages import each other):

1. vocabulary: ``vocabulary`` (request/response types, typed errors, tensors, data types, the
   ``RegistryView`` protocol), ``config`` (the ModelConfig schema, the platform table, version policy)
   ``repository`` (the on-disk layout and atomic-publish contract) and ``sources`` (where model files come
   from: the egress guard and the one downloader of every store). What server and operator share; the
   operator imports nothing else from the server.
2. ``backends``: execute a batch on an instance (onnxruntime, tensorrt, pytorch, tensorflow, python).
3. ``scheduling``: default scheduler, dynamic batcher, ensemble, instance pool.
4. ``runtime`` (lifecycle, registry, ``InferenceService`` and its repository poll loop) with ``observability``
   beside it (statistics and Prometheus metrics from the same records).
5. front ends: ``http``, ``grpc``, ``openai`` (wire format ⇄ vocabulary, calling ``runtime.service``; ``openai``
   is the OpenAI-compatible API on ``--openai-port``) and ``sharedmemory`` (client-registered regions the front
   ends read inputs from and write outputs to).
6. ``app``, ``cli``, ``tools``, ``examples``: wiring, flags and commands.

Why these names: ``vocabulary`` says what the bottom layer is (the words every layer speaks) without
claiming to be the "core" that everything orbits, which is what made the old ``core`` package both the
bottom and the top; ``runtime`` is the part that runs models (MLServer's ``handlers`` plus Triton's
model lifecycle); ``config`` and ``repository`` keep the names Triton users know for the two artefacts
the operator writes.
"""

__version__ = "0.1.0"
SERVER_NAME = "kubeinfer"
