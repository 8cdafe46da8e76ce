"""The few CUDA runtime calls the TensorRT backend needs, via cuda-python, imported lazily.

Nothing here is imported on a CPU-only machine unless a GPU model is loaded.
"""

from __future__ import annotations

from typing import Any


def cudart() -> Any:
    """The ``cudart`` module of cuda-python (new and old import paths)."""
    try:
        from cuda.bindings import runtime  # cuda-python >= 12.6

        return runtime
    except ImportError:
        try:
            from cuda import cudart as runtime

            return runtime
        except ImportError:
            raise RuntimeError("cuda-python is not installed: pip install kubeinfer[gpu]") from None


def check(result: Any) -> Any:
    """cuda-python returns ``(err, *values)``: raise on error, return the value(s)."""
    rt = cudart()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != rt.cudaError_t.cudaSuccess:
        _, name = rt.cudaGetErrorName(err)
        raise RuntimeError(f"CUDA error {name.decode() if isinstance(name, bytes) else name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


class DeviceBuffer:
    """Device memory that grows on demand and is reused across calls (no per-request cudaMalloc)."""

    def __init__(self) -> None:
        self.ptr = 0
        self.nbytes = 0

    def ensure(self, nbytes: int) -> int:
        if nbytes > self.nbytes:
            self.free()
            self.ptr = int(check(cudart().cudaMalloc(max(nbytes, 256))))
            self.nbytes = max(nbytes, 256)
        return self.ptr

    def free(self) -> None:
        if self.ptr:
            check(cudart().cudaFree(self.ptr))
            self.ptr = 0
            self.nbytes = 0


class Stream:
    def __init__(self, device_id: int) -> None:
        rt = cudart()
        check(rt.cudaSetDevice(device_id))
        self.device_id = device_id
        self.handle = check(rt.cudaStreamCreate())

    def __int__(self) -> int:
        return int(self.handle)

    def h2d(self, dst: int, array: Any) -> None:
        rt = cudart()
        check(
            rt.cudaMemcpyAsync(
                dst, array.ctypes.data, array.nbytes, rt.cudaMemcpyKind.cudaMemcpyHostToDevice, self.handle
            )
        )

    def d2h(self, array: Any, src: int) -> None:
        rt = cudart()
        check(
            rt.cudaMemcpyAsync(
                array.ctypes.data, src, array.nbytes, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost, self.handle
            )
        )

    def synchronize(self) -> None:
        check(cudart().cudaStreamSynchronize(self.handle))

    def destroy(self) -> None:
        if self.handle is not None:
            check(cudart().cudaStreamDestroy(self.handle))
            self.handle = None
