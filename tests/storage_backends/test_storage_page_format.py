"""The page header: building it and every way a stored page can fail its check."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import pytest

from storage_backends.page_format import (
    FORMAT_VERSION,
    HEADER_BYTES,
    Verdict,
    build_header,
    copy_verified,
    encode_page,
    parse_header,
    validate,
)

if TYPE_CHECKING:
    from conftest import Pages


def _flip(blob: bytes, offset: int) -> memoryview:
    data = bytearray(blob)
    data[offset] ^= 0x01
    return memoryview(data)


def test_header_round_trip(pages: Pages) -> None:
    key, data = pages.key(1), pages.payload(1, 300)
    header = parse_header(build_header(key, data))
    assert header is not None
    assert (header.version, header.key, header.payload_len) == (FORMAT_VERSION, key, 300)
    assert validate(memoryview(encode_page(key, data)), key, 300) is Verdict.OK
    assert validate(memoryview(encode_page(key, data)), key, None) is Verdict.OK


@pytest.mark.parametrize(
    ("mutate", "verdict"),
    [
        (lambda blob: _flip(blob, HEADER_BYTES + 7), Verdict.BAD_CHECKSUM),
        (lambda blob: _flip(blob, len(blob) - 1), Verdict.BAD_CHECKSUM),
        (lambda blob: _flip(blob, 0), Verdict.BAD_MAGIC),
        (lambda blob: _flip(blob, 4), Verdict.BAD_VERSION),
        (lambda blob: _flip(blob, 10), Verdict.WRONG_KEY),
        (lambda blob: memoryview(blob[:-1]), Verdict.BAD_LENGTH),
        (lambda blob: memoryview(blob + b"x"), Verdict.BAD_LENGTH),
        (lambda blob: memoryview(blob[: HEADER_BYTES - 1]), Verdict.TRUNCATED),
        (lambda blob: memoryview(b""), Verdict.TRUNCATED),
    ],
)
def test_damage_is_detected(pages: Pages, mutate: object, verdict: Verdict) -> None:
    key = pages.key(2)
    blob = encode_page(key, pages.payload(2, 256))
    damaged = mutate(blob)  # type: ignore[operator]
    assert validate(damaged, key, None) is verdict
    assert verdict.corrupt


def test_wrong_key_is_damage(pages: Pages) -> None:
    blob = memoryview(encode_page(pages.key(3), pages.payload(3, 64)))
    assert validate(blob, pages.key(4), 64) is Verdict.WRONG_KEY


def test_other_length_is_a_miss_not_damage(pages: Pages) -> None:
    key = pages.key(5)
    verdict = validate(memoryview(encode_page(key, pages.payload(5, 64))), key, 65)
    assert verdict is Verdict.SIZE_MISMATCH
    assert not verdict.corrupt


def test_copy_verified_leaves_dst_untouched_on_damage(pages: Pages) -> None:
    key = pages.key(6)
    blob = encode_page(key, pages.payload(6, 64))
    dst = memoryview(bytearray(64))
    assert copy_verified(_flip(blob, HEADER_BYTES), key, dst) is Verdict.BAD_CHECKSUM
    assert bytes(dst) == bytes(64)
    assert copy_verified(memoryview(blob), key, dst) is Verdict.OK
    assert bytes(dst) == pages.payload(6, 64)


def test_header_layout_is_fixed() -> None:
    # The layout is an on-disk format: changing it needs a FORMAT_VERSION bump.
    assert HEADER_BYTES == struct.calcsize("<4sHH32sQQ") == 56
