"""A hypothesis state machine: the disk backend against the memory backend as the
model, through puts, gets, deletes, exists and reopens (the disk store must come
back as it was), with two page sizes so that slots of two classes mix."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from storage_backends import StorageBackend, StorageConfig, create

KEY_POOL = 10
SIZES = (100, 5000)  # one packed class, one spanning two 4 KiB blocks
ids = st.lists(st.integers(0, KEY_POOL - 1), max_size=5)


def _key(i: int) -> bytes:
    return hashlib.sha256(f"stateful-{i}".encode()).digest()


def _size(i: int) -> int:
    return SIZES[i % 2]


def _data(i: int, generation: int) -> bytes:
    return bytes((i * 31 + generation * 7 + j) % 251 for j in range(_size(i)))


class DiskAgainstMemory(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp())
        self.config = StorageConfig(
            backend="disk", path=str(self.root / "store"), max_bytes=1 << 22, sync="none"
        )
        self.disk: StorageBackend = create("disk", self.config)
        self.model: StorageBackend = create("memory", StorageConfig(backend="memory"))
        self.generation = 0

    @rule(batch=ids)
    def put(self, batch: list[int]) -> None:
        self.generation += 1
        keys = [_key(i) for i in batch]
        src = [memoryview(_data(i, self.generation)) for i in batch]
        assert self.disk.put(keys, src) == self.model.put(keys, src)

    @rule(batch=ids)
    def get(self, batch: list[int]) -> None:
        keys = [_key(i) for i in batch]
        mine = [memoryview(bytearray(_size(i))) for i in batch]
        theirs = [memoryview(bytearray(_size(i))) for i in batch]
        hits = self.disk.get(keys, mine)
        assert hits == self.model.get(keys, theirs)
        for hit, a, b in zip(hits, mine, theirs, strict=True):
            assert not hit or bytes(a) == bytes(b)

    @rule(batch=ids)
    def delete(self, batch: list[int]) -> None:
        keys = [_key(i) for i in batch]
        assert self.disk.delete(keys) == self.model.delete(keys)

    @rule(batch=ids)
    def exists(self, batch: list[int]) -> None:
        keys = [_key(i) for i in batch]
        assert self.disk.exists(keys) == self.model.exists(keys)

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

    def teardown(self) -> None:
        self.disk.close()
        self.model.close()
        shutil.rmtree(self.root, ignore_errors=True)


DiskAgainstMemory.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestDiskAgainstMemory = DiskAgainstMemory.TestCase
