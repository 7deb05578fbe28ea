"""Checking records read in place: the header read beside the payload runs, the xxh3
over the runs (so the payload is never copied to be checked).

``check_run`` is the hot path: per record it builds the header the record must carry
(the key asked for, the length read, the checksum of the bytes read) and compares a
run's headers with those read in one step, with no Python step per record.
``check_read`` says what is wrong with one record (the verdict), for the rare record
that failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat

import xxhash

from storage_backends.page_format import (
    FORMAT_VERSION,
    HEADER_BYTES,
    HEADER_STRUCT,
    MAGIC,
    Verdict,
    check_header,
    parse_header,
    runs_checksum,
)


def checksums(columns: Sequence[Sequence[memoryview]]) -> list[int]:
    """xxh3_64 of each page whose runs are ``columns[j][k]`` (run j of page k)."""
    if len(columns) == 1:
        return list(map(xxhash.xxh3_64_intdigest, columns[0]))
    return list(map(runs_checksum, zip(*columns, strict=True)))


def check_run(
    headers: bytearray, keys: Sequence[bytes], payload_lens: Sequence[int], sums: Sequence[int]
) -> list[bool]:
    """Whether each record of a run read whole is intact: member k's header is at
    ``k * HEADER_BYTES`` of ``headers`` (which may go on beyond the run's), it was asked
    for as ``keys[k]``, ``payload_lens[k]`` bytes of payload were read for it and they
    hash to ``sums[k]``."""
    fixed = repeat(MAGIC), repeat(FORMAT_VERSION), repeat(0)
    want = list(map(HEADER_STRUCT.pack, *fixed, keys, payload_lens, sums))
    if headers.startswith(b"".join(want)):  # the common case: one comparison for the run
        return [True] * len(want)
    return [headers.startswith(header, k * HEADER_BYTES) for k, header in enumerate(want)]


def check_read(header: bytearray, key: bytes, got: int, runs: Sequence[memoryview]) -> Verdict:
    """Verdict on a record of which ``got`` bytes (header + runs) were read."""
    view = memoryview(header)
    verdict = check_header(view, key, got - HEADER_BYTES, None)
    if verdict is Verdict.OK and got - HEADER_BYTES != sum(map(len, runs)):
        verdict = Verdict.BAD_LENGTH  # a short read whose header agrees with it
    parsed = parse_header(view)
    if verdict is not Verdict.OK or parsed is None:
        return verdict
    return Verdict.OK if runs_checksum(runs) == parsed.checksum else Verdict.BAD_CHECKSUM
