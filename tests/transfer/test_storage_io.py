"""StorageIO: bounded waits and a bounded close when the backend stalls; prefetches in pieces."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from storage_backends.config import StorageConfig
from storage_backends.memory import MemoryBackend
from tests.transfer.transfer_helpers import make_pools, make_shape
from transfer.storage_io import ReadProgress, StorageIO, StorageJob


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


class Counting(MemoryBackend):
    """A memory backend that records each get's keys, and loses ``lose`` right
    after a lookup (evicted by another process between lookup and read)."""

    def __init__(self) -> None:
        super().__init__(StorageConfig(backend="memory", max_bytes=1 << 20))
        self.gets: list[int] = []
        self.lose: bytes | None = None

    def exists(self, keys: Sequence[bytes]) -> int:
        found = super().exists(keys)
        if self.lose is not None:
            self.delete([self.lose])
        return found

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        self.gets.append(len(keys))
        return super().get(keys, dst)


def _stored(io: StorageIO, pages: int) -> tuple[bytes, ...]:
    keys = tuple(bytes([p]) * 32 for p in range(pages))
    for p in range(pages):
        assert io.wait(io.submit(_job(4, p)), timeout_s=30) is not None
    return keys


def test_a_prefetch_reads_in_pieces_and_reports_the_leading_pages_that_landed() -> None:
    _, host = make_pools(make_shape(), 4, "layer_first")
    backend = Counting()
    io = StorageIO(backend, host, num_workers=1)
    keys = _stored(io, 8)
    backend.delete([keys[6]])  # storage holds 6 leading pages
    backend.lose = keys[3]  # and loses the fourth before it is read
    progress = ReadProgress()
    slots = torch.arange(0, 32, dtype=torch.int64)
    job = StorageJob("prefetch", keys, slots, 1, None, progress, piece_pages=2)
    done = io.wait(io.submit(job), timeout_s=30)
    assert done is not None and done.found == 6 and done.planned == 6
    assert backend.gets == [2, 2]  # two a piece; the piece with the hole ends the read
    assert done.results == (True, True, True) + (False,) * 5
    view = progress.view()
    assert (view.found, view.planned, view.arrived) == (6, 6, 3)
    assert view.nbytes == 3 * host.page_bytes(torch.arange(0, 4, dtype=torch.int64))[0].nbytes
    assert io.close(timeout_s=30)


def test_a_prefetch_reads_what_its_plan_says_and_stops_when_cut() -> None:
    _, host = make_pools(make_shape(), 4, "layer_first")
    backend = Counting()
    io = StorageIO(backend, host, num_workers=1)
    keys = _stored(io, 8)
    slots = torch.arange(0, 32, dtype=torch.int64)
    planned = StorageJob("prefetch", keys, slots, 1, lambda found: 3, ReadProgress(), 2)
    done = io.wait(io.submit(planned), timeout_s=30)
    assert done is not None and done.results == (True,) * 3 + (False,) * 5
    assert backend.gets == [2, 1]
    progress = ReadProgress()
    progress.cut()  # before the lookup: nothing is read
    cut = StorageJob("prefetch", keys, slots, 1, None, progress, 2)
    done = io.wait(io.submit(cut), timeout_s=30)
    assert done is not None and done.found == 8 and not any(done.results)
    assert backend.gets == [2, 1] and progress.view().arrived == 0
    assert io.close(timeout_s=30)
