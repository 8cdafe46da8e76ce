"""Python backend: Triton-style ``model.py`` files (``class TritonPythonModel``), in a stub process or in-process.

Split by audience, so what runs where is visible from the path:

* ``server_side``: what runs in the server process (the backend, the stub's server end, the in-process
  instance, execution environments);
* ``stub``: the stub process (started as ``<python> stub/stub_boot.py``, possibly under a model's own
  ``EXECUTION_ENV_PATH`` interpreter: standard library and numpy only) and the model runner it shares with
  the in-process instance;
* ``model_api``: what a ``model.py`` sees, ``triton_python_backend_utils`` and the types behind it (the
  backend and the stub register that module in ``sys.modules`` under its own name, so
  ``import triton_python_backend_utils as pb_utils`` works in unchanged Triton models);
* ``ipc``: the wire between the server and a stub (messages, shared memory), imported by both sides.

``stub`` and ``model_api`` never import ``server_side`` (tests/unit/test_python_stub_imports.py).
"""
