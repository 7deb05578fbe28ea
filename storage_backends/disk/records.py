"""Checking a record read in place: the header read beside the payload runs, the
xxh3 over the runs (so the payload is never copied to be checked)."""

from __future__ import annotations

from collections.abc import Sequence

import xxhash

from storage_backends.page_format import HEADER_BYTES, Verdict, check_header, parse_header


def check_read(header: bytearray, key: bytes, got: int, runs: Sequence[memoryview]) -> Verdict:
    """Verdict on a record of which ``got`` bytes (header + runs) were read."""
    view = memoryview(header)
    verdict = check_header(view, key, got - HEADER_BYTES, None)
    if verdict is Verdict.OK and got - HEADER_BYTES != sum(map(len, runs)):
        verdict = Verdict.BAD_LENGTH  # a short read whose header agrees with it
    parsed = parse_header(view)
    if verdict is not Verdict.OK or parsed is None:
        return verdict
    if len(runs) == 1:
        digest = xxhash.xxh3_64_intdigest(runs[0])
    else:
        hasher = xxhash.xxh3_64()
        for run in runs:
            hasher.update(run)
        digest = hasher.intdigest()
    return Verdict.OK if digest == parsed.checksum else Verdict.BAD_CHECKSUM
