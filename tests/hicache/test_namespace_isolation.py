"""Two namespaces (tenants) write the same tokens through the cache into one store:
neither ever loads the other's pages, through prefetch, after a restart, or
through a shared daemon.

Each namespace writes its own KV for the same tokens (the KV is derived from the
tokens and the namespace), so a page loaded across namespaces fails the bit-for-bit
check, and a storage hit where the namespace wrote nothing fails the counts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hicache.bench.common.processes import ServerProcess, start_daemon
from hicache.cache import HiRadixCache
from storage_backends import StorageConfig
from tests.hicache.helpers import serve, two_tier

REPO = Path(__file__).resolve().parents[2]
PAGE = 4
TOKENS = [7000 + i for i in range(6 * PAGE)]  # the same tokens in every namespace
SALT = {None: 0, "tenant-a": 1, "tenant-b": 2, "tenant-c": 3}


def kv_tokens(tokens: list[int], namespace: str | None) -> list[int]:
    """The ids whose KV a namespace writes for ``tokens``: its own for each namespace."""
    return [t + 100_000 * SALT[namespace] for t in tokens]


def serve_as(cache: HiRadixCache, tokens: list[int], namespace: str | None) -> int:
    """One request of ``namespace``: the tokens it reused, whose KV is checked bit for
    bit against this namespace's own."""
    return serve(cache, tokens, namespace, kv_ids=kv_tokens(tokens, namespace))


def push_out(cache: HiRadixCache) -> None:
    """Everything to storage, nothing left on device or host."""
    cache.drain()
    cache.evict(10**9)
    cache.evict_host(10**9)
    cache.check_integrity()
    assert cache.match_prefix(TOKENS, "tenant-a").host_hit_length == 0


def cache_on(storage: StorageConfig) -> HiRadixCache:
    return two_tier(page_size=PAGE, pages=32, storage=storage)


def write_both(cache: HiRadixCache) -> None:
    """Tenant a writes the tokens; tenant b finds nothing of a's and writes its own."""
    assert serve_as(cache, TOKENS, "tenant-a") == 0
    push_out(cache)
    assert serve_as(cache, TOKENS, "tenant-b") == 0
    push_out(cache)


def read_own(
    cache: HiRadixCache, writers: tuple[str, ...], strangers: tuple[str | None, ...]
) -> None:
    """Each writer prefetches its own pages; a namespace that wrote nothing gets none
    (and, served, writes its own)."""
    for namespace in writers:
        assert serve_as(cache, TOKENS, namespace) == len(TOKENS)
        push_out(cache)
    for stranger in strangers:
        assert serve_as(cache, TOKENS, stranger) == 0
        push_out(cache)


@pytest.mark.parametrize("backend", ["lmdb", "file"])
def test_through_prefetch_and_after_restart(tmp_path: Path, backend: str) -> None:
    storage = StorageConfig(backend=backend, path=str(tmp_path / "store"), max_bytes=64 << 20)
    first = cache_on(storage)
    write_both(first)
    read_own(first, ("tenant-b", "tenant-a"), ("tenant-c",))
    first.close()
    restarted = cache_on(storage)  # a new process: empty tree, the same store
    read_own(restarted, ("tenant-c", "tenant-b", "tenant-a"), (None,))
    restarted.close()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[ServerProcess]:
    server = start_daemon(REPO / "configs" / "daemon.toml", tmp_path / "daemon-store")
    yield server
    server.stop()


def test_through_a_shared_daemon(daemon: ServerProcess) -> None:
    storage = StorageConfig(backend="remote", endpoint=daemon.endpoint, timeout_s=10.0)
    writer_a, writer_b = cache_on(storage), cache_on(storage)  # two engines, one daemon
    try:
        assert serve_as(writer_a, TOKENS, "tenant-a") == 0
        push_out(writer_a)
        assert serve_as(writer_b, TOKENS, "tenant-b") == 0
        push_out(writer_b)
    finally:
        writer_a.close()
        writer_b.close()
    reader = cache_on(storage)  # a third engine reads both back, each its own
    try:
        read_own(reader, ("tenant-b", "tenant-a"), ("tenant-c", None))
    finally:
        reader.close()
