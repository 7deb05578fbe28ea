"""Damaged pages in persistent stores: a miss, the page deleted, counted, dst untouched."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import lmdb
import pytest
from redis.cluster import RedisCluster

from storage_backends import StorageBackend, StorageConfig
from storage_backends.page_format import HEADER_BYTES
from storage_backends.redis.backend import key_prefix

if TYPE_CHECKING:
    from conftest import MakeBackend, Pages, StoreConfig

SIZE = 8192
Damage = Callable[[bytes], bytes]


def _flip_at(offset: int) -> Damage:
    def damage(blob: bytes) -> bytes:
        data = bytearray(blob)
        data[offset] ^= 0x40
        return bytes(data)

    return damage


DAMAGES: dict[str, Damage] = {
    "payload_bit_flip": _flip_at(HEADER_BYTES + SIZE // 2),
    "header_key_bit_flip": _flip_at(20),
    "header_version": _flip_at(4),
    "torn_write": lambda blob: blob[: HEADER_BYTES + SIZE // 3],
    "header_only": lambda blob: blob[:HEADER_BYTES],
    "truncated_header": lambda blob: blob[:10],
}


def _damage_lmdb(config: StorageConfig, key: bytes, damage: Damage) -> None:
    env = lmdb.open(config.path, max_dbs=4)
    try:
        pages = env.open_db(b"pages")
        with env.begin(write=True, db=pages) as txn:
            blob = txn.get(key)
            assert blob is not None
            txn.put(key, damage(blob))
    finally:
        env.close()


def _damage_file(config: StorageConfig, key: bytes, damage: Damage) -> None:
    name = key.hex()
    path = Path(config.path, "pages", name[:2], name[2:4], name)
    path.write_bytes(damage(path.read_bytes()))


def _damage_redis(config: StorageConfig, key: bytes, damage: Damage) -> None:
    client = RedisCluster.from_url(config.endpoint.split(",")[0])
    try:
        name = key_prefix(config) + key
        blob = client.get(name)
        assert isinstance(blob, bytes)
        client.set(name, damage(blob))
    finally:
        client.close()


def _assert_damage_handled(store: StorageBackend, pages: Pages) -> None:
    keys = pages.keys(range(3))
    dst = pages.buffers(3, SIZE)
    assert store.get(keys, dst) == [True, False, True]
    assert bytes(dst[1]) == b"\xab" * SIZE
    assert bytes(dst[0]) == pages.payload(0, SIZE)
    stats = store.stats()
    assert (stats.corrupt, stats.entries, stats.hits, stats.misses) == (1, 2, 2, 1)
    assert store.exists(keys[1:2]) == 0
    # The damaged page is gone, so it can be stored afresh.
    assert store.put(keys[1:2], pages.payloads([1], SIZE)) == [True]
    assert store.get(keys[1:2], dst[1:2]) == [True]
    assert bytes(dst[1]) == pages.payload(1, SIZE)


@pytest.mark.parametrize("damage", sorted(DAMAGES))
@pytest.mark.parametrize("name", ["lmdb", "file", "redis"])
def test_damaged_page_is_a_counted_miss(
    store_config: StoreConfig, pages: Pages, make_backend: MakeBackend, name: str, damage: str
) -> None:
    config = store_config(name, 64 << 20)
    store = make_backend(config)
    store.put(pages.keys(range(3)), pages.payloads(range(3), SIZE))
    store.close()
    injure = {"lmdb": _damage_lmdb, "file": _damage_file, "redis": _damage_redis}[name]
    injure(config, pages.key(1), DAMAGES[damage])
    _assert_damage_handled(make_backend(config), pages)


def test_page_under_another_key_is_damage(
    tmp_path: Path, pages: Pages, make_backend: MakeBackend
) -> None:
    """A file renamed (or a value copied) to another key must not be served for it."""
    config = pages.config("file", tmp_path)
    store = make_backend(config)
    store.put(pages.keys(range(3)), pages.payloads(range(3), SIZE))
    _damage_file(config, pages.key(1), lambda blob: _read_file(config, pages.key(0)))
    _assert_damage_handled(store, pages)


def _read_file(config: StorageConfig, key: bytes) -> bytes:
    name = key.hex()
    return Path(config.path, "pages", name[:2], name[2:4], name).read_bytes()
