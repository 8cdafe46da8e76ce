"""PyTorch backend: platform ``pytorch_libtorch`` / backend ``pytorch``, as Triton's PyTorch backend.

Model file: ``<version>/model.pt`` or ``default_model_filename``. What the file holds decides how it
loads (see ``artifact``): TorchScript via ``torch.jit.load`` (Triton's format), or — beyond Triton — a
``torch.export`` program (``torch.export.save``; name it ``model.pt2`` and set
``default_model_filename: "model.pt2"``) via ``torch.export.load(...).module()``.

Tensor names bind by Triton's rules (``naming``): forward-argument names, else ``<name>__<index>``
positions (``INPUT__0``, ``OUTPUT__0``), else config order; tuple/list results map by index, a dict
result by name. Data types: BOOL, UINT8, INT8/16/32/64, FP16, BF16, FP32, FP64 tensors and
``TYPE_STRING`` as one-dimensional ``List[str]``. There is no auto-complete (as Triton): the config
lists every input and output.

Each instance loads its own module on its device (``KIND_CPU``, or ``KIND_GPU`` on the group's
``gpus`` with its own CUDA stream) unless ``ENABLE_WEIGHT_SHARING`` is set. TorchScript runs
``forward`` in C++ with the GIL released, so instances execute in parallel; an exported program runs
as a Python ``GraphModule`` and releases the GIL inside each operator only. Parameters: ``parameters``.
``torch`` is imported only when a PyTorch model loads; without it (``pip install kubeinfer[pytorch]``)
that model is UNAVAILABLE with the reason and the server serves the rest.
"""

from .backend import INSTALL_HINT, PyTorchBackend, require_torch

__all__ = ["INSTALL_HINT", "PyTorchBackend", "require_torch"]
