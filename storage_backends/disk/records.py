"""Checking a record read in place: the header read beside the payload runs, the
xxh3 over the runs (so the payload is never copied to be checked)."""

from __future__ import annotations

from collections.abc import Sequence

import xxhash

from storage_backends.page_format import (
    FORMAT_VERSION,
    HEADER_BYTES,
    MAGIC,
    Verdict,
    parse_header,
)


def check_read(header: bytearray, key: bytes, got: int, runs: Sequence[memoryview]) -> Verdict:
    """Verdict on a record of which ``got`` bytes (header + runs) were read."""
    parsed = parse_header(memoryview(header))
    if parsed is None or got < HEADER_BYTES:
        return Verdict.TRUNCATED
    if parsed.magic != MAGIC:
        return Verdict.BAD_MAGIC
    if parsed.version != FORMAT_VERSION:
        return Verdict.BAD_VERSION
    if parsed.key != key:
        return Verdict.WRONG_KEY
    if parsed.payload_len != got - HEADER_BYTES or parsed.payload_len != sum(map(len, runs)):
        return Verdict.BAD_LENGTH
    if len(runs) == 1:
        digest = xxhash.xxh3_64_intdigest(runs[0])
    else:
        hasher = xxhash.xxh3_64()
        for run in runs:
            hasher.update(run)
        digest = hasher.intdigest()
    return Verdict.OK if digest == parsed.checksum else Verdict.BAD_CHECKSUM
