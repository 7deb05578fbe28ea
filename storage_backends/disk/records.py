"""Checking a record read in place: the header read beside the payload runs, the
xxh3 over the runs (so the payload is never copied to be checked)."""

from __future__ import annotations

from collections.abc import Sequence

import xxhash

from storage_backends.page_format import HEADER_BYTES, Verdict, check_header, parse_header


def check_read(header: bytearray, key: bytes, got: int, runs: Sequence[memoryview]) -> Verdict:
    """Verdict on a record of which ``got`` bytes (header + runs) were read."""
    wanted = sum(len(run) for run in runs)
    if got < HEADER_BYTES:
        return Verdict.TRUNCATED
    verdict = check_header(memoryview(header), key, got - HEADER_BYTES, None)
    if verdict is not Verdict.OK:
        return verdict
    parsed = parse_header(memoryview(header))
    if parsed is None or parsed.payload_len != wanted:
        return Verdict.BAD_LENGTH
    digest = xxhash.xxh3_64()
    for run in runs:
        digest.update(run)
    return Verdict.OK if digest.intdigest() == parsed.checksum else Verdict.BAD_CHECKSUM
