"""Owner-side bookkeeping shared by every engine: ids, the h2d queue, delivery."""

from __future__ import annotations

from abc import abstractmethod
from types import TracebackType
from typing import NamedTuple

from device_pool.kv_pool import DeviceKVPool
from host_pool.kv_pool import HostKVPool
from transfer.base import Completion, TransferEngine, TransferError, TransferKind, TransferOp
from transfer.faults import FaultInjection
from transfer.layer_counter import LayerCounter
from transfer.mailbox import CompletionMailbox
from transfer.plan import CopyPlan, make_plan


class PlannedOp(NamedTuple):
    op_id: int
    kind: TransferKind
    plan: CopyPlan


class QueuedEngine(TransferEngine):
    """A TransferEngine minus the byte moving, which subclasses supply.

    Subclasses implement ``_start_d2h`` (called from ``submit``),
    ``_start_batch`` (from ``start_loading``) and ``_shutdown`` (from the first
    ``close``). Those hooks run on the owner thread and must not raise for a
    failed copy: they report it as a Completion through ``self._mailbox`` and,
    for batches, through ``self._counter.finish``.
    """

    def __init__(
        self,
        device_pool: DeviceKVPool,
        host_pool: HostKVPool,
        faults: FaultInjection | None = None,
    ) -> None:
        if device_pool.shape != host_pool.shape:
            raise ValueError(
                f"device and host pools hold different KV: {device_pool.shape} vs {host_pool.shape}"
            )
        self._device_pool = device_pool
        self._host_pool = host_pool
        self._mailbox = CompletionMailbox(faults)
        self._counter = LayerCounter(device_pool.shape.num_layers)
        self._next_id = 1
        self._undelivered: set[int] = set()
        self._queued: list[PlannedOp] = []
        self._closed = False

    @abstractmethod
    def _start_d2h(self, op: PlannedOp) -> None: ...

    @abstractmethod
    def _start_batch(self, batch: int, ops: list[PlannedOp]) -> None: ...

    @abstractmethod
    def _shutdown(self) -> None: ...

    def submit(self, op: TransferOp) -> int:
        self._check_open()
        plan = make_plan(
            op,
            self._device_pool.size,
            self._device_pool.page_size,
            self._host_pool.size,
            self._host_pool.page_size,
        )
        planned = PlannedOp(self._next_id, op.kind, plan)
        self._next_id += 1
        self._undelivered.add(planned.op_id)
        if op.kind == "h2d":
            self._queued.append(planned)
        else:
            self._start_d2h(planned)
        return planned.op_id

    def start_loading(self) -> None:
        self._check_open()
        ops, self._queued = self._queued, []
        if not ops:
            self._counter.clear()
            return
        self._start_batch(self._counter.begin(len(ops)), ops)

    def wait_layer(self, layer: int, timeout: float | None = None) -> None:
        self._counter.wait(layer, timeout)

    def poll(self) -> list[Completion]:
        out = self._mailbox.poll()
        self._undelivered.difference_update(c.op_id for c in out)
        return out

    def wait(self, op_id: int, timeout: float | None = None) -> Completion:
        if op_id not in self._undelivered:
            raise TransferError(f"op {op_id} is unknown or its completion was already delivered")
        if any(q.op_id == op_id for q in self._queued):
            raise TransferError(f"h2d op {op_id} is still queued; call start_loading() first")
        completion = self._mailbox.take(op_id, timeout)
        self._undelivered.discard(op_id)
        return completion

    def pending(self) -> int:
        return len(self._undelivered)

    def release(self, n: int | None = None, timeout: float | None = None) -> int:
        """Test hook: let up to ``n`` held completions (all if None) reach ``poll``.

        Needs FaultInjection(hold=True), else TransferError. With a ``timeout``
        it first waits up to that long for ``n`` copies to finish, which makes
        a test deterministic; returns how many were released.
        """
        return self._mailbox.release(n, timeout)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for q in self._queued:
            self._mailbox.put(Completion(q.op_id, q.kind, False, "engine closed before loading", 0))
        self._queued = []
        self._shutdown()

    def __enter__(self) -> QueuedEngine:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise TransferError("transfer engine is closed")
