"""Triton's PyTorch backend parameters (``config.pbtxt`` ``parameters``), parsed and checked at load.

Per model: ``INFERENCE_MODE`` (default true, as current Triton: ``torch.inference_mode``; false runs
under ``torch.no_grad``, for models that need autograd-visible tensors), ``DISABLE_OPTIMIZED_EXECUTION``
(TorchScript graph optimizations off: avoids the long first calls of the profiling executor),
``ENABLE_CACHE_CLEANING`` (``torch.cuda.empty_cache()`` after each GPU execution),
``ENABLE_WEIGHT_SHARING`` (instances on one device share one module; never for stateful models).

Process-wide in PyTorch (the last model loaded that sets one wins; a conflicting value is logged):
``ENABLE_JIT_EXECUTOR``, ``ENABLE_JIT_PROFILING``, ``ENABLE_TENSOR_FUSER``, ``DISABLE_CUDNN``,
``INTRA_OP_THREAD_COUNT`` (``torch.set_num_threads``) and ``INTER_OP_THREAD_COUNT``
(``torch.set_num_interop_threads``, which PyTorch accepts only before its first parallel work).
``ENABLE_NVFUSER`` is accepted and ignored with a warning: PyTorch removed NVFuser.
Unknown keys are ignored, as Triton does. Parsed, and refused in the same words, by ``backends.parameters``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...config import pb
from ..parameters import bool_parameter, count_parameter


@dataclass(frozen=True)
class TorchParameters:
    inference_mode: bool = True
    optimized_execution: bool = True
    cache_cleaning: bool = False
    weight_sharing: bool = False
    cudnn: bool | None = None
    jit_executor: bool | None = None
    jit_profiling: bool | None = None
    tensor_fuser: bool | None = None
    nvfuser: bool | None = None
    intra_op_threads: int | None = None
    inter_op_threads: int | None = None


def _count(config: pb.ModelConfig, key: str) -> int | None:
    return count_parameter(config, key, minimum=1, backend="PyTorch")


def parse_parameters(config: pb.ModelConfig) -> TorchParameters:
    disable_opt = bool_parameter(config, "DISABLE_OPTIMIZED_EXECUTION")
    inference = bool_parameter(config, "INFERENCE_MODE")
    disable_cudnn = bool_parameter(config, "DISABLE_CUDNN")
    return TorchParameters(
        inference_mode=True if inference is None else inference,
        optimized_execution=not disable_opt if disable_opt is not None else True,
        cache_cleaning=bool(bool_parameter(config, "ENABLE_CACHE_CLEANING")),
        weight_sharing=bool(bool_parameter(config, "ENABLE_WEIGHT_SHARING")),
        cudnn=None if disable_cudnn is None else not disable_cudnn,
        jit_executor=bool_parameter(config, "ENABLE_JIT_EXECUTOR"),
        jit_profiling=bool_parameter(config, "ENABLE_JIT_PROFILING"),
        tensor_fuser=bool_parameter(config, "ENABLE_TENSOR_FUSER"),
        nvfuser=bool_parameter(config, "ENABLE_NVFUSER"),
        intra_op_threads=_count(config, "INTRA_OP_THREAD_COUNT"),
        inter_op_threads=_count(config, "INTER_OP_THREAD_COUNT"),
    )
