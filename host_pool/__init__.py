"""Host tier: KV buffers in host memory (pinned with CUDA) and their page allocator."""

from host_pool.kv_pool import LAYOUTS, HostKVPool, HostLayout
from host_pool.memory import HostMemoryError, available_host_memory
from host_pool.pages import PageSink

__all__ = [
    "LAYOUTS",
    "HostKVPool",
    "HostLayout",
    "HostMemoryError",
    "PageSink",
    "available_host_memory",
]
