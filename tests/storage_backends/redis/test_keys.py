"""Redis keys: stores of other models (fingerprints) or other fleets (key prefixes) never meet."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from storage_backends import StorageBackend

if TYPE_CHECKING:
    from conftest import MakeBackend, Pages, StoreConfig

SIZE = 2048


def _isolated(a: StorageBackend, b: StorageBackend, pages: Pages) -> None:
    keys = pages.keys(range(4))
    assert a.put(keys, pages.payloads(range(4), SIZE)) == [True] * 4
    assert b.exists(keys) == 0
    assert b.get(keys, pages.buffers(4, SIZE)) == [False] * 4
    assert b.put(keys[:1], pages.payloads([9], SIZE)) == [True]  # its own page, not a's
    dst = pages.buffers(1, SIZE)
    assert a.get(keys[:1], dst) == [True] and bytes(dst[0]) == pages.payload(0, SIZE)
    assert (a.stats().entries, b.stats().entries) == (4, 1)


def test_other_fingerprint_sees_nothing(
    store_config: StoreConfig, make_backend: MakeBackend, pages: Pages
) -> None:
    config = store_config("redis", 64 << 20)
    other = replace(config, fingerprint=config.fingerprint + "0")
    _isolated(make_backend(config), make_backend(other), pages)


def test_other_key_prefix_sees_nothing(
    store_config: StoreConfig, make_backend: MakeBackend, pages: Pages
) -> None:
    config = store_config("redis", 64 << 20)
    _isolated(make_backend(config), make_backend(replace(config, key_prefix="fleet-b")), pages)


def test_same_store_is_shared_bit_identical(
    store_config: StoreConfig, make_backend: MakeBackend, pages: Pages
) -> None:
    config = store_config("redis", 64 << 20)
    writer, reader = make_backend(config), make_backend(config)
    keys = pages.keys(range(6))
    assert writer.put(keys, pages.payloads(range(6), SIZE)) == [True] * 6
    assert reader.put(keys, pages.payloads(range(10, 16), SIZE)) == [True] * 6  # SET NX: kept
    dst = pages.buffers(6, SIZE)
    assert reader.get(keys, dst) == [True] * 6
    assert [bytes(d) for d in dst] == [pages.payload(i, SIZE) for i in range(6)]
    assert (writer.stats().puts, reader.stats().puts) == (6, 0)
