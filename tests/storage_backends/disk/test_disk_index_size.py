"""The index's map holds the index of a store filled with its smallest pages: a store
of small pages refused puts with MDB_MAP_FULL well below its ``max_bytes``."""

from __future__ import annotations

import pytest

from storage_backends import StorageConfig
from storage_backends.disk.index import map_size
from storage_backends.disk.layout import slot_class

# Measured: ~220 index bytes a page in a full store, ~300 after a round of evictions
# (freed slots are indexed too).
_MEASURED_PER_PAGE = 300


@pytest.mark.parametrize("max_bytes", [1 << 30, 16 << 30, 1 << 40])
def test_the_map_fits_a_store_full_of_its_smallest_pages(max_bytes: int) -> None:
    config = StorageConfig(backend="disk", path="unused", max_bytes=max_bytes)
    smallest = slot_class(1, direct_io=False).stride
    assert map_size(config) >= (max_bytes // smallest) * _MEASURED_PER_PAGE


def test_a_configured_map_size_wins() -> None:
    config = StorageConfig(backend="disk", path="unused", max_bytes=1 << 30, map_size=99 << 20)
    assert map_size(config) == 99 << 20
