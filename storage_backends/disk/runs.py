"""Runs: a put batch's records that lie back to back in one segment, written with one
``pwritev``.

Slots bumped together from a segment's tail are contiguous, so a batch usually
writes one stretch of a segment. One write per stretch instead of one per record
costs, on a Linux page cache, about the CPU of a raw write of the payloads (measured:
one write per record took ~1.6x that at 64 KiB pages). The gap between a record's
end and the next slot (under one alignment unit) is written as zeros. Gets read runs
too, planned their own way (``read_plan``).
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
