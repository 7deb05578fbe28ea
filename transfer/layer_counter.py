"""Per-layer progress of the current h2d batch, shared by loaders and the owner."""

from __future__ import annotations

import threading

from transfer.base import TransferError


class LayerCounter:
    """Counts, per layer, the ops of the current batch whose copy is done.

    ``begin``/``clear``/``wait`` belong to the owner thread; ``finish`` is
    called by workers and is thread-safe. Reports from an older batch are
    ignored. ``wait`` raises TransferError on a failed layer or a timeout and
    IndexError for a layer that does not exist.
    """

    def __init__(self, num_layers: int) -> None:
        self._num_layers = num_layers
        self._cond = threading.Condition()
        self._batch = 0
        self._remaining: list[int] = []
        self._errors: list[str | None] = []

    def begin(self, num_ops: int) -> int:
        """Start a batch of ``num_ops`` ops; returns its id for ``finish``."""
        with self._cond:
            self._batch += 1
            self._remaining = [num_ops] * self._num_layers
            self._errors = [None] * self._num_layers
            return self._batch

    def clear(self) -> None:
        """No batch is loading any more: ``wait`` returns at once."""
        with self._cond:
            self._batch += 1
            self._remaining = []
            self._errors = []

    def finish(self, batch: int, layer: int, error: str | None) -> None:
        """One op of ``batch`` finished ``layer`` (with ``error`` if it failed)."""
        with self._cond:
            if batch != self._batch:
                return
            self._remaining[layer] -= 1
            if error is not None and self._errors[layer] is None:
                self._errors[layer] = error
            if self._remaining[layer] == 0:
                self._cond.notify_all()

    def wait(self, layer: int, timeout: float | None) -> bool:
        """Block until ``layer`` is done; False when no batch is current."""
        if not 0 <= layer < self._num_layers:
            raise IndexError(f"layer {layer} out of range [0, {self._num_layers})")
        with self._cond:
            if not self._remaining:
                return False
            if not self._cond.wait_for(lambda: self._remaining[layer] == 0, timeout):
                raise TransferError(f"timed out waiting for layer {layer} to load")
            error = self._errors[layer]
        if error is not None:
            raise TransferError(f"loading layer {layer} failed: {error}")
        return True
