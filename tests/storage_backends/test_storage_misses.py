"""Misses mixed with hits, in one batch, on a store full of other pages: every backend.

A backend that answered a missing key with another key's page (a neighbour in a
sorted store, a bucket collision, a stale buffer) would hand attention the wrong
KV. Reads of missing keys elsewhere happen on empty stores; here the store is
full, the batch interleaves hits with misses (among them keys one bit or one
byte away from stored ones), and every miss must leave its buffer untouched while
every hit brings exactly its own bytes.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hicache.bench.common.processes import start_daemon
from storage_backends import StorageBackend, StorageConfig

if TYPE_CHECKING:
    from conftest import MakeBackend, Pages, StoreConfig

DAEMON_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "daemon.toml"
SIZE = 4096
STORED = 64  # pages written before the reads
FILL = 0xAB  # what Pages.buffers fills destinations with


@pytest.fixture(params=("memory", "lmdb", "file", "disk", "redis", "remote", "mooncake"))
def full_store(
    request: pytest.FixtureRequest,
    store_config: StoreConfig,
    make_backend: MakeBackend,
    tmp_path: Path,
) -> Iterator[StorageBackend]:
    """A store of each backend, private to the test, holding pages 0..STORED-1."""
    name = str(request.param)
    if name == "remote":
        daemon = start_daemon(DAEMON_CONFIG, tmp_path / "daemon-store")
        request.addfinalizer(daemon.stop)
        config = StorageConfig(backend="remote", endpoint=daemon.endpoint, timeout_s=10.0)
    elif name == "mooncake":
        mooncake = request.getfixturevalue("mooncake")  # skips where mooncake does not import
        fingerprint = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16]
        config = StorageConfig(
            backend="mooncake", endpoint=mooncake.endpoint, fingerprint=fingerprint, timeout_s=10.0
        )
    else:
        config = store_config(name, 64 << 20)
    yield make_backend(config)


def near_misses(pages: Pages, ids: range) -> list[bytes]:
    """Keys that are not stored but sit next to stored ones: one bit flipped at either
    end (neighbours in a sorted store, same hash bucket prefix), and the extremes."""
    keys = pages.keys(ids)
    flipped = [bytes([k[0] ^ 0x01, *k[1:]]) for k in keys]
    flipped += [bytes([*k[:-1], k[-1] ^ 0x01]) for k in keys]
    return [*flipped, b"\x00" * 32, b"\xff" * 32]


def fill(backend: StorageBackend, pages: Pages) -> None:
    ids = range(STORED)
    assert backend.put(pages.keys(ids), pages.payloads(ids, SIZE)) == [True] * STORED


def test_mixed_batch_on_a_full_store(full_store: StorageBackend, pages: Pages) -> None:
    fill(full_store, pages)
    present = {pages.key(i): pages.payload(i, SIZE) for i in range(0, STORED, 3)}
    absent = pages.keys(range(10_000, 10_024)) + near_misses(pages, range(0, STORED, 5))
    batch = list(present) + absent
    random.Random(25).shuffle(batch)
    dst = pages.buffers(len(batch), SIZE, FILL)
    hits = full_store.get(batch, dst)
    assert hits == [key in present for key in batch]
    for key, buf in zip(batch, dst, strict=True):
        want = present.get(key, bytes([FILL]) * SIZE)
        assert bytes(buf) == want, f"key {key.hex()[:12]}: wrong bytes"
    first_miss = next(i for i, key in enumerate(batch) if key not in present)
    assert full_store.exists(batch) == first_miss
    assert full_store.exists(absent) == 0


@pytest.mark.parametrize("name", ["memory", "lmdb", "file", "disk"])
def test_mixed_batch_on_a_store_at_capacity(
    name: str, store_config: StoreConfig, make_backend: MakeBackend, pages: Pages
) -> None:
    """Written past its capacity, the store evicted pages: whichever it kept are read
    back as their own bytes, every other key is a miss with its buffer untouched."""
    store = make_backend(store_config(name, (STORED // 2) * (SIZE + 64)))
    fill(store, pages)
    written = pages.keys(range(STORED))
    batch = written + pages.keys(range(10_000, 10_016)) + near_misses(pages, range(0, STORED, 7))
    random.Random(26).shuffle(batch)
    dst = pages.buffers(len(batch), SIZE, FILL)
    hits = store.get(batch, dst)
    payloads = {pages.key(i): pages.payload(i, SIZE) for i in range(STORED)}
    for key, hit, buf in zip(batch, hits, dst, strict=True):
        if hit:
            assert bytes(buf) == payloads[key], f"key {key.hex()[:12]}: another page's bytes"
        else:
            assert bytes(buf) == bytes([FILL]) * SIZE
            assert store.exists([key]) == 0
    kept = sum(hits)
    assert 0 < kept <= STORED // 2 and kept == store.stats().entries
