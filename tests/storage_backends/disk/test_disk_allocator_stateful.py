"""The disk store's slot allocator against a model of which slots are taken: the runs it
hands out never overlap each other or a taken slot, stay inside their segment, and
come whole until the store is allocated up to ``max_bytes`` and no free space between
taken slots holds one, whatever class freed it (free space has no class)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from storage_backends import StorageConfig
from storage_backends.disk.index import DiskIndex
from storage_backends.disk.layout import Slot, SlotClass, round_up, slot_class

SEGMENT = 1 << 20
MAX_BYTES = 3 * SEGMENT + SEGMENT // 2
CLASSES = [slot_class(size, direct_io=False) for size in (60_000, 200_000)]


class AllocatorModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="hicache-alloc-"))
        config = StorageConfig(
            backend="disk",
            path=str(self.root),
            max_bytes=MAX_BYTES,
            sync="none",
            segment_bytes=SEGMENT,
        )
        self.index = DiskIndex(self.root / "index", config)
        self.taken: dict[Slot, SlotClass] = {}

    def teardown(self) -> None:
        self.index.close()
        shutil.rmtree(self.root, ignore_errors=True)

    @rule(which=st.sampled_from(CLASSES), count=st.integers(1, 40))
    def take(self, which: SlotClass, count: int) -> None:
        holes = self._holes_that_fit(which)
        with self.index.writing() as writer:
            runs = writer.alloc.take(which, count)
            allocated = writer.alloc.allocated
        got = [slot for run in runs for slot in run.slots(which.stride)]
        assert len(got) <= count
        for slot in got:
            assert slot.offset % which.align == 0
            assert slot.offset + which.stride <= SEGMENT, f"{slot} runs past its segment"
            assert not self._overlaps(slot, which), f"{slot} overlaps a taken slot"
            self.taken[slot] = which
        if len(got) < count:  # short only when the store is allocated up to max_bytes
            assert allocated + which.stride > MAX_BYTES
            assert len(got) >= holes, "free space between taken slots went unused"

    @precondition(lambda self: bool(self.taken))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        slot = data.draw(st.sampled_from(sorted(self.taken)))
        cls = self.taken.pop(slot)
        with self.index.writing() as writer:
            writer.alloc.release(slot, cls)

    @invariant()
    def allocated_covers_the_taken_slots(self) -> None:
        with self.index.writing() as writer:
            allocated = writer.alloc.allocated
        assert allocated >= sum(cls.stride for cls in self.taken.values())
        assert allocated <= MAX_BYTES + max(cls.stride for cls in CLASSES)
        # No free extent ends at a tail: each segment's tail is its last taken slot's end.
        ends: dict[int, int] = {}
        for slot, cls in self.taken.items():
            ends[slot.segment] = max(ends.get(slot.segment, 0), slot.offset + cls.stride)
        assert allocated == sum(ends.values()), "a tail is not where the last taken slot ends"

    def _holes_that_fit(self, cls: SlotClass) -> int:
        """How many slots of ``cls`` the free space between taken slots holds."""
        fit = 0
        for segment in {slot.segment for slot in self.taken}:
            at = 0
            for slot in sorted(s for s in self.taken if s.segment == segment):
                fit += max(0, slot.offset - round_up(at, cls.align)) // cls.stride
                at = slot.offset + self.taken[slot].stride
        return fit

    def _overlaps(self, slot: Slot, cls: SlotClass) -> bool:
        return any(
            other.segment == slot.segment
            and other.offset < slot.offset + cls.stride
            and slot.offset < other.offset + other_cls.stride
            for other, other_cls in self.taken.items()
        )


AllocatorModel.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_allocator_keeps_slots_apart = AllocatorModel.TestCase
