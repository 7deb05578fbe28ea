"""What this machine's store delivers, to set next to what a trace needs of it.

Two short measurements, unless ``--disk-gbps`` gives the figures: the store
the config names, called directly, and a cache daemon (``hicache serve``,
the shipped daemon config's store, its memory tier off) started for the
probe and reached through the ``remote`` backend. Each writes ``total``
bytes of pages the chosen model's size for ``PROBE_PAGE_TOKENS`` tokens, in
batches, then reads them back, every page checked. Writes are timed to the
end of an fsync of the store's files (the disk's rate, not the page cache's);
reads follow a drop of those files from the page cache, and the figure says
when the drop did not take effect (then the reads are warm and flatter the
disk). A network store is measured as it is, warm.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from hicache.bench.common.page_cache import drop_page_cache
from hicache.bench.common.processes import ServerError, start_daemon
from hicache.bench.tiering.stores import storage_setup
from hicache.bench.tiering.trace.models import ModelGeometry
from hicache.config.cache import CacheConfig
from storage_backends import StorageBackend, StorageConfig, create

logger = logging.getLogger(__name__)

PROBE_PAGE_TOKENS = 64  # a storage page of a serving engine (SGLang's HiCache pages: 64 typical)
MAX_PAGE_BYTES = 32 << 20
BATCH_BYTES = 64 << 20
DAEMON_CONFIG = "daemon"


class StoreRate(NamedTuple):
    """GB/s (10**9 bytes a second) a store wrote and read; None where unknown."""

    source: str
    write_gbps: float | None
    read_gbps: float | None
    note: str


def given_rates(text: str) -> StoreRate:
    """``--disk-gbps READ[,WRITE]`` (WRITE defaults to READ); ValueError when malformed."""
    parts = text.split(",")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (1, 2) or min(values) <= 0:
        raise ValueError(f"--disk-gbps {text!r}: expected READ or READ,WRITE in GB/s (> 0)")
    read, write = values[0], values[-1]
    return StoreRate("--disk-gbps", write, read, "given on the command line")


class Pages(NamedTuple):
    keys: list[bytes]
    payload: memoryview
    batch: int


def probe_pages(model: ModelGeometry, total_bytes: int) -> Pages:
    page = min(model.bytes_per_token * PROBE_PAGE_TOKENS, MAX_PAGE_BYTES)
    count = max(2, total_bytes // page)
    keys = [hashlib.sha256(f"trace-probe-{i}".encode()).digest() for i in range(count)]
    return Pages(keys, memoryview(os.urandom(page)), max(1, BATCH_BYTES // page))


def _put_all(store: StorageBackend, pages: Pages, source: str) -> None:
    for i in range(0, len(pages.keys), pages.batch):
        keys = pages.keys[i : i + pages.batch]
        if not all(store.put(keys, [pages.payload] * len(keys))):
            raise RuntimeError(f"{source}: the store refused a probe page")


def _get_all(store: StorageBackend, pages: Pages, source: str) -> None:
    sink = [memoryview(bytearray(len(pages.payload))) for _ in range(pages.batch)]
    for i in range(0, len(pages.keys), pages.batch):
        keys = pages.keys[i : i + pages.batch]
        if not all(store.get(keys, sink[: len(keys)])):
            raise RuntimeError(f"{source}: a probe page did not come back")


def measure(
    opener: Callable[[], StorageBackend], pages: Pages, files: Path | None, source: str
) -> StoreRate:
    """Put every page through a store ``opener`` opens, close it, fsync ``files`` (its
    directory, when it has one) and drop them from the page cache, open it again and get
    every page back. RuntimeError when a page is refused or missing. The store is
    closed (not emptied) on return."""
    total = len(pages.payload) * len(pages.keys)
    began = time.perf_counter()
    store = opener()
    try:
        _put_all(store, pages, source)
    finally:
        store.close()  # a store that maps its files would keep them in the page cache
    cold = drop_page_cache(files).took_effect if files is not None else False
    wrote = time.perf_counter() - began
    store = opener()
    try:
        began = time.perf_counter()
        _get_all(store, pages, source)
        read = time.perf_counter() - began
        if files is None:
            store.delete(pages.keys)  # a network store keeps nothing of the probe
    finally:
        store.close()
    how = "writes to the end of an fsync; " if files is not None else "warm; "
    how += "reads cold (page cache dropped)" if cold else "reads warm (from the page cache)"
    note = f"{len(pages.keys)} pages of {len(pages.payload) / 2**20:.1f} MiB, {how}"
    return StoreRate(source, total / wrote / 1e9, total / read / 1e9, note)


def probe_config_store(config: CacheConfig, pages: Pages, scratch: Path) -> StoreRate:
    """The config's store (a fresh directory for a path store), called directly."""
    storage = storage_setup(config, scratch / "probe-store")
    room = 2 * len(pages.keys) * len(pages.payload) + (64 << 20)
    storage = replace(storage, max_bytes=room, map_size=0, sync="none", fingerprint="trace-probe")
    source = f"{storage.backend} store (direct)"
    files = Path(storage.path) if storage.path else None
    try:
        return measure(lambda: create(storage.backend, storage), pages, files, source)
    finally:
        if files is not None:
            shutil.rmtree(files, ignore_errors=True)


def probe_daemon(pages: Pages, scratch: Path) -> StoreRate:
    """A daemon started here (shipped daemon config, memory tier off) over tcp loopback."""
    root = scratch / "probe-daemon-store"
    room = 2 * len(pages.keys) * len(pages.payload) + (64 << 20)
    extra = ["--set", "store.memory_bytes=0", "--set", f"store.max_bytes={room}"]
    try:
        with start_daemon(DAEMON_CONFIG, root, extra=extra) as daemon:
            remote = StorageConfig(backend="remote", endpoint=daemon.endpoint, timeout_s=60.0)
            source = f"daemon over tcp ({_daemon_store()} store)"
            return measure(lambda: create("remote", remote), pages, root, source)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _daemon_store() -> str:
    from hicache.config.daemon import DaemonConfig
    from hicache.config.shipped import DAEMON, resolve_config

    return DaemonConfig.from_toml(resolve_config(DAEMON_CONFIG, DAEMON), {}).store.backend


def probe(
    config: CacheConfig, model: ModelGeometry, total_bytes: int, scratch: Path
) -> list[StoreRate]:
    """The config's store and a daemon; a probe that fails is logged and left out."""
    pages = probe_pages(model, total_bytes)
    out = []
    try:
        out.append(probe_config_store(config, pages, scratch))
    except (OSError, RuntimeError, ValueError) as exc:
        logger.warning("could not measure the config's store: %s", exc)
    if config.storage.backend != "remote":
        try:
            out.append(probe_daemon(pages, scratch))
        except (OSError, RuntimeError, ServerError) as exc:
            logger.warning("could not measure a daemon: %s", exc)
    return out
