"""The transfer-engine contract: ops, completions and the engine interface."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch

TransferKind = Literal["d2h", "h2d"]
KINDS: tuple[str, ...] = ("d2h", "h2d")


class TransferError(RuntimeError):
    """Misuse of an engine (closed, unknown op, op not started) or a failed layer load."""


@dataclass(frozen=True, eq=False)
class TransferOp:
    """Copy the KV of ``device_slots[i]`` to/from ``host_slots[i]`` in every layer.

    ``d2h`` backs device KV up to host memory; ``h2d`` loads it back. Both slot
    tensors are 1-D int64 CPU tensors of the same length; the caller keeps both
    ranges allocated (and unwritten by anyone else) until the op completes.
    """

    kind: TransferKind
    device_slots: torch.Tensor
    host_slots: torch.Tensor

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        for name in ("device_slots", "host_slots"):
            t: torch.Tensor = getattr(self, name)
            if t.dtype != torch.int64 or t.dim() != 1:
                raise ValueError(f"{name} must be a 1-D int64 tensor, got {t.dtype} {t.dim()}-D")
        if self.device_slots.numel() != self.host_slots.numel():
            raise ValueError(
                f"device_slots ({self.device_slots.numel()}) and host_slots "
                f"({self.host_slots.numel()}) differ in length"
            )

    @property
    def num_tokens(self) -> int:
        return self.device_slots.numel()


class Completion(NamedTuple):
    """The outcome of one op; ``nbytes`` counts the bytes actually copied,
    ``seconds`` the time from the op's first copy starting to its last
    ending (0.0 where the engine does not time its copies)."""

    op_id: int
    kind: str
    ok: bool
    error: str | None
    nbytes: int
    seconds: float = 0.0


class TransferEngine(ABC):
    """Moves KV between one device pool and one host pool, asynchronously.

    Threading: one owner thread (the scheduler) calls every public method.
    Worker threads (or CUDA streams) only move bytes and push completion
    records onto an internal queue; the owner receives them through ``poll``
    or ``wait``. The engine never touches allocators: the owner keeps an op's
    slots allocated until its completion has been received.

    Ops: ``d2h`` ops start at ``submit``; ``h2d`` ops wait in a queue until
    ``start_loading`` launches them as one batch, layer by layer, so that the
    forward pass can start attention of layer ``i`` as soon as ``wait_layer(i)``
    returns. Every op yields exactly one ``Completion``, exactly once, whether
    it succeeded, failed, or was cancelled by ``close``. A failed copy is a
    completion with ``ok=False``, never an exception in a worker.
    """

    @abstractmethod
    def submit(self, op: TransferOp) -> int:
        """Register ``op`` and return its id (d2h starts now, h2d is queued).

        Mutates the engine's op table. Raises TransferError when closed and
        ValueError when slots are out of range for the pools.
        """

    @abstractmethod
    def start_loading(self) -> None:
        """Launch every queued h2d op as one batch and reset the layer counter.

        With nothing queued, the counter is cleared (no batch is loading).
        Raises TransferError when closed.
        """

    @abstractmethod
    def wait_layer(self, layer: int, timeout: float | None = None) -> None:
        """Return once layer ``layer`` of the current batch is in device memory.

        On CUDA the current stream is made to wait instead of the host. Returns
        at once when no batch was started. Raises TransferError when a copy of
        that layer failed or ``timeout`` seconds passed; IndexError for a bad
        layer. The batch stays current until the next ``start_loading``.
        """

    @abstractmethod
    def poll(self) -> list[Completion]:
        """Completions that arrived since the last call, in arrival order; never blocks."""

    @abstractmethod
    def wait(self, op_id: int, timeout: float | None = None) -> Completion:
        """Block until ``op_id`` completes and return its completion.

        That completion is then never returned by ``poll``. Raises
        TransferError for an unknown or already delivered op, for an h2d op
        still queued (call ``start_loading`` first: waiting on it would
        deadlock), or when ``timeout`` seconds pass.
        """

    @abstractmethod
    def pending(self) -> int:
        """Ops submitted whose completion has not been delivered yet (queued ones included)."""

    @abstractmethod
    def close(self) -> None:
        """Finish in-flight copies, cancel queued h2d ops, join workers; idempotent.

        Cancelled ops complete with ``ok=False``. Remaining completions stay
        available to ``poll``/``wait``; ``submit`` then raises TransferError.
        """
