"""Behaviour every backend shares: round trips, exists, put, get, delete, stats, close."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import pytest

from storage_backends import StorageBackend, StorageClosedError, StorageStats
from storage_backends.page_format import HEADER_BYTES

if TYPE_CHECKING:
    from conftest import MakeBackend, Pages, StoreConfig


@pytest.fixture(params=("memory", "lmdb", "file", "disk", "redis"))
def backend_name(request: pytest.FixtureRequest) -> str:
    """Every backend, the network ones included, honours this contract."""
    return str(request.param)


def test_satisfies_protocol(backend: StorageBackend) -> None:
    assert isinstance(backend, StorageBackend)


@pytest.mark.parametrize("size", [64 << 10, 512 << 10])
def test_round_trip_is_byte_identical(backend: StorageBackend, pages: Pages, size: int) -> None:
    keys, src = pages.keys(range(4)), pages.payloads(range(4), size)
    assert backend.put(keys, src) == [True] * 4
    dst = pages.buffers(4, size)
    assert backend.get(keys, dst) == [True] * 4
    assert [bytes(d) for d in dst] == [bytes(s) for s in src]


def test_get_fills_typed_multidimensional_buffers(backend: StorageBackend, pages: Pages) -> None:
    src = np.arange(2 * 1024, dtype=np.float32).reshape(2, 1024)
    key = pages.key(0)
    assert backend.put([key], [memoryview(src)]) == [True]
    dst = np.zeros_like(src)
    assert backend.get([key], [memoryview(dst)]) == [True]
    np.testing.assert_array_equal(dst, src)


def test_exists_counts_leading_hits(backend: StorageBackend, pages: Pages) -> None:
    keys = pages.keys(range(5))
    backend.put([keys[0], keys[1], keys[3]], pages.payloads([0, 1, 3], 1024))
    assert backend.exists(keys) == 2
    assert backend.exists(keys[3:]) == 1
    assert backend.exists(keys[2:]) == 0
    assert backend.exists([]) == 0


def test_contains_answers_every_key_past_a_gap(backend: StorageBackend, pages: Pages) -> None:
    keys = pages.keys(range(5))
    backend.put([keys[0], keys[1], keys[3]], pages.payloads([0, 1, 3], 1024))
    assert backend.contains(keys) == [True, True, False, True, False]
    assert backend.contains([keys[3], keys[3], keys[2]]) == [True, True, False]
    assert backend.contains([]) == []
    assert backend.delete(keys[1:2]) == 1
    assert backend.contains(keys) == [True, False, False, True, False]
    assert backend.stats().hits == 0  # a membership answer is not a read


def test_put_skips_existing_keys(backend: StorageBackend, pages: Pages) -> None:
    key = pages.key(0)
    assert backend.put([key], pages.payloads([0], 4096)) == [True]
    assert backend.put([key], pages.payloads([1], 4096)) == [True]
    dst = pages.buffers(1, 4096)
    assert backend.get([key], dst) == [True]
    assert bytes(dst[0]) == pages.payload(0, 4096)
    assert backend.stats().puts == 1


def test_put_accepts_duplicate_keys_in_one_batch(backend: StorageBackend, pages: Pages) -> None:
    key = pages.key(0)
    src = pages.payloads([0, 0], 4096)
    assert backend.put([key, key], src) == [True, True]
    assert backend.stats().entries == 1


def test_get_with_wrong_sized_dst_is_a_plain_miss(backend: StorageBackend, pages: Pages) -> None:
    keys = pages.keys(range(2))
    backend.put(keys, pages.payloads(range(2), 4096))
    small, right = pages.buffers(1, 4095), pages.buffers(1, 4096)
    assert backend.get(keys, [small[0], right[0]]) == [False, True]
    assert bytes(small[0]) == b"\xab" * 4095
    stats = backend.stats()
    assert (stats.hits, stats.misses, stats.corrupt, stats.entries) == (1, 1, 0, 2)


def test_get_of_absent_keys_is_a_miss(backend: StorageBackend, pages: Pages) -> None:
    dst = pages.buffers(2, 128)
    assert backend.get(pages.keys(range(2)), dst) == [False, False]
    assert all(bytes(d) == b"\xab" * 128 for d in dst)
    assert backend.stats().misses == 2


def test_delete_counts_removed(backend: StorageBackend, pages: Pages) -> None:
    keys = pages.keys(range(3))
    backend.put(keys[:2], pages.payloads(range(2), 2048))
    assert backend.delete(keys) == 2
    assert backend.exists(keys) == 0
    assert backend.delete(keys) == 0
    stats = backend.stats()
    assert (stats.entries, stats.bytes_used, stats.deletes) == (0, 0, 2)


def test_stats_snapshot(backend: StorageBackend, pages: Pages) -> None:
    keys = pages.keys(range(3))
    backend.put(keys, pages.payloads(range(3), 1000))
    backend.get(keys[:2], pages.buffers(2, 1000))
    stats = backend.stats()
    assert isinstance(stats, StorageStats)
    assert stats.entries == 3
    assert stats.bytes_used == 3 * (1000 + HEADER_BYTES)
    assert stats.capacity_bytes == 64 << 20
    assert (stats.hits, stats.misses, stats.puts, stats.put_failures) == (2, 0, 3, 0)
    assert json.loads(json.dumps(stats.as_dict()))["entries"] == 3
    with pytest.raises(AttributeError):
        stats.entries = 0  # type: ignore[misc]


def test_page_over_max_page_bytes_is_rejected(
    backend_name: str, store_config: StoreConfig, pages: Pages, make_backend: MakeBackend
) -> None:
    store = make_backend(replace(store_config(backend_name, 64 << 20), max_page_bytes=1024))
    src = pages.payloads([0], 1025) + pages.payloads([1], 1024)
    assert store.put(pages.keys(range(2)), src) == [False, True]
    assert store.stats().put_failures == 1


def test_close_is_idempotent_and_later_calls_raise(backend: StorageBackend, pages: Pages) -> None:
    backend.close()
    backend.close()
    keys = pages.keys(range(1))
    calls = [
        lambda: backend.exists(keys),
        lambda: backend.contains(keys),
        lambda: backend.get(keys, pages.buffers(1, 8)),
        lambda: backend.put(keys, pages.payloads([0], 8)),
        lambda: backend.delete(keys),
        backend.stats,
    ]
    for call in calls:
        with pytest.raises(StorageClosedError):
            call()


def test_malformed_arguments_raise_value_error(backend: StorageBackend, pages: Pages) -> None:
    with pytest.raises(ValueError, match="32-byte"):
        backend.exists([b"short"])
    with pytest.raises(ValueError, match="32-byte"):
        backend.contains([b"short"])
    with pytest.raises(ValueError, match="buffers"):
        backend.put(pages.keys(range(2)), pages.payloads([0], 8))
    with pytest.raises(ValueError, match="writable"):
        backend.get(pages.keys(range(1)), [memoryview(b"12345678")])


def test_concurrent_workers(backend: StorageBackend, pages: Pages) -> None:
    """Several I/O threads putting and getting overlapping pages see only correct data."""
    size, errors = 4096, []

    def worker(offset: int) -> None:
        try:
            for round_ in range(20):
                ids = [(offset + round_ + j) % 40 for j in range(8)]
                keys = pages.keys(ids)
                assert backend.put(keys, pages.payloads(ids, size)) == [True] * 8
                dst = pages.buffers(8, size)
                hits = backend.get(keys, dst)
                for i, hit, buf in zip(ids, hits, dst, strict=True):
                    assert not hit or bytes(buf) == pages.payload(i, size)
                backend.exists(keys)
        except Exception as exc:  # collected and re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k * 5,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert backend.stats().entries == 40
