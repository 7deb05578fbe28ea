"""Records stored as a caller framed them (the daemon's PUT path), checksum unverified.

A record is ``page_format``'s header + payload. Its checksum covers the payload only,
not the key, so a record framed for one key becomes a record for another by rewriting
the header's 32-byte key field: no checksum pass and no payload copy. A backend's
``put_records`` stores each record under its store key this way, with the checksum its
header carries; its ``get_records`` reads a stored record whole (header + payload) into
the caller's buffer, verified as every read is (checksum included: a record whose
checksum lies is a miss from its first read on, and dropped), so the caller can rewrite
the key again on the way out.

Only the shape of a record is checked here (length, magic, version, the header's payload
length); the caller checked its header against its own key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from storage_backends.batch import byte_view, check_keys
from storage_backends.page_format import (
    FORMAT_VERSION,
    HEADER_BYTES,
    KEY_BYTES,
    MAGIC,
    parse_header,
)

# Where the key sits in a header: after magic (4 bytes), version and reserved (2 each).
KEY_OFFSET = 8


class RecordsPut(NamedTuple):
    """What a ``store_records`` call did, per key: ``stored``, whether the store holds a
    page of it now (``put_records``' answer), and ``written``, whether that page is the
    record this call gave (False for a key held before, whose first page is kept, and
    for a failure)."""

    stored: list[bool]
    written: list[bool]


class TrustedRecord(NamedTuple):
    """A record taken apart: its payload (a view, no copy) and its header's checksum."""

    payload: memoryview
    checksum: int


def trusted_records(
    keys: Sequence[bytes], records: Sequence[memoryview | bytes]
) -> list[TrustedRecord]:
    """The batch's records taken apart, after checking the keys and each record's shape
    (never its checksum: reads check it). ValueError, naming the first bad record,
    for a batch of mismatched lengths, a key not of 32 bytes, or a record that is not a
    whole record (shorter than a header, wrong magic or version, a header length that
    disagrees with the bytes); raised before anything is stored. Mutates nothing."""
    if len(keys) != len(records):
        raise ValueError(f"got {len(keys)} keys but {len(records)} records")
    check_keys(keys)
    out: list[TrustedRecord] = []
    for i, record in enumerate(records):
        view = byte_view(memoryview(record), writable=False)
        header = parse_header(view)
        if (
            header is None
            or header.magic != MAGIC
            or header.version != FORMAT_VERSION
            or header.payload_len != len(view) - HEADER_BYTES
        ):
            raise ValueError(f"record {i} is not a whole page record ({len(view)} bytes)")
        out.append(TrustedRecord(view[HEADER_BYTES:], header.checksum))
    return out


def check_record_buffers(keys: Sequence[bytes], dst: Sequence[memoryview]) -> list[memoryview]:
    """``get_records``' arguments checked: flat writable byte views, each at least a
    header long (ValueError otherwise, before any read)."""
    if len(keys) != len(dst):
        raise ValueError(f"got {len(keys)} keys but {len(dst)} buffers")
    check_keys(keys)
    views = [byte_view(buf, writable=True) for buf in dst]
    for i, view in enumerate(views):
        if len(view) < HEADER_BYTES:
            raise ValueError(f"record buffer {i} is shorter than a header ({len(view)} bytes)")
    return views


def rekey(record: memoryview, key: bytes) -> None:
    """Rewrite the key field of ``record`` (a writable byte view of a whole record) in
    place; its checksum stays valid, as it covers the payload only."""
    if len(key) != KEY_BYTES:
        raise ValueError(f"page keys must be {KEY_BYTES} bytes, got {len(key)}")
    record[KEY_OFFSET : KEY_OFFSET + KEY_BYTES] = key
