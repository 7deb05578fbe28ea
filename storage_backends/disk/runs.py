"""Spans: a put batch's records that lie back to back in one segment, written with one
``pwritev``.

The allocator hands a batch's slots out as runs of adjacent slots (slots bumped
together from a segment's tail, free slots that happen to follow each other). One
write per span instead of one per record costs, on a Linux page cache, about the CPU
of a raw write of the payloads (measured: one write per record took ~1.6x that at 64
KiB pages). The gap between a record's end and the next slot (under one alignment
unit) is written as zeros. Gets read runs too, planned their own way (``read_plan``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NamedTuple

from storage_backends.disk.layout import BLOCK, SlotRun

_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
GAP_MAX = BLOCK  # a gap is shorter than one alignment unit
_ZEROS = bytes(GAP_MAX)


class Span(NamedTuple):
    """Records written with one ``pwritev``: the ``first``-th to the ``first + n_records
    - 1``-th of a group's pages, in consecutive slots of ``segment`` from ``offset``."""

    segment: int
    offset: int
    first: int
    n_records: int


def spans(runs: Sequence[SlotRun], stride: int, iovs_per_record: int, parts: int) -> list[Span]:
    """Cut the slot runs a group of pages was given (its pages in order, run after run)
    into spans within the kernel's iovec limit and, so that ``parts`` threads share the
    work, at most ``total / parts`` records long."""
    total = sum(run.n_slots for run in runs)
    cap = max(1, min(_IOV_MAX // iovs_per_record, -(-total // max(1, parts))))
    out: list[Span] = []
    first = 0
    for run in runs:
        for start in range(0, run.n_slots, cap):
            n_records = min(cap, run.n_slots - start)
            out.append(Span(run.segment, run.offset + start * stride, first + start, n_records))
        first += run.n_slots
    return out


def gap(length: int) -> memoryview:
    """``length`` zero bytes to write between two records of a span."""
    if not 0 <= length < GAP_MAX:
        raise ValueError(f"a gap between records is under {GAP_MAX} bytes, got {length}")
    return memoryview(_ZEROS)[:length]
