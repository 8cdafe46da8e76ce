"""What a ``model.py`` sees: ``triton_python_backend_utils`` and the request, response, tensor and metric
types behind it, bound to their host (a stub process or the server) through ``context``. Stub-safe:
standard library and numpy only."""
