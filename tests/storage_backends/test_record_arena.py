"""RecordArena: records built into a reused buffer are the records encode_page builds."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from storage_backends.page_format import HEADER_BYTES, Verdict, encode_page, validate
from storage_backends.record_arena import RecordArena


def _key(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest()


def _payloads(n: int, size: int, seed: int) -> list[memoryview]:
    return [memoryview(bytes((seed + i + j) % 251 for j in range(size))) for i in range(n)]


def test_records_match_encode_page_and_verify() -> None:
    arena = RecordArena(1 << 20)
    pays = _payloads(4, 1000, 0)
    arena.start(sum(HEADER_BYTES + len(p) for p in pays))
    records = [arena.encode(_key(i), p) for i, p in enumerate(pays)]
    for i, (record, payload) in enumerate(zip(records, pays, strict=True)):
        assert bytes(record) == encode_page(_key(i), payload)
        assert validate(memoryview(record), _key(i), len(payload)) is Verdict.OK
    assert arena.capacity == sum(len(r) for r in records)


def test_next_batch_reuses_the_buffer_with_new_contents() -> None:
    arena = RecordArena(1 << 20)
    first = _payloads(2, 500, 1)
    arena.start(2 * (HEADER_BYTES + 500))
    [arena.encode(_key(i), p) for i, p in enumerate(first)]
    capacity = arena.capacity
    second = _payloads(2, 500, 7)
    arena.start(2 * (HEADER_BYTES + 500))
    records = [arena.encode(_key(10 + i), p) for i, p in enumerate(second)]
    assert arena.capacity == capacity  # no new buffer
    for i, record in enumerate(records):
        assert bytes(record) == encode_page(_key(10 + i), second[i])


def test_records_beyond_the_cap_are_built_on_their_own() -> None:
    cap = 2 * (HEADER_BYTES + 300)
    arena = RecordArena(cap)
    pays = _payloads(5, 300, 3)
    arena.start(5 * (HEADER_BYTES + 300))
    records = [arena.encode(_key(i), p) for i, p in enumerate(pays)]
    assert arena.capacity == cap
    assert [isinstance(r, bytes) for r in records] == [False, False, True, True, True]
    assert [bytes(r) for r in records] == [encode_page(_key(i), p) for i, p in enumerate(pays)]


def test_records_are_read_only_and_discard_keeps_them_intact() -> None:
    arena = RecordArena(1 << 20)
    payload = _payloads(1, 200, 5)[0]
    arena.start(HEADER_BYTES + 200)
    record = arena.encode(_key(0), payload)
    assert isinstance(record, memoryview) and record.readonly
    arena.discard()
    assert arena.capacity == 0
    arena.start(HEADER_BYTES + 200)
    arena.encode(_key(1), _payloads(1, 200, 9)[0])  # a new buffer: the old record stays
    assert bytes(record) == encode_page(_key(0), payload)


def test_zero_cap_builds_every_record_alone() -> None:
    arena = RecordArena(0)
    arena.start(10_000)
    assert isinstance(arena.encode(_key(0), memoryview(b"abc")), bytes)
    with pytest.raises(ValueError, match="max_bytes"):
        RecordArena(-1)


@pytest.mark.parametrize("cap", [1 << 20, 0])  # in the buffer, and each record on its own
@pytest.mark.parametrize("splits", [[1000], [1, 999], [300, 300, 400], [0, 500, 0, 500]])
def test_records_of_runs_are_the_records_of_their_concatenation(
    cap: int, splits: list[int]
) -> None:
    arena = RecordArena(cap)
    pays = _payloads(3, 1000, 7)
    arena.start(3 * (HEADER_BYTES + 1000))
    records = []
    for i, payload in enumerate(pays):
        ends = [sum(splits[: j + 1]) for j in range(len(splits))]
        runs = [payload[end - n : end] for n, end in zip(splits, ends, strict=True)]
        records.append(arena.encode_runs(_key(i), runs))
    for i, (record, payload) in enumerate(zip(records, pays, strict=True)):
        assert bytes(record) == encode_page(_key(i), payload)
        assert validate(memoryview(record), _key(i), len(payload)) is Verdict.OK


def test_a_released_region_is_reused_once_every_earlier_one_is_released() -> None:
    size = HEADER_BYTES + 100
    arena = RecordArena(3 * size)
    arena.start(10 * size)  # more than the buffer: built as replies free room
    pays = _payloads(6, 100, 2)
    regions = []
    for i in range(3):
        assert arena.fits([size])
        arena.encode(_key(i), pays[i])
        regions.append(arena.seal())
    assert not arena.fits([size])  # full until a request is answered
    arena.release(regions[1])  # out of order: its room waits for the region before it
    assert not arena.fits([size])
    arena.release(regions[0])
    assert arena.fits([size, size]) and not arena.fits([size] * 3)
    records = [arena.encode(_key(3 + i), pays[3 + i]) for i in range(2)]
    assert all(isinstance(r, memoryview) for r in records) and arena.fresh == 0
    assert [bytes(r) for r in records] == [encode_page(_key(3 + i), pays[3 + i]) for i in range(2)]


class ArenaMachine(RuleBasedStateMachine):
    """Records built, sealed into regions and released in any order: a live record's bytes
    are never overwritten, and once every region is released the whole buffer is free."""

    def __init__(self) -> None:
        super().__init__()
        self.arena = RecordArena(2048)
        self.arena.start(1 << 20)
        self.open: list[tuple[memoryview | bytes, bytes]] = []  # unsealed: (record, expected)
        self.live: dict[int, list[tuple[memoryview | bytes, bytes]]] = {}
        self.n = 0

    @rule(length=st.integers(0, 700))
    def build(self, length: int) -> None:
        self.n += 1
        payload = bytes((self.n + j) % 251 for j in range(length))
        fits = self.arena.fits([HEADER_BYTES + length])
        record = self.arena.encode(_key(self.n), memoryview(payload))
        assert isinstance(record, memoryview) == fits
        self.open.append((record, encode_page(_key(self.n), payload)))

    @rule()
    def seal(self) -> None:
        self.live[self.arena.seal()] = self.open
        self.open = []

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        if self.live:
            region = data.draw(st.sampled_from(sorted(self.live)))
            self.arena.release(region)
            del self.live[region]

    @invariant()
    def live_records_are_intact(self) -> None:
        for records in [self.open, *self.live.values()]:
            assert all(bytes(record) == expected for record, expected in records)

    @invariant()
    def all_released_means_all_free(self) -> None:
        if not self.live and not self.open:
            assert self.arena.fits([self.arena.capacity])


TestArenaMachine = ArenaMachine.TestCase
TestArenaMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
