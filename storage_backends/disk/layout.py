"""Where a page record lives: slot classes, locations and the store directory's file names.

A page record (``page_format``: header, then payload) takes one slot of its size
class (free space between slots has no class: ``allocator``). A class is a stride
and an alignment: records whose 4 KiB rounding costs at most ``_ROUND_4K_WASTE``
(pages of ~200 KiB and more) get 4 KiB-aligned slots, the others are packed at
64-byte granularity, so that a 4 KiB page takes 4,160 bytes
(1.016x) and a 16 KiB one 16,448 (1.004x) instead of 8 and 20 KiB. With O_DIRECT
every slot is 4 KiB-aligned (the kernel's rule), whatever it costs in space.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

from storage_backends.page_format import HEADER_BYTES

BLOCK = 4096
PACK = 64
_ROUND_4K_WASTE = 0.02
# How far the slots of a segment lie from the start of its file, in stores created by
# this version (the index's ``meta`` says; older stores: 0): 8 bytes, so that the
# payload after a record's 56-byte header starts on a 64-byte boundary of the file, as
# the caller's buffers do (host pools, tensors, pages of memory). The kernel's copy
# between a buffer and the page cache runs at a speed that depends on how the two line
# up: measured here (CPU, warm page cache), a payload at 56 mod 64 read 1.3-1.5x and
# wrote up to 1.4x slower than one at 0 mod 64, 64 KiB to 8 MiB pages. Slot offsets
# (index, allocator) do not change; ``segments`` adds the lead to every file offset.
# Direct-I/O stores, whose bytes go through aligned bounce buffers anyway, keep 0.
RECORD_LEAD = -HEADER_BYTES % PACK

INDEX_DIR = "index"
SEGMENT_PREFIX = "segment-"
SEGMENT_SUFFIX = ".dat"
CLEAN_MARKER = "clean-close"  # present only while no process has the store open
OWNERS_LOCK = "owners.lock"  # every process holding the store open has a shared flock


class SlotClass(NamedTuple):
    """Slots of one stride and alignment (what a page of a given size takes; freed
    space has no class, ``allocator``)."""

    stride: int
    align: int

    def pack(self) -> bytes:
        return _CLASS.pack(self.stride, self.align)

    @staticmethod
    def unpack(raw: bytes) -> SlotClass:
        stride, align = _CLASS.unpack_from(raw)
        return SlotClass(stride, align)


_CLASS = struct.Struct(">IH")
CLASS_BYTES = _CLASS.size


def round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def slot_class(payload_len: int, direct_io: bool) -> SlotClass:
    """The class a page of ``payload_len`` bytes is stored in."""
    record = HEADER_BYTES + payload_len
    block = round_up(record, BLOCK)
    if direct_io or block <= record * (1 + _ROUND_4K_WASTE):
        return SlotClass(block, BLOCK)
    return SlotClass(round_up(record, PACK), PACK)


class Slot(NamedTuple):
    """A slot's place: segment number and byte offset in it."""

    segment: int
    offset: int

    def pack(self) -> bytes:
        """Big-endian, so that a cursor walks a segment's slots in offset order."""
        return _SLOT.pack(self.segment, self.offset)

    @staticmethod
    def unpack(raw: bytes) -> Slot:
        segment, offset = _SLOT.unpack_from(raw)
        return Slot(segment, offset)


_SLOT = struct.Struct(">IQ")
SLOT_BYTES = _SLOT.size
SLOT_STRUCT = _SLOT  # the packed form of a ``Slot``, for hot loops


class SlotRun(NamedTuple):
    """``n_slots`` slots of one class back to back from ``offset`` in ``segment`` (what
    the allocator hands out: a batch's records in one run take one ``pwritev``)."""

    segment: int
    offset: int
    n_slots: int

    def slots(self, stride: int) -> list[Slot]:
        return [Slot(self.segment, self.offset + n * stride) for n in range(self.n_slots)]


class Location(NamedTuple):
    """What the index stores per page: its slot, class, payload length and recency stamp
    (flat, so that a batch's lookups build one object a page)."""

    segment: int
    offset: int
    stride: int
    align: int
    payload_len: int
    stamp: int

    @staticmethod
    def of(slot: Slot, cls: SlotClass, payload_len: int, stamp: int) -> Location:
        return Location(slot.segment, slot.offset, cls.stride, cls.align, payload_len, stamp)

    def pack(self) -> bytes:
        return _LOCATION.pack(*self)

    @staticmethod
    def packed(slot: Slot, cls: SlotClass, payload_len: int, stamp: int) -> bytes:
        """``Location.of(...).pack()`` without building the location."""
        return _LOCATION.pack(*slot, *cls, payload_len, stamp)

    @staticmethod
    def packed_run(run: SlotRun, cls: SlotClass, lengths: Sequence[int], stamp: int) -> list[bytes]:
        """Packed locations of records of ``lengths`` in the slots of ``run``, in order,
        stamped from ``stamp`` up."""
        pack, segment, stride, align = _LOCATION.pack, run.segment, cls.stride, cls.align
        return [
            pack(segment, run.offset + n * stride, stride, align, length, stamp + n)
            for n, length in enumerate(lengths)
        ]

    @staticmethod
    def unpack(raw: bytes | memoryview) -> Location | None:
        """None when ``raw`` is not a location (a damaged index value)."""
        if len(raw) != _LOCATION.size:
            return None
        return Location._make(_LOCATION.unpack_from(raw))

    @property
    def slot(self) -> Slot:
        return Slot(self.segment, self.offset)

    @property
    def cls(self) -> SlotClass:
        return SlotClass(self.stride, self.align)

    @property
    def record_len(self) -> int:
        return HEADER_BYTES + self.payload_len


_LOCATION = struct.Struct("<IQIHQQ")
# The packed form of a ``Location``, for hot loops that unpack a batch's index values
# into plain fields (segment, offset, stride, align, payload_len, stamp).
LOCATION_STRUCT = _LOCATION


def segment_name(segment: int) -> str:
    return f"{SEGMENT_PREFIX}{segment:06d}{SEGMENT_SUFFIX}"


def segment_number(name: str) -> int | None:
    """The number in a segment file's name; None for any other file."""
    if not (name.startswith(SEGMENT_PREFIX) and name.endswith(SEGMENT_SUFFIX)):
        return None
    digits = name[len(SEGMENT_PREFIX) : -len(SEGMENT_SUFFIX)]
    return int(digits) if digits.isdigit() else None
