"""Entry point of a stub process: ``<python> stub_boot.py <socket fd> <arena bytes>``.

Imports the Python backend's folder (this folder's parent) as the package ``_kubeinfer_python_backend``
without leaving either on ``sys.path`` (its module names must not shadow a model's own ``helper`` or
``context``), then runs ``stub.main``; only ``stub`` and ``model_api`` (and ``ipc``) are imported there. Runs
under the server's interpreter or a model's ``EXECUTION_ENV_PATH`` one: standard library and numpy only.
"""

import importlib.util
import os
import sys

if __name__ == "__main__":
    _here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _here:
        del sys.path[0]
    _root = os.path.dirname(_here)
    _spec = importlib.util.spec_from_file_location(
        "_kubeinfer_python_backend", os.path.join(_root, "__init__.py"), submodule_search_locations=[_root]
    )
    assert _spec is not None and _spec.loader is not None
    _package = importlib.util.module_from_spec(_spec)
    sys.modules["_kubeinfer_python_backend"] = _package
    _spec.loader.exec_module(_package)
    from _kubeinfer_python_backend.stub import stub  # type: ignore[import-not-found]

    stub.main(sys.argv[1:])
