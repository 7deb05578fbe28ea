"""A hypothesis state machine: the disk backend against the memory backend as the model,
through puts, gets, deletes, exists, contains and reopens, in a store small enough to
be full most of the time, with page sizes that change with the "era" (a new model
on the same store) so that slots of several classes mix and a new size meets a
store full of others.

The model has no capacity limit. The disk store chooses which pages to evict; it
reports every key it removes (``take_removed``: evicted or deleted), and the test
deletes those keys from the model as well. So after every step the two hold the
same keys, and the machine asserts:

- a get hits exactly the keys the model holds, and every hit is bit-exact (never a
  wrong byte); ``contains`` and ``exists`` agree with the model, so a key reported
  present is readable until a later call reports it removed;
- a put stores every page (the model's answer) and only removes keys the model held;
- what a put evicts is bounded: beyond the bytes its records need past the free
  bytes (and the one page that crosses that line), per new slot one slot of its
  size, its alignment and one slot of the largest stored size (``disk.room``);
- entries and bytes agree with the model; bytes used stay within ``max_bytes``, and
  the segment files within ``max_bytes`` plus one slot; a reopen changes nothing.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from storage_backends import StorageBackend, StorageConfig, create
from storage_backends.disk.layout import (
    BLOCK,
    RECORD_LEAD,
    SEGMENT_PREFIX,
    round_up,
    slot_class,
)
from storage_backends.page_format import HEADER_BYTES

KEY_POOL = 12
# Page sizes per era: packed slots of several strides, then a size that spans blocks.
ERA_SIZES = ((100, 5000), (3000, 9000), (7000, 12000))
MAX_BYTES = 24 << 10  # less than any era's keys take
ALL_SIZES = [size for sizes in ERA_SIZES for size in sizes]
LARGEST_STRIDE = max(slot_class(size, direct_io=False).stride for size in ALL_SIZES)
ids = st.lists(st.integers(0, KEY_POOL * len(ERA_SIZES) - 1), max_size=5)


def _key(i: int) -> bytes:
    return hashlib.sha256(f"stateful-{i}".encode()).digest()


def _size(i: int) -> int:
    sizes = ERA_SIZES[i // KEY_POOL]
    return sizes[i % len(sizes)]


def _data(i: int, generation: int) -> bytes:
    return bytes((i * 31 + generation * 7 + j) % 251 for j in range(_size(i)))


class DiskAgainstMemory(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp())
        self.config = StorageConfig(
            backend="disk",
            path=str(self.root / "store"),
            max_bytes=MAX_BYTES,
            sync="none",
            segment_bytes=1 << 20,
        )
        self.disk: StorageBackend = create("disk", self.config)
        self.model: StorageBackend = create("memory", StorageConfig(backend="memory"))
        self.generation = 0
        self.era = 0
        self.full = False  # whether a put of this era evicted

    def _sync_removed(self) -> list[bytes]:
        """Delete from the model what the disk store removed; return those keys."""
        removed = self.disk.take_removed()
        self.model.delete(removed)
        return removed

    @rule(order=st.permutations(range(KEY_POOL)), count=st.integers(1, KEY_POOL))
    def fill(self, order: list[int], count: int) -> None:
        """A put of ``count`` of this era's keys at once (more than the store holds when
        many: its oldest pages are then given up, as if stored and evicted)."""
        self.put(order[:count])

    @rule(offsets=st.lists(st.integers(0, KEY_POOL - 1), max_size=8))
    def put(self, offsets: list[int]) -> None:
        self.generation += 1
        batch = [self.era * KEY_POOL + n for n in offsets]
        keys = [_key(i) for i in batch]
        src = [memoryview(_data(i, self.generation)) for i in batch]
        held = self.model.contains(keys)
        before = self.disk.stats().bytes_used
        assert self.disk.put(keys, src) == self.model.put(keys, src)
        removed = self._sync_removed()
        if removed:
            self.full = True
            event(f"a put evicted (era {self.era})")  # --hypothesis-show-statistics
        new = {i for i, had in zip(batch, held, strict=True) if not had}
        self._check_evictions(removed, new, before)

    def _check_evictions(self, removed: list[bytes], new: set[int], before: int) -> None:
        sizes = {_key(i): _size(i) for i in range(KEY_POOL * len(ERA_SIZES))}
        evicted = sum(HEADER_BYTES + sizes[key] for key in removed)
        records = sum(HEADER_BYTES + _size(i) for i in new)
        need = max(0, before + records - MAX_BYTES)
        room = 0
        for i in new:
            cls = slot_class(_size(i), direct_io=False)
            room += cls.stride + cls.align + LARGEST_STRIDE
        assert evicted <= need + LARGEST_STRIDE + room, (evicted, need, room)

    @precondition(lambda self: self.full and self.era + 1 < len(ERA_SIZES))
    @rule()
    def next_era(self) -> None:
        """Puts from now on bring pages of other sizes into a store that was full (older
        keys stay readable)."""
        self.era += 1
        self.full = False

    @rule(batch=ids)
    def get(self, batch: list[int]) -> None:
        keys = [_key(i) for i in batch]
        mine = [memoryview(bytearray(_size(i))) for i in batch]
        theirs = [memoryview(bytearray(_size(i))) for i in batch]
        hits = self.disk.get(keys, mine)
        assert hits == self.model.get(keys, theirs)
        for hit, a, b in zip(hits, mine, theirs, strict=True):
            assert not hit or bytes(a) == bytes(b)
        assert self._sync_removed() == []  # nothing damaged to drop

    @rule(batch=ids)
    def delete(self, batch: list[int]) -> None:
        keys = [_key(i) for i in batch]
        assert self.disk.delete(keys) == self.model.delete(keys)
        self._sync_removed()

    @rule(batch=ids)
    def exists(self, batch: list[int]) -> None:
        keys = [_key(i) for i in batch]
        assert self.disk.exists(keys) == self.model.exists(keys)

    @rule(batch=ids)
    def contains(self, batch: list[int]) -> None:
        keys = [_key(i) for i in batch]
        assert self.disk.contains(keys) == self.model.contains(keys)

    @precondition(lambda self: self.generation > 0)
    @rule()
    def reopen(self) -> None:
        self.disk.close()
        self.disk = create("disk", self.config)

    @invariant()
    def same_size(self) -> None:
        mine, theirs = self.disk.stats(), self.model.stats()
        assert (mine.entries, mine.bytes_used, mine.corrupt) == (
            theirs.entries,
            theirs.bytes_used,
            0,
        )
        assert mine.bytes_used <= MAX_BYTES

    @invariant()
    def files_within_max_bytes(self) -> None:
        segments = list(self.root.glob(f"store/{SEGMENT_PREFIX}*"))
        files = sum(p.stat().st_size - RECORD_LEAD for p in segments)  # each: a lead, slots
        assert files <= round_up(MAX_BYTES + LARGEST_STRIDE, BLOCK)

    def teardown(self) -> None:
        self.disk.close()
        self.model.close()
        shutil.rmtree(self.root, ignore_errors=True)


DiskAgainstMemory.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestDiskAgainstMemory = DiskAgainstMemory.TestCase
