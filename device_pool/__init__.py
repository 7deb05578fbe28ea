"""Device tier: KV buffers, the page allocator and the request->token table."""

from device_pool.native import use_compiled

use_compiled(__name__, __path__)  # the compiled page table, when built (device_pool.native)

from device_pool.allocator import PagedAllocator, SlotError  # noqa: E402
from device_pool.kv_pool import DeviceKVPool, resolve_device, tokens_for_bytes  # noqa: E402
from device_pool.req_to_token import ReqToTokenPool  # noqa: E402
from device_pool.shape import DTYPES, KVShape, dtype_from_name  # noqa: E402

__all__ = [
    "DTYPES",
    "DeviceKVPool",
    "KVShape",
    "PagedAllocator",
    "ReqToTokenPool",
    "SlotError",
    "dtype_from_name",
    "resolve_device",
    "tokens_for_bytes",
]
