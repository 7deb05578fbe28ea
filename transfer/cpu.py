"""Transfer engine for a CPU "device" pool: worker threads copy blocks of rows."""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from typing import NamedTuple

from device_pool.kv_pool import DeviceKVPool
from host_pool.kv_pool import HostKVPool
from transfer.base import Completion
from transfer.faults import FaultInjection, InjectedFault
from transfer.queued import PlannedOp, QueuedEngine
from transfer.rows import copy_rows, device_rows, host_rows

logger = logging.getLogger(__name__)

# Task priorities: loads first (the forward pass waits on them), then backups;
# the stop sentinel sorts last so close() lets queued copies finish.
_LOAD, _BACKUP, _STOP = 0, 1, 2


class _OpRun:
    """One op in flight: layers left, bytes moved, first error. Guarded by ``lock``."""

    def __init__(self, op: PlannedOp, layers: int, delay: float, fail: bool) -> None:
        self.op = op
        self.delay = delay
        self.fail = fail
        self._lock = threading.Lock()
        self._remaining = layers
        self._moved = 0
        self._error: str | None = None
        self._began: float | None = None

    def began(self) -> None:
        """A layer's copy starts (the op's time runs from the first)."""
        with self._lock:
            if self._began is None:
                self._began = time.perf_counter()

    def layer_done(self, nbytes: int, error: str | None) -> Completion | None:
        """Record one layer; returns the op's completion once every layer reported."""
        with self._lock:
            self._remaining -= 1
            self._moved += nbytes
            if error is not None and self._error is None:
                self._error = error
            if self._remaining:
                return None
            seconds = time.perf_counter() - (self._began or time.perf_counter())
            ok = self._error is None
            return Completion(self.op.op_id, self.op.kind, ok, self._error, self._moved, seconds)


class _Task(NamedTuple):
    run: _OpRun
    layer: int
    batch: int  # 0 for backups, which feed no layer counter


class CpuTransferEngine(QueuedEngine):
    """Copies between a CPU device pool and a host pool on ``num_workers`` threads.

    Each op is split into one task per layer, so several workers share one
    big op and an h2d batch progresses layer by layer (layer 0 of every op,
    then layer 1, ...). Workers only copy bytes and report; numpy's row copies
    release the GIL, so workers run in parallel. ``faults`` injects delays,
    failures and late/out-of-order delivery for tests. Raises ValueError when
    the device pool is not on the CPU or the pools hold different KV.
    """

    def __init__(
        self,
        device_pool: DeviceKVPool,
        host_pool: HostKVPool,
        num_workers: int = 1,
        faults: FaultInjection | None = None,
    ) -> None:
        if device_pool.device.type != "cpu":
            raise ValueError(f"CpuTransferEngine needs a CPU device pool, got {device_pool.device}")
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        super().__init__(device_pool, host_pool, faults)
        self._faults = faults
        self._tasks: queue.PriorityQueue[tuple[int, int, _Task | None]] = queue.PriorityQueue()
        self._seq = itertools.count()
        self._stop = threading.Event()
        self._workers = [
            threading.Thread(target=self._work, name=f"hicache-transfer-{i}", daemon=True)
            for i in range(num_workers)
        ]
        for w in self._workers:
            w.start()

    def _new_run(self, op: PlannedOp) -> _OpRun:
        f = self._faults
        delay = f.delay_for(op.op_id) if f is not None else 0.0
        fail = f is not None and f.fails(op.op_id)
        return _OpRun(op, self._device_pool.shape.num_layers, delay, fail)

    def _start_d2h(self, op: PlannedOp) -> None:
        run = self._new_run(op)
        for layer in range(self._device_pool.shape.num_layers):
            self._tasks.put((_BACKUP, next(self._seq), _Task(run, layer, 0)))

    def _start_batch(self, batch: int, ops: list[PlannedOp]) -> None:
        runs = [self._new_run(op) for op in ops]
        for layer in range(self._device_pool.shape.num_layers):
            for run in runs:
                self._tasks.put((_LOAD, next(self._seq), _Task(run, layer, batch)))

    def _shutdown(self) -> None:
        for _ in self._workers:
            self._tasks.put((_STOP, next(self._seq), None))
        self._stop.set()  # cuts injected delays short
        for w in self._workers:
            w.join()

    def _work(self) -> None:
        while True:
            task = self._tasks.get()[2]
            if task is None:
                return
            try:
                self._run(task)
            except Exception:  # a bookkeeping bug: keep serving the other ops
                logger.exception("transfer worker failed on op %d", task.run.op.op_id)

    def _run(self, task: _Task) -> None:
        error: str | None = None
        nbytes = 0
        try:
            nbytes = self._copy_layer(task.run, task.layer)
        except Exception as exc:  # any failure becomes the op's completion
            error = f"{type(exc).__name__}: {exc}"
        if task.batch:
            self._counter.finish(task.batch, task.layer, error)
        done = task.run.layer_done(nbytes, error)
        if done is not None:
            if not done.ok:
                logger.warning("transfer op %d (%s) failed: %s", done.op_id, done.kind, done.error)
            self._mailbox.put(done)

    def _copy_layer(self, run: _OpRun, layer: int) -> int:
        run.began()
        if run.delay:
            self._stop.wait(run.delay)
        if run.fail:
            raise InjectedFault(f"injected failure of op {run.op.op_id}")
        plan = run.op.plan
        pairs = zip(
            self._device_pool.layer_buffers(layer),
            self._host_pool.layer_pages(layer),
            strict=True,
        )
        for dev, host in pairs:
            if run.op.kind == "d2h":
                copy_rows(host_rows(host, plan), device_rows(dev, plan))
            else:
                copy_rows(device_rows(dev, plan), host_rows(host, plan))
        return plan.num_tokens * self._device_pool.shape.bytes_per_token_layer
