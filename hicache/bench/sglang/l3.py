"""SGLang's L3 path as the bench drives it: a host pool (``host_pool``), the storage object SGLang's
factory makes for a target (``open_storage``), its backup and prefetch calls (``backup_pages``,
``prefetch_pages``), timed; what the bench's rows and the linker's rows share."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hicache.integrations.sglang_cpu import Controller, HostPool

BASELINE = "sglang HiCacheFile"
DYNAMIC = {
    "backend_name": "hicache",
    "module_path": "hicache.integrations.sglang",
    "class_name": "HicacheStorage",
    "interface_v1": 1,
}


@dataclass(frozen=True)
class Geometry:
    """One SGLang MHA host pool page: ``page_size`` tokens × layers × kv heads × head dim."""

    pages: int
    page_size: int
    layers: int
    heads: int
    head_dim: int
    layout: str

    @property
    def page_bytes(self) -> int:
        return 2 * self.page_size * self.layers * self.heads * self.head_dim * 2  # bf16, K+V


@dataclass(frozen=True)
class Row:
    """GB/s of wall time, and GB per CPU-second of the caller plus the daemon
    (robust where other work shares the cores); both against the baseline."""

    target: str
    op: str
    pages_per_call: int
    gbps: float
    baseline_gbps: float
    cpu_gbps: float = 0.0
    baseline_cpu_gbps: float = 0.0

    @property
    def ratio(self) -> float:
        return self.gbps / self.baseline_gbps if self.baseline_gbps else 0.0

    @property
    def cpu_ratio(self) -> float:
        return self.cpu_gbps / self.baseline_cpu_gbps if self.baseline_cpu_gbps else 0.0


def open_storage(target: str, pool: HostPool, root: Path, endpoint: str) -> Any:
    """The storage object SGLang would create for ``target`` (through its factory)."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    extra: dict[str, object]
    if target == BASELINE:
        name, extra = "file", {"file_storage_path": str(root / "hicache-file")}
    elif target.startswith(("lmdb", "disk")):
        kind = target.split()[0]  # the backend, in a store of its own
        name = "dynamic"
        extra = {**DYNAMIC, "hicache_config": "default", "backend": kind}
        extra |= {"path": str(root / kind), "sync": False}
    else:
        name, extra = "dynamic", {**DYNAMIC, "hicache_config": "remote", "endpoint": endpoint}
    config = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False,
        is_page_first_layout=getattr(pool, "layout", "") == "page_first",
        model_name="bench/model", extra_config=extra,
    )  # fmt: skip
    backend = StorageBackendFactory.create_backend(name, config, pool)
    backend.register_mem_pool_host(pool)
    return backend


def host_pool(geometry: Geometry, seed: int) -> HostPool:
    pool = HostPool(
        "mha", geometry.layout, geometry.pages, geometry.page_size,
        geometry.layers, geometry.heads, geometry.head_dim,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    pool.kv_buffer.copy_(torch.randn(pool.kv_buffer.shape, generator=gen).to(pool.kv_buffer.dtype))
    return pool


def tokens_for(geometry: Geometry, seed: int) -> list[int]:
    return list(range(seed, seed + geometry.pages * geometry.page_size))


def timed(fn: Callable[[], int], expect: int) -> float:
    start = time.perf_counter()
    done = fn()
    seconds = time.perf_counter() - start
    if done != expect:
        raise RuntimeError(f"expected {expect} pages, got {done}")
    return seconds


def close_storage(backend: Any) -> None:
    close = getattr(backend, "close", None)  # SGLang's HiCacheFile has none
    if close is not None:
        close()


def backup_pages(ctl: Controller, hashes: list[str], batch: int) -> int:
    """SGLang's backup thread, ``batch`` pages per storage call."""
    done = 0
    for start in range(0, len(hashes), batch):
        pages = list(range(start, min(start + batch, len(hashes))))
        done += ctl.backup(hashes[start : pages[-1] + 1], pages) // ctl.page_size
    return done


def prefetch_pages(ctl: Controller, tokens: list[int], batch: int) -> int:
    """SGLang's prefetch: the hit query (chunks of 128), then reads of ``batch`` pages."""
    hashes, _ = ctl.hit_query(tokens)
    done = 0
    for start in range(0, len(hashes), batch):
        pages = list(range(start, min(start + batch, len(hashes))))
        done += ctl.load(hashes[start : pages[-1] + 1], pages)
    return done


def daemon_config(root: Path) -> Path:
    path = root / "daemon.toml"
    path.write_text(
        f'[store]\npath = "{root / "daemon-store"}"\nmax_bytes = {8 << 30}\n'
        f"memory_bytes = {1 << 30}\nsync = false\n[metrics]\nport = -1\n"
    )
    return path
