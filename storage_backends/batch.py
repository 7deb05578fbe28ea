"""Argument checks shared by the backends' batch methods."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import attrgetter

from storage_backends.page_format import KEY_BYTES


def check_keys(keys: Sequence[bytes]) -> None:
    """ValueError unless every key is ``bytes`` of ``KEY_BYTES``."""
    for key in keys:
        if not isinstance(key, bytes) or len(key) != KEY_BYTES:
            raise ValueError(f"page keys must be {KEY_BYTES}-byte bytes, got {key!r:.80}")


def byte_view(buf: memoryview, writable: bool) -> memoryview:
    """A flat unsigned-byte view of ``buf`` (ValueError if read-only but must be writable)."""
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    if writable and view.readonly:
        raise ValueError("get() destination buffers must be writable")
    if not view.c_contiguous:
        # A strided buffer cannot be filled or hashed by one pass; callers pass whole pages.
        raise ValueError("page buffers must be C-contiguous")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


_SHAPE = attrgetter("format", "ndim", "readonly", "c_contiguous")
_WRITABLE = {("B", 1, False, True)}  # the shape of a writable flat byte view
_FLAT = {("B", 1, False, True), ("B", 1, True, True)}


def check_batch(
    keys: Sequence[bytes], bufs: Sequence[memoryview], writable: bool
) -> list[memoryview]:
    """Validate a (keys, buffers) batch and return flat byte views of the buffers."""
    if len(keys) != len(bufs):
        raise ValueError(f"got {len(keys)} keys but {len(bufs)} buffers")
    check_keys(keys)
    # The common batch, flat byte views already, is checked without a Python step per
    # buffer (a quarter of a 64 KiB page's read cost, otherwise).
    if set(map(type, bufs)) == {memoryview}:
        shapes = set(map(_SHAPE, bufs))
        if shapes == _WRITABLE or (not writable and shapes <= _FLAT):
            return list(bufs)
    return [byte_view(buf, writable) for buf in bufs]


def count_leading(present: Iterable[bool]) -> int:
    """How many leading entries are True (``exists()`` of the network backends)."""
    count = 0
    for flag in present:
        if not flag:
            break
        count += 1
    return count
