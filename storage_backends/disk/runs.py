"""Runs: a batch's records that lie back to back in one segment, moved with one syscall.

Slots bumped together from a segment's tail are contiguous, so a batch usually
writes, and later reads, one stretch of a segment. One ``pwritev``/``preadv`` per
stretch instead of one per record saves the per-call cost and, on Linux page
caches, the much larger cost of many small writes each ending inside a page
(measured: per-record writes took 1.5-2.5x the CPU of one write of the same bytes).
The gap between a record's end and the next slot (under one alignment unit) is
zeros when written and read into scratch space.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NamedTuple

from storage_backends.disk.layout import BLOCK

_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
GAP_MAX = BLOCK  # a gap is shorter than one alignment unit
_ZEROS = bytes(GAP_MAX)


class Extent(NamedTuple):
    """Where one record of a batch goes: its segment, offset, length and slot stride."""

    segment: int
    offset: int
    length: int
    stride: int

    @property
    def joinable_end(self) -> int:
        """Where the next record of a run would start; -1 if none may follow this one
        (a stride that is not the record plus a short gap: a damaged index entry)."""
        gap = self.stride - self.length
        return self.offset + self.stride if 0 <= gap < GAP_MAX else -1


class Run(NamedTuple):
    """Records at consecutive slots of one segment: ``members`` are their positions in
    the batch, in offset order, and ``offset`` is the first one's."""

    segment: int
    offset: int
    members: list[int]


def plan_runs(extents: Sequence[Extent], iovs_per_record: int, parts: int) -> list[Run]:
    """Group ``extents`` into runs of slots that follow each other, each within the
    kernel's iovec limit and, so that ``parts`` threads share the work, at most
    ``len(extents) / parts`` records long."""
    order = sorted(range(len(extents)), key=extents.__getitem__)  # by segment, offset
    cap = max(1, min(_IOV_MAX // iovs_per_record, -(-len(extents) // max(1, parts))))
    runs: list[Run] = []
    end = -1
    for i in order:
        ext = extents[i]
        last = runs[-1] if runs else None
        if last and last.segment == ext.segment and end == ext.offset and len(last.members) < cap:
            last.members.append(i)
        else:
            runs.append(Run(ext.segment, ext.offset, [i]))
        end = ext.joinable_end
    return runs


def gap(length: int) -> memoryview:
    """``length`` zero bytes to write between two records of a run."""
    return memoryview(_ZEROS)[:length]


def scratch() -> memoryview:
    """Room to read the gaps between a run's records into (every gap is shorter than one
    alignment unit; the gaps of one run share it, their bytes are never looked at)."""
    return memoryview(bytearray(GAP_MAX))


def record_spans(got: int, starts: Sequence[int], lengths: Sequence[int]) -> list[int]:
    """How many bytes of each record (at ``starts[i]`` from the run's start, ``lengths[i]``
    long) a read or write that moved ``got`` bytes covered."""
    return [max(0, min(length, got - start)) for start, length in zip(starts, lengths, strict=True)]
