"""Sources of the example Python models; ``generate.py`` writes each as ``<model>/1/model.py``.

They import ``triton_python_backend_utils`` (provided by the server at load time), so read them as
files rather than importing them.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent


def source(name: str) -> str:
    """The ``model.py`` text of example model ``name``."""
    return (HERE / f"{name}.py").read_text(encoding="utf-8")
