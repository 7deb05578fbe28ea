"""A persistent staging area: one host buffer cut into slots reused in turn.

The CUDA engine moves KV between the device and scattered host pages through
pinned staging. Allocating pinned memory per copy costs a ``cudaHostAlloc``
rounded up to a power of two by torch's caching host allocator; instead each
lane owns one registered buffer for the engine's lifetime and cycles through
its slots. A slot is handed out again only after the copy that last used it
has finished (its event) and its host-side step (a scatter) has run.

The ring knows nothing about CUDA: an event is anything with
``synchronize()``, so the logic runs on CPU in tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

import torch

SLOT_ALIGN = 64


class Waitable(Protocol):
    def synchronize(self) -> None: ...


class _Pending(NamedTuple):
    event: Waitable
    after: Callable[[], None] | None


class StagingRing:
    """``num_slots`` slots over ``buffer`` (a flat uint8 tensor), 64-byte aligned.

    Not thread-safe: one lane uses a ring. ``acquire`` blocks on the slot's
    previous event and runs its host step, whose exceptions propagate (the
    lane finishes or fails one op at a time, so they belong to the current
    op). Raises ValueError for a buffer too small for ``num_slots`` 64-byte slots.
    """

    def __init__(self, buffer: torch.Tensor, num_slots: int) -> None:
        if buffer.dtype != torch.uint8 or buffer.dim() != 1:
            raise ValueError("staging buffer must be a flat uint8 tensor")
        # Slots start on 64-byte boundaries, so any dtype can view them.
        self.slot_bytes = buffer.numel() // max(num_slots, 1) // SLOT_ALIGN * SLOT_ALIGN
        if num_slots < 1 or self.slot_bytes < SLOT_ALIGN:
            raise ValueError(f"cannot cut {buffer.numel()} bytes into {num_slots} slots")
        self._slots = [
            buffer[i * self.slot_bytes : (i + 1) * self.slot_bytes] for i in range(num_slots)
        ]
        self._pending: list[_Pending | None] = [None] * num_slots
        self._next = 0

    def acquire(self, nbytes: int) -> tuple[int, torch.Tensor]:
        """The next slot (index, its first ``nbytes`` bytes), free for writing.

        ValueError when ``nbytes`` exceeds a slot.
        """
        if nbytes > self.slot_bytes:
            raise ValueError(f"{nbytes} bytes do not fit a {self.slot_bytes}-byte staging slot")
        index = self._next
        self._next = (index + 1) % len(self._slots)
        self._settle(index)
        return index, self._slots[index][:nbytes]

    def commit(self, index: int, event: Waitable, after: Callable[[], None] | None) -> None:
        """Slot ``index`` is in use until ``event``; then ``after`` runs (in a later call)."""
        self._pending[index] = _Pending(event, after)

    def flush(self) -> None:
        """Wait for every slot in use and run the host steps, oldest first."""
        for k in range(len(self._slots)):
            self._settle((self._next + k) % len(self._slots))

    def discard(self) -> None:
        """Wait for every slot in use, dropping host steps (their op failed)."""
        for k, pending in enumerate(self._pending):
            if pending is not None:
                self._pending[k] = None
                pending.event.synchronize()

    def _settle(self, index: int) -> None:
        pending = self._pending[index]
        if pending is None:
            return
        self._pending[index] = None
        pending.event.synchronize()
        if pending.after is not None:
            pending.after()


def block_ranges(num_blocks: int, row_bytes: int, slot_bytes: int) -> list[range]:
    """Consecutive block ranges whose rows (``row_bytes`` each) fit one slot.

    ValueError when a single row does not fit.
    """
    if row_bytes > slot_bytes:
        raise ValueError(f"a {row_bytes}-byte block row does not fit a {slot_bytes}-byte slot")
    step = max(slot_bytes // max(row_bytes, 1), 1)
    return [range(lo, min(lo + step, num_blocks)) for lo in range(0, num_blocks, step)]
