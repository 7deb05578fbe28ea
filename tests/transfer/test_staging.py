"""The staging ring's reuse rules and the piece splitter, on CPU."""

from __future__ import annotations

import pytest
import torch

from transfer.staging import SLOT_ALIGN, StagingRing, block_ranges


class FlagEvent:
    """An event that records when it was waited on."""

    def __init__(self, log: list[str], name: str) -> None:
        self._log, self._name = log, name

    def synchronize(self) -> None:
        self._log.append(f"wait {self._name}")


def test_slots_are_aligned_disjoint_views_of_the_buffer():
    buf = torch.zeros(4 * 256 + 10, dtype=torch.uint8)
    ring = StagingRing(buf, 4)
    assert ring.slot_bytes == 256 and ring.slot_bytes % SLOT_ALIGN == 0
    seen = []
    for value in range(4):
        index, slot = ring.acquire(100)
        slot.fill_(value + 1)
        seen.append(index)
        ring.commit(index, FlagEvent([], str(index)), None)
    assert seen == [0, 1, 2, 3]
    assert [int(buf[i * 256]) for i in range(4)] == [1, 2, 3, 4]
    assert int(buf[100]) == 0  # only the asked-for bytes were handed out


def test_a_slot_is_reused_only_after_its_event_and_host_step():
    log: list[str] = []
    ring = StagingRing(torch.zeros(2 * SLOT_ALIGN, dtype=torch.uint8), 2)
    for name in ("a", "b"):
        index, _ = ring.acquire(8)
        ring.commit(index, FlagEvent(log, name), lambda name=name: log.append(f"scatter {name}"))
    assert log == []  # nothing waits while free slots remain
    index, _ = ring.acquire(8)
    assert index == 0 and log == ["wait a", "scatter a"]
    ring.commit(index, FlagEvent(log, "c"), None)
    ring.flush()
    assert log == ["wait a", "scatter a", "wait b", "scatter b", "wait c"]
    ring.flush()  # nothing left
    assert len(log) == 5


def test_discard_waits_but_drops_host_steps():
    log: list[str] = []
    ring = StagingRing(torch.zeros(2 * SLOT_ALIGN, dtype=torch.uint8), 2)
    index, _ = ring.acquire(8)
    ring.commit(index, FlagEvent(log, "a"), lambda: log.append("scatter a"))
    ring.discard()
    assert log == ["wait a"]
    ring.flush()
    assert log == ["wait a"]


def test_a_failing_host_step_propagates_and_frees_its_slot():
    ring = StagingRing(torch.zeros(SLOT_ALIGN, dtype=torch.uint8), 1)
    index, _ = ring.acquire(8)

    def boom() -> None:
        raise OSError("scatter failed")

    ring.commit(index, FlagEvent([], "a"), boom)
    with pytest.raises(OSError):
        ring.acquire(8)
    assert ring.acquire(8)[0] == 0  # the slot is free again


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError):
        StagingRing(torch.zeros(100, dtype=torch.uint8), 2)
    with pytest.raises(ValueError):
        StagingRing(torch.zeros(128, dtype=torch.int32), 1)
    ring = StagingRing(torch.zeros(SLOT_ALIGN, dtype=torch.uint8), 1)
    with pytest.raises(ValueError, match="do not fit"):
        ring.acquire(SLOT_ALIGN + 1)
    with pytest.raises(ValueError, match="does not fit"):
        block_ranges(4, 200, 100)


@pytest.mark.parametrize(
    ("blocks", "row", "slot"), [(0, 8, 64), (1, 8, 64), (17, 8, 64), (9, 64, 64)]
)
def test_block_ranges_cover_every_block_once_within_a_slot(blocks: int, row: int, slot: int):
    ranges = block_ranges(blocks, row, slot)
    assert [i for r in ranges for i in r] == list(range(blocks))
    assert all(len(r) * row <= slot for r in ranges)
