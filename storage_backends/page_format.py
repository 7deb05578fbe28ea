"""The header every stored page carries, and the checks applied on every read.

Layout (little-endian): magic ``HKVP`` (4 bytes), format version (u16),
reserved (u16), page key (32 bytes), payload length (u64), xxh3_64 of the
payload (u64), then the payload. A page whose header or checksum does not
match is damaged: the backend deletes it and reports a miss.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from typing import NamedTuple

import xxhash

MAGIC = b"HKVP"
FORMAT_VERSION = 1
KEY_BYTES = 32
_HEADER = struct.Struct("<4sHH32sQQ")
HEADER_BYTES = _HEADER.size
# The header's packing, for hot loops that build the header a record must carry
# (magic, version, 0, key, payload length, checksum) and compare it in one step.
HEADER_STRUCT = _HEADER


class Verdict(enum.Enum):
    """Outcome of checking a stored page against what the reader expects."""

    OK = "ok"
    SIZE_MISMATCH = "size_mismatch"  # intact page, but not the length the reader asked for
    TRUNCATED = "truncated"
    BAD_MAGIC = "bad_magic"
    BAD_VERSION = "bad_version"
    WRONG_KEY = "wrong_key"
    BAD_LENGTH = "bad_length"  # header length disagrees with the stored bytes (torn write)
    BAD_CHECKSUM = "bad_checksum"

    @property
    def corrupt(self) -> bool:
        """Whether the stored page is damaged and must be deleted."""
        return self not in (Verdict.OK, Verdict.SIZE_MISMATCH)


class PageHeader(NamedTuple):
    magic: bytes
    version: int
    key: bytes
    payload_len: int
    checksum: int


def header_for(key: bytes, payload_len: int, checksum: int) -> bytes:
    """The header of a payload of ``payload_len`` bytes whose xxh3 is ``checksum``, under
    ``key`` (no hashing: for a checksum already known)."""
    return _HEADER.pack(MAGIC, FORMAT_VERSION, 0, key, payload_len, checksum)


def build_header(key: bytes, payload: memoryview | bytes) -> bytes:
    """Header bytes for ``payload`` stored under ``key``."""
    return header_for(key, len(payload), xxhash.xxh3_64_intdigest(payload))


def runs_checksum(runs: Sequence[memoryview]) -> int:
    """xxh3_64 of the payload that is ``runs`` (flat byte views) back to back, without
    concatenating them."""
    if len(runs) == 1:
        return xxhash.xxh3_64_intdigest(runs[0])
    hasher = xxhash.xxh3_64()
    for run in runs:
        hasher.update(run)
    return hasher.intdigest()


def build_runs_header(key: bytes, runs: Sequence[memoryview]) -> bytes:
    """Header bytes for the payload that is ``runs`` concatenated in order: one
    streaming xxh3 over the runs."""
    return header_for(key, sum(len(run) for run in runs), runs_checksum(runs))


def encode_page(key: bytes, payload: memoryview | bytes) -> bytes:
    """Header and payload as one ``bytes`` value (one copy of the payload)."""
    return b"".join((build_header(key, payload), payload))


def parse_header(header: memoryview | bytes) -> PageHeader | None:
    """Unpack the first ``HEADER_BYTES``; None if there are fewer."""
    if len(header) < HEADER_BYTES:
        return None
    magic, version, _reserved, key, payload_len, checksum = _HEADER.unpack_from(header)
    return PageHeader(magic, version, key, payload_len, checksum)


def check_header(
    header: memoryview | bytes, key: bytes, stored_payload_len: int, expected_len: int | None
) -> Verdict:
    """Check a header without reading the payload.

    ``stored_payload_len`` is how many payload bytes follow the header in the
    store; ``expected_len`` the length the reader wants (None: any).
    """
    parsed = parse_header(header)
    if parsed is None or stored_payload_len < 0:
        return Verdict.TRUNCATED
    if parsed.magic != MAGIC:
        return Verdict.BAD_MAGIC
    if parsed.version != FORMAT_VERSION:
        return Verdict.BAD_VERSION
    if parsed.key != key:
        return Verdict.WRONG_KEY
    if parsed.payload_len != stored_payload_len:
        return Verdict.BAD_LENGTH
    if expected_len is not None and parsed.payload_len != expected_len:
        return Verdict.SIZE_MISMATCH
    return Verdict.OK


def validate(blob: memoryview, key: bytes, expected_len: int | None) -> Verdict:
    """Check header and checksum of a stored header+payload ``blob``."""
    verdict = check_header(blob, key, len(blob) - HEADER_BYTES, expected_len)
    if verdict is not Verdict.OK:
        return verdict
    checksum = _HEADER.unpack_from(blob)[5]
    if xxhash.xxh3_64_intdigest(blob[HEADER_BYTES:]) != checksum:
        return Verdict.BAD_CHECKSUM
    return Verdict.OK


def copy_verified(blob: memoryview, key: bytes, dst: memoryview) -> Verdict:
    """Validate ``blob`` and, only if it is intact and of ``len(dst)``, copy its payload to dst.

    ``dst`` must be a writable 1-D byte view; it is left untouched unless the
    verdict is OK.
    """
    verdict = validate(blob, key, len(dst))
    if verdict is Verdict.OK:
        dst[:] = blob[HEADER_BYTES:]
    return verdict
