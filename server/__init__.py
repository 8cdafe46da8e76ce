"""kubeinfer.server: a Triton-compatible KServe v2 inference server.

The packages form layers, from ``vocabulary`` (what server and operator share) up to the wiring (``app``,
``cli``); a module imports only from its own layer or the ones below. The map, with what each unit holds, is
data in ``kubeinfer.server.layers``: ``tests/unit/test_layers.py`` checks every import against it, and the
layer table in ``docs/architecture.md`` is generated from it.

Why these names: ``vocabulary`` says what the bottom layer is (the words every layer speaks) without
claiming to be the "core" that everything orbits, which is what made the old ``core`` package both the
bottom and the top; ``runtime`` is the part that runs models (MLServer's ``handlers`` plus Triton's
model lifecycle); ``config`` and ``repository`` keep the names Triton users know for the two artefacts
the operator writes.
"""

__version__ = "0.1.0"
SERVER_NAME = "kubeinfer"
