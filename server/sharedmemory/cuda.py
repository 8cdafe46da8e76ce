"""CUDA shared-memory regions: device buffers another process exported with ``cudaIpcGetMemHandle``.

As Triton's ``RegisterCUDASharedMemory``: the 64-byte IPC handle is opened with
``cudaIpcOpenMemHandle(..., cudaIpcMemLazyEnablePeerAccess)`` on the given device and the registered size
is checked against the allocation (``cuMemGetAddressRange``). Backends here take host tensors, so an
input is copied device → host once and an output host → device once (Triton's backends may read the
device pointer directly; the client-side API is the same). Needs cuda-python (``pip install
kubeinfer[gpu]``) and a GPU; without them registration fails with Triton's "GPUs not supported".
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..runtime import devices
from ..vocabulary.errors import InvalidArgument

IPC_HANDLE_SIZE = 64


def _cudart() -> Any:
    try:
        from cuda.bindings import runtime  # cuda-python >= 12.6

        return runtime
    except ImportError:
        from cuda import cudart

        return cudart


def _driver() -> Any:
    try:
        from cuda.bindings import driver

        return driver
    except ImportError:
        from cuda import cuda as driver

        return driver


def _ok(result: Any, what: str) -> Any:
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: CUDA error {int(err)} ({err})")
    return values[0] if len(values) == 1 else tuple(values) if values else None


def cuda_available() -> str:
    """ "" when CUDA shared memory can work here, else why not."""
    if devices.gpu_count() == 0:
        return "no GPU is visible"
    try:
        _cudart()
    except ImportError:
        return "cuda-python is not installed (pip install kubeinfer[gpu])"
    return ""


@dataclass
class CudaRegion:
    name: str
    device_id: int
    byte_size: int
    ptr: int

    def status(self) -> dict[str, object]:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}

    def read(self, offset: int, size: int) -> np.ndarray:
        """``size`` bytes at ``offset``, copied to host memory."""
        rt = _cudart()
        host = np.empty(size, dtype=np.uint8)
        if size:
            _ok(rt.cudaSetDevice(self.device_id), "cudaSetDevice")
            kind = rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
            _ok(rt.cudaMemcpy(host.ctypes.data, self.ptr + offset, size, kind), "cudaMemcpy")
        return host

    def write(self, offset: int, data: np.ndarray) -> None:
        rt = _cudart()
        host = np.ascontiguousarray(data).view(np.uint8).ravel()
        if host.size:
            _ok(rt.cudaSetDevice(self.device_id), "cudaSetDevice")
            kind = rt.cudaMemcpyKind.cudaMemcpyHostToDevice
            _ok(rt.cudaMemcpy(self.ptr + offset, host.ctypes.data, host.size, kind), "cudaMemcpy")

    def close(self) -> None:
        if self.ptr:
            _ok(_cudart().cudaIpcCloseMemHandle(self.ptr), "cudaIpcCloseMemHandle")
            self.ptr = 0


def open_region(name: str, raw_handle: bytes, device_id: int, byte_size: int) -> CudaRegion:
    reason = cuda_available()
    if reason:
        raise InvalidArgument(f"failed to register CUDA shared memory region: '{name}', GPUs not supported ({reason})")
    if len(raw_handle) != IPC_HANDLE_SIZE:
        raise InvalidArgument(f"failed to register shared memory region '{name}': invalid args")
    if device_id < 0 or device_id >= devices.gpu_count():
        raise InvalidArgument(f"failed to register shared memory region '{name}': invalid args")
    rt = _cudart()
    handle = rt.cudaIpcMemHandle_t()
    # cuda-bindings >= 13 exposes only the struct's address (getPtr), not a 'reserved' field
    ctypes.memmove(handle.getPtr(), raw_handle, IPC_HANDLE_SIZE)
    try:
        _ok(rt.cudaSetDevice(device_id), "cudaSetDevice")
        lazy = getattr(rt, "cudaIpcMemLazyEnablePeerAccess", 1)
        ptr = int(_ok(rt.cudaIpcOpenMemHandle(handle, lazy), "cudaIpcOpenMemHandle"))
    except RuntimeError:
        raise InvalidArgument("failed to register shared memory region: invalid args") from None
    region = CudaRegion(name, device_id, byte_size, ptr)
    try:
        _, size = _ok(_driver().cuMemGetAddressRange(ptr), "cuMemGetAddressRange")
        if byte_size > int(size):
            raise InvalidArgument(f"failed to register shared memory region '{name}': invalid args")
    except BaseException:
        region.close()
        raise
    return region
