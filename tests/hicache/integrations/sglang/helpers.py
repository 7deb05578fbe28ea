"""Building SGLang's storage config and backends the way the server does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageConfig
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

from hicache.integrations.sglang import HicacheStorage
from hicache.integrations.sglang_cpu import HostPool

DYNAMIC = {
    "backend_name": "hicache",
    "module_path": "hicache.integrations.sglang",
    "class_name": "HicacheStorage",
    "interface_v1": 1,
}


def sglang_config(
    extra: dict[str, Any] | None = None,
    *,
    tp_rank: int = 0,
    tp_size: int = 1,
    mla: bool = False,
    model: str = "org/model",
    page_first: bool = True,
    metrics: bool = False,
) -> HiCacheStorageConfig:
    """A HiCacheStorageConfig as the cache controller builds it (no PP/CP)."""
    return HiCacheStorageConfig(
        tp_rank=tp_rank,
        tp_size=tp_size,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=mla,
        enable_storage_metrics=metrics,
        is_page_first_layout=page_first,
        model_name=model,
        extra_config=extra,
    )


def lmdb_extra(path: Path, **more: Any) -> dict[str, Any]:
    lmdb = {"backend": "lmdb", "path": str(path), "sync": False}  # the shipped default is disk
    return {**DYNAMIC, "hicache_config": "default", **lmdb, **more}


def remote_extra(endpoint: str, **more: Any) -> dict[str, Any]:
    return {**DYNAMIC, "hicache_config": "remote", "endpoint": endpoint, "timeout_s": 5.0, **more}


def redis_extra(endpoint: str, prefix: str, **more: Any) -> dict[str, Any]:
    return {
        **DYNAMIC,
        "hicache_config": "remote",
        "backend": "redis",
        "endpoint": endpoint,
        "key_prefix": prefix,
        **more,
    }


def ours(pool: HostPool, extra: dict[str, Any], **config: Any) -> HicacheStorage:
    """Our backend through SGLang's factory with ``dynamic``, then the host pool."""
    cfg = sglang_config(
        extra, mla=pool.kind == "mla", page_first=pool.layout == "page_first", **config
    )
    backend = StorageBackendFactory.create_backend("dynamic", cfg, pool)
    backend.register_mem_pool_host(pool)
    assert isinstance(backend, HicacheStorage)
    return backend


def sglang_file(pool: HostPool, path: Path, **config: Any) -> HiCacheFile:
    """SGLang's own HiCacheFile through its factory (``file``)."""
    cfg = sglang_config(
        {"file_storage_path": str(path)},
        mla=pool.kind == "mla",
        page_first=pool.layout == "page_first",
        **config,
    )
    backend = StorageBackendFactory.create_backend("file", cfg, pool)
    backend.register_mem_pool_host(pool)
    assert isinstance(backend, HiCacheFile)
    return backend
