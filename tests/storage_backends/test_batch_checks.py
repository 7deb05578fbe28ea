"""``check_batch``: the argument checks every backend's put and get run first, on the
common batch (flat byte views) and on any other buffers."""

from __future__ import annotations

import array

import pytest

from storage_backends.batch import check_batch

KEYS = [bytes([i]) * 32 for i in range(3)]


def test_flat_byte_views_come_back_as_they_are() -> None:
    views = [memoryview(bytearray(8)) for _ in KEYS]
    got = check_batch(KEYS, views, writable=True)
    assert all(a is b for a, b in zip(got, views, strict=True))
    readonly = [memoryview(b"12345678") for _ in KEYS]
    assert check_batch(KEYS, readonly, writable=False) == readonly


def test_a_read_only_buffer_among_writable_ones_is_refused_for_a_get() -> None:
    views = [memoryview(bytearray(8)), memoryview(b"12345678"), memoryview(bytearray(8))]
    with pytest.raises(ValueError, match="writable"):
        check_batch(KEYS, views, writable=True)
    assert len(check_batch(KEYS, views, writable=False)) == 3


def test_other_buffers_become_flat_byte_views() -> None:
    words = memoryview(array.array("I", [1, 2]))
    grid = memoryview(bytearray(8)).cast("B", (2, 4))
    got = check_batch(KEYS, [words, grid, bytearray(8)], writable=True)  # type: ignore[list-item]
    assert [(v.format, v.ndim, len(v)) for v in got] == [("B", 1, 8)] * 3
    strided = memoryview(array.array("I", [1, 2, 3, 4]))[::2]
    with pytest.raises(ValueError, match="contiguous"):
        check_batch(KEYS[:1], [strided], writable=True)
    every_other_byte = memoryview(bytearray(16))[::2]  # a flat byte view, but strided
    with pytest.raises(ValueError, match="contiguous"):
        check_batch(KEYS[:2], [memoryview(bytearray(8)), every_other_byte], writable=True)
    with pytest.raises(ValueError, match="contiguous"):
        check_batch(KEYS[:1], [every_other_byte.toreadonly()], writable=False)
