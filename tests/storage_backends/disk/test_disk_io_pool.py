"""IoPool.map: a batch that raises is over when the exception reaches the caller (no item
is still being read into a buffer the caller then reuses)."""

from __future__ import annotations

import threading

import pytest

from storage_backends.disk.io_pool import IoPool


def test_map_raises_only_once_every_item_is_done() -> None:
    pool = IoPool(2)
    started, raised, returned = threading.Event(), threading.Event(), threading.Event()
    finished: list[str] = []

    def read(item: str) -> str:
        if item == "first":  # this thread's share: fails once the other item is under way
            assert started.wait(10)
            raised.set()
            raise OSError("a read failed")
        started.set()
        assert raised.wait(10)
        returned.wait(0.3)  # still busy when the failure is raised, unless map waits
        finished.append(item)
        return item

    try:
        with pytest.raises(OSError, match="a read failed"):
            pool.map(read, ["first", "second"])
        assert finished == ["second"]
    finally:
        returned.set()
        pool.close()


def test_map_keeps_the_order_of_its_items() -> None:
    pool = IoPool(3)
    try:
        assert pool.map(lambda i: i * i, list(range(10))) == [i * i for i in range(10)]
    finally:
        pool.close()
