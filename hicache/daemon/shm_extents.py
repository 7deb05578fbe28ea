"""Extents: a first-fit allocator of contiguous byte ranges in the shared-memory slab."""

from __future__ import annotations

import bisect
import itertools

from storage_backends.remote.protocol import Span

# Every range starts and ends on this granularity (so records start page-aligned and
# the free list stays short).
GRAIN = 4096


def _round_up(nbytes: int) -> int:
    return -(-nbytes // GRAIN) * GRAIN


class Extents:
    """Free space of a region of ``size`` bytes, handed out as ``Span`` ranges.

    ``take`` returns a span of at least the bytes asked (rounded up to ``GRAIN``) or
    None when no free run is long enough; ``give_back`` returns a span ``take``
    handed out (ValueError for one that overlaps free space: a double free).
    Not thread-safe: the caller locks. Free runs are merged with their neighbours,
    so a region whose spans all came back is one free run again. ``overlaps_free`` and
    ``check`` mutate nothing.
    """

    def __init__(self, size: int) -> None:
        if size < GRAIN:
            raise ValueError(f"a region needs at least {GRAIN} bytes, got {size}")
        self.size = size - size % GRAIN
        self._starts = [0]  # free runs, sorted by start
        self._lengths = {0: self.size}
        self.used = 0

    def take(self, nbytes: int) -> Span | None:
        want = _round_up(max(nbytes, 1))
        for i, start in enumerate(self._starts):
            length = self._lengths[start]
            if length < want:
                continue
            del self._lengths[start]
            if length == want:
                del self._starts[i]
            else:
                self._starts[i] = start + want
                self._lengths[start + want] = length - want
            self.used += want
            return Span(start, want)
        return None

    def give_back(self, span: Span) -> None:
        start, length = span.offset, _round_up(span.length)
        i = bisect.bisect_left(self._starts, start)
        before = self._starts[i - 1] if i > 0 else None
        after = self._starts[i] if i < len(self._starts) else None
        if (before is not None and before + self._lengths[before] > start) or (
            after is not None and start + length > after
        ):
            raise ValueError(f"span {span} overlaps free space (given back twice?)")
        if start % GRAIN or start + length > self.size:
            raise ValueError(f"span {span} was not handed out by this allocator")
        self.used -= length
        if after is not None and start + length == after:
            length += self._lengths.pop(after)
            del self._starts[i]
        if before is not None and before + self._lengths[before] == start:
            self._lengths[before] += length
            return
        self._starts.insert(i, start)
        self._lengths[start] = length

    def overlaps_free(self, span: Span) -> bool:
        """Whether any byte of ``span`` (rounded up to ``GRAIN``) is free."""
        start, end = span.offset, span.offset + _round_up(span.length)
        i = bisect.bisect_right(self._starts, start)
        before = self._starts[i - 1] if i > 0 else None
        after = self._starts[i] if i < len(self._starts) else None
        return (before is not None and before + self._lengths[before] > start) or (
            after is not None and after < end
        )

    def check(self) -> None:
        """Assert the free runs are sorted, apart (merged), inside the region, and add up
        with ``used`` to its size."""
        assert sorted(self._lengths) == self._starts, "free runs and their lengths disagree"
        for a, b in itertools.pairwise(self._starts):
            assert a + self._lengths[a] < b, f"free runs at {a} and {b} overlap or touch"
        for start in self._starts:
            length = self._lengths[start]
            assert length > 0 and start % GRAIN == 0 and length % GRAIN == 0, start
            assert start + length <= self.size, f"a free run at {start} passes the end"
        free = sum(self._lengths.values())
        assert free + self.used == self.size, f"free {free} + used {self.used} != {self.size}"
