"""StorageIO: bounded waits and a bounded close when the backend stalls."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from storage_backends.config import StorageConfig
from storage_backends.memory import MemoryBackend
from tests.transfer.transfer_helpers import make_pools, make_shape
from transfer.storage_io import StorageIO, StorageJob


class Stalled(MemoryBackend):
    """A memory backend whose puts block until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__(StorageConfig(backend="memory", max_bytes=1 << 20))
        self.release = threading.Event()

    def put(self, keys: Sequence[bytes], src: list[memoryview]) -> list[bool]:
        self.release.wait(timeout=60)
        return super().put(keys, src)


def _job(page_size: int, page: int) -> StorageJob:
    slots = torch.arange(page * page_size, (page + 1) * page_size, dtype=torch.int64)
    return StorageJob("put", (bytes([page]) * 32,), slots)


def test_wait_and_close_are_bounded_then_the_late_job_is_delivered() -> None:
    _, host = make_pools(make_shape(), 4, "layer_first")
    backend = Stalled()
    io = StorageIO(backend, host, num_workers=1)
    first, second = io.submit(_job(4, 0)), io.submit(_job(4, 1))
    assert io.wait(first, timeout_s=0.2) is None  # the put blocks for a minute
    assert not backend.release.is_set() and io.pending() == 2
    backend.release.set()
    done = io.wait(first, timeout_s=30)
    assert done is not None and done.results == (True,)
    late = io.wait(second, timeout_s=30)
    assert late is not None and late.results == (True,)
    assert io.close(timeout_s=30)


def test_close_gives_up_on_a_stalled_worker() -> None:
    _, host = make_pools(make_shape(), 4, "layer_first")
    backend = Stalled()
    io = StorageIO(backend, host, num_workers=1)
    io.submit(_job(4, 0))
    assert io.close(timeout_s=0.2) is False
    backend.release.set()  # the worker finishes and exits; the backend stays usable
    assert backend.exists([bytes([0]) * 32]) in (0, 1)
    backend.close()
