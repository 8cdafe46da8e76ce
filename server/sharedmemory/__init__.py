"""Triton's shared-memory extensions: tensors read from and written to client-registered regions.

A front-end concern: HTTP and gRPC parse the ``shared_memory_region`` / ``shared_memory_offset`` /
``shared_memory_byte_size`` tensor parameters, read inputs into the vocabulary's numpy tensors and
write outputs back; the runtime never sees a region. One ``SharedMemoryRegistry`` per process is
shared by both front ends (Triton: "Region names share a namespace for system-shared-memory regions
and CUDA-shared-memory regions", docs/protocol/extension_shared_memory.md).
"""

from .params import SHM_BYTE_SIZE, SHM_OFFSET, SHM_REGION, ShmRef, shm_ref
from .registry import SharedMemoryRegistry

__all__ = ["SHM_BYTE_SIZE", "SHM_OFFSET", "SHM_REGION", "SharedMemoryRegistry", "ShmRef", "shm_ref"]
