"""Tier configs and keys for the vLLM tier tests."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from vllm.v1.kv_offload.base import OffloadKey, make_offload_key

OURS = {"type": "HicacheTier", "module_path": "hicache.integrations.vllm"}
CHUNK = 4096  # one page: vLLM pads a chunk to the page size


def key(n: int, group: int = 0) -> OffloadKey:
    """vLLM's OffloadKey of a sha256 block hash (block ``n``) in KV group ``group``."""
    return make_offload_key(hashlib.sha256(n.to_bytes(8, "little")).digest(), group)


def payload(n: int, size: int = CHUNK) -> bytes:
    """Chunk contents that differ per ``n`` across the whole chunk."""
    seed = hashlib.sha256(b"chunk" + n.to_bytes(8, "little")).digest()
    return (seed * (size // len(seed) + 1))[:size]


def lmdb_tier(path: Path, **more: Any) -> dict[str, Any]:
    return {
        **OURS,
        "hicache_config": "default",
        "backend": "lmdb",  # the shipped default is disk
        "path": str(path),
        "sync": False,
        **more,
    }


def remote_tier(endpoint: str, **more: Any) -> dict[str, Any]:
    return {**OURS, "hicache_config": "remote", "endpoint": endpoint, **more}


def redis_tier(endpoint: str, prefix: str, **more: Any) -> dict[str, Any]:
    return {
        **OURS,
        "hicache_config": "remote",
        "backend": "redis",
        "endpoint": endpoint,
        "key_prefix": prefix,
        **more,
    }


def fs_tier(root: Path) -> dict[str, Any]:
    return {"type": "fs", "root_dir": str(root), "n_read_threads": 2, "n_write_threads": 2}
