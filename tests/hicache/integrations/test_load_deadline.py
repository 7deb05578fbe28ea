"""Deadlines for the engines' own loads, on a fake clock: pure, no engine needed."""

from __future__ import annotations

import pytest

from hicache.integrations.load_deadline import LoadBounds, prefill_speed
from tests.hicache.fake_clock import FakeClock

PAGE_TOKENS, PAGE_BYTES = 16, 16 * 1024  # 16 tokens of 1 KiB of KV each
PREFILL = 16_000.0  # a page recomputes in 1 ms


def bounds(clock: FakeClock, prefill: float = PREFILL) -> LoadBounds:
    return LoadBounds(PAGE_TOKENS, prefill, "memory", clock=clock)


def measured(b: LoadBounds, bytes_per_s: float) -> LoadBounds:
    for _ in range(3):
        b.rates.record_s2h(PAGE_BYTES, PAGE_BYTES / bytes_per_s)
    return b


class Pieces:
    """A read of pages ``[lo, hi)`` taking ``seconds_per_page`` on the fake clock."""

    def __init__(
        self, clock: FakeClock, seconds_per_page: float, missing: frozenset[int] = frozenset()
    ) -> None:
        self.clock, self.per_page, self.missing = clock, seconds_per_page, missing
        self.calls: list[tuple[int, int]] = []

    def __call__(self, lo: int, hi: int) -> list[bool]:
        self.calls.append((lo, hi))
        self.clock.advance(self.per_page * (hi - lo))
        return [p not in self.missing for p in range(lo, hi)]


def test_cold_start_reads_everything_and_measures_it() -> None:
    clock = FakeClock()
    b = bounds(clock)
    assert b.plan(16, PAGE_BYTES) == (16, None)
    read = Pieces(clock, 0.01)  # far slower than recomputing: not known yet
    assert b.read(16, PAGE_BYTES, read) == [True] * 16
    s2h = b.rates.snapshot().s2h
    assert s2h is not None and s2h.bytes_per_s == pytest.approx(PAGE_BYTES / 0.01)


def test_without_a_prefill_speed_nothing_is_bounded() -> None:
    clock = FakeClock()
    b = measured(bounds(clock, prefill=0.0), 1.0)  # a hopeless store, but no speed to compare
    assert b.read(8, PAGE_BYTES, Pieces(clock, 1.0)) == [True] * 8


def test_a_hopeless_store_is_not_read() -> None:
    clock = FakeClock()
    b = measured(bounds(clock), 1e6)  # a page in 16 ms, recomputed in 1 ms
    read = Pieces(clock, 0.016)
    assert b.read(8, PAGE_BYTES, read) == [False] * 8 and read.calls == []


def test_a_read_past_its_deadline_stops_between_pieces() -> None:
    clock = FakeClock()
    b = measured(bounds(clock), 1e9)  # expected: 16 us a page
    plan = b.plan(16, PAGE_BYTES)
    assert plan.pages == 16 and plan.deadline_s is not None and plan.deadline_s < 0.01
    read = Pieces(clock, 0.01)  # but the store now takes 10 ms a page
    hits = b.read(16, PAGE_BYTES, read)
    assert hits == [True, True] + [False] * 14 and read.calls == [(0, 2)]
    s2h = b.rates.snapshot().s2h
    assert s2h is not None and s2h.bytes_per_s < 0.2e9  # the slow piece counted


@pytest.mark.parametrize(("prefix", "want"), [(True, 4), (False, 8)])
def test_a_miss_ends_a_prefix_read_only(prefix: bool, want: int) -> None:
    clock = FakeClock()
    b = bounds(clock)
    read = Pieces(clock, 0.0, missing=frozenset({3}))
    hits = b.read(8, PAGE_BYTES, read, prefix=prefix)
    assert len(read.calls) == want
    assert hits[:3] == [True] * 3 and not hits[3]
    assert hits[4:] == ([False] * 4 if prefix else [True] * 4)


@pytest.mark.parametrize("bad", [-1, "fast", True, None])
def test_a_bad_prefill_speed_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="prefill_tokens_per_s"):
        prefill_speed({"prefill_tokens_per_s": bad})
    assert prefill_speed({}) == 0.0 and prefill_speed({"prefill_tokens_per_s": 5}) == 5.0
