"""The process's shared-memory regions (system and CUDA, one namespace) and tensor reads/writes.

Semantics and error texts follow Triton's ``SharedMemoryManager`` (server/src/shared_memory_manager.cc):
registering a taken name is ALREADY_EXISTS "shared memory region 'r' already in manager"; status of
an unknown name is NOT_FOUND "Unable to find system shared memory region: 'r'"; unregistering an
unknown name succeeds; a tensor reference is checked against the region as in ``GetMemoryInfo``
("Invalid offset for shared memory region: 'r'", "Invalid offset + byte size for shared memory
region: 'r'"), and an output must fit its reserved bytes ("shared memory size specified with the
request for output 'o' (n bytes) should be at least m bytes to hold the results" — INTERNAL in
Triton, INVALID_ARGUMENT here: the request reserved too little).

``--allow-client-shm`` (Triton 26.04+, default false) gates all of it: while it is off every call
and every tensor parameter is refused, because a registered key lets a client read and write any
shared-memory object the server's user can open.
"""

from __future__ import annotations

import numpy as np

from ..vocabulary import tensors
from ..vocabulary.errors import AlreadyExists, InvalidArgument, NotFound, Unsupported
from ..vocabulary.limits import RequestBudget
from . import cuda, system
from .params import ShmRef

DISABLED = (
    "client shared memory is disabled on this server: start it with --allow-client-shm=true to register "
    "and use shared-memory regions"
)


class SharedMemoryRegistry:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._system: dict[str, system.SystemRegion] = {}
        self._cuda: dict[str, cuda.CudaRegion] = {}

    def _check_enabled(self) -> None:
        if not self.enabled:
            raise Unsupported(DISABLED)

    def _check_free(self, name: str) -> None:
        if name in self._system or name in self._cuda:
            raise AlreadyExists(f"shared memory region '{name}' already in manager")

    # ---- system shared memory --------------------------------------------------------------
    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._check_enabled()
        if not name:
            raise InvalidArgument("'region name' is necessary to register system shared memory region")
        self._check_free(name)
        self._system[name] = system.open_region(name, key, offset, byte_size)

    def unregister_system(self, name: str = "") -> None:
        self._check_enabled()
        # a dropped region's descriptor closes once nothing holds it (system.SystemRegion)
        if name:
            self._system.pop(name, None)
        else:
            self._system.clear()

    def system_status(self, name: str = "") -> list[dict[str, object]]:
        self._check_enabled()
        if not name:
            return [r.status() for r in self._system.values()]
        region = self._system.get(name)
        if region is None:
            if name in self._cuda:
                raise NotFound(
                    f"The region named '{name}' is registered as CUDA shared memory, not system shared memory"
                )
            raise NotFound(f"Unable to find system shared memory region: '{name}'")
        return [region.status()]

    # ---- CUDA shared memory ------------------------------------------------------------------
    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        self._check_enabled()
        if not name:
            raise InvalidArgument("'region name' is necessary to register cuda shared memory region")
        self._check_free(name)
        self._cuda[name] = cuda.open_region(name, raw_handle, device_id, byte_size)

    def unregister_cuda(self, name: str = "") -> None:
        self._check_enabled()
        names = [name] if name else list(self._cuda)
        for n in names:
            region = self._cuda.pop(n, None)
            if region is not None:
                region.close()

    def cuda_status(self, name: str = "") -> list[dict[str, object]]:
        self._check_enabled()
        if not name:
            return [r.status() for r in self._cuda.values()]
        region = self._cuda.get(name)
        if region is None:
            if name in self._system:
                raise NotFound(
                    f"The region named '{name}' is registered as system shared memory, not CUDA shared memory"
                )
            raise NotFound(f"Unable to find cuda shared memory region: '{name}'")
        return [region.status()]

    # ---- tensors -----------------------------------------------------------------------------
    def _bounds(self, ref: ShmRef, region_size: int) -> None:
        if ref.offset >= region_size:
            raise InvalidArgument(f"Invalid offset for shared memory region: '{ref.region}'")
        if ref.offset + ref.byte_size > region_size:
            raise InvalidArgument(f"Invalid offset + byte size for shared memory region: '{ref.region}'")

    def _region_size(self, ref: ShmRef) -> int:
        self._check_enabled()
        region = self._system.get(ref.region) or self._cuda.get(ref.region)
        if region is None:
            raise NotFound(f"Unable to find shared memory region: '{ref.region}'")
        return region.byte_size

    def read_input(
        self, name: str, datatype: str, shape: list[int], ref: ShmRef, budget: RequestBudget | None = None
    ) -> np.ndarray:
        """Input ``name`` from its region: a view into system shared memory, a host copy of CUDA memory."""
        self._bounds(ref, self._region_size(ref))
        sys_region = self._system.get(ref.region)
        raw: bytes | memoryview
        if sys_region is not None:
            raw = sys_region.read(ref.offset, ref.byte_size)  # a copy: see system.py (truncated objects)
        else:
            raw = self._cuda[ref.region].read(ref.offset, ref.byte_size).data
        return tensors.from_raw(name, datatype, shape, raw, budget)

    def write_output(self, name: str, array: np.ndarray, ref: ShmRef) -> None:
        """Output ``name`` into its reserved bytes (no data travels in the response)."""
        self._bounds(ref, self._region_size(ref))
        data = tensors.to_raw(array)
        size = len(data)
        if size > ref.byte_size:
            raise InvalidArgument(
                f"shared memory size specified with the request for output '{name}' ({ref.byte_size} bytes) "
                f"should be at least {size} bytes to hold the results"
            )
        sys_region = self._system.get(ref.region)
        if sys_region is not None:
            sys_region.write(ref.offset, data)
        else:
            self._cuda[ref.region].write(ref.offset, np.frombuffer(data, dtype=np.uint8))

    def check_output(self, ref: ShmRef) -> None:
        """Refuse an output reference before the model runs (unknown region, out of bounds)."""
        self._bounds(ref, self._region_size(ref))

    def close(self) -> None:
        for system_region in self._system.values():
            system_region.close()
        self._system.clear()
        for region in self._cuda.values():
            region.close()
        self._cuda.clear()
