"""Device tier: KV buffers, the page allocator and the request->token table."""

from device_pool.allocator import PagedAllocator, SlotError
from device_pool.kv_pool import DeviceKVPool, resolve_device, tokens_for_bytes
from device_pool.req_to_token import ReqToTokenPool
from device_pool.shape import DTYPES, KVShape, dtype_from_name

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
