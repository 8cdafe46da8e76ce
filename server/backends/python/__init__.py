"""Python backend: Triton-style ``model.py`` files (``class TritonPythonModel``) run in-process.

``triton_python_backend_utils`` is this package's module of the same name; the backend registers it in
``sys.modules`` so ``import triton_python_backend_utils as pb_utils`` works in unchanged Triton models.
"""
