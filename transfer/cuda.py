"""Transfer engine for a CUDA device pool: two copy streams, events, registered staging.

Backups (d2h) run on a backup stream, loads (h2d) on a load stream, so a
batch's loads never queue behind the previous batch's backups. Each stream is
fed by one lane thread: the backup lane enqueues an op behind an event
recorded on the compute stream at ``submit`` (so it reads KV only after the
forward pass that wrote it), waits for it and posts its completion; the load
lane enqueues a batch layer by layer with one event per layer, and
``wait_layer(i)`` makes the compute stream wait on event ``i`` instead of
blocking the host. A finisher thread waits for each batch's last event and
posts the loads' completions. An op that fails is posted only after
everything already queued for it has run, so its slots are never freed under
a copy still in flight.

``io_backend="direct"`` uses torch only: the device side is gathered (or
scattered) with ``index_select``/``index_copy_`` on the GPU and moved in one
copy per piece through a persistent, registered staging ring per lane (see
``transfer.staging``); the host side is gathered/scattered with numpy row
copies. That beats per-page ``cudaMemcpyAsync`` calls, whose ~5 µs launch cost
each would dominate 32 KiB page blocks. ``"kernel"`` uses one cupy launch per
op (d2h) or per layer (h2d) that reads/writes the device-mapped host pool
directly. Index tensors always cross in pinned memory: a ``non_blocking``
copy from pageable memory would make the lane wait for the copy stream, which
waits for the compute stream.
"""

from __future__ import annotations

import logging
from typing import Literal, NamedTuple

import torch

from device_pool.kv_pool import DeviceKVPool
from host_pool.kv_pool import HostKVPool
from host_pool.memory import PinnedRegistration, allocate_host
from transfer.base import Completion
from transfer.kernels import BlockCopyKernel, indexed_device
from transfer.lane import Lane
from transfer.pieces import (
    gather_from_device,
    gather_from_host,
    scatter_to_device,
    scatter_to_host,
    stage_view,
    sub_plan,
)
from transfer.plan import CopyPlan
from transfer.queued import PlannedOp, QueuedEngine
from transfer.staging import StagingRing, block_ranges

logger = logging.getLogger(__name__)

IoBackend = Literal["direct", "kernel"]
STAGING_BYTES = 32 << 20  # per lane
STAGING_SLOTS = 4


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class _Backup(NamedTuple):
    op: PlannedOp
    ready: torch.cuda.Event  # compute-stream work before submit()


class _Inflight(NamedTuple):
    """A load whose copies are enqueued: wait for ``done``, then post."""

    op: PlannedOp
    done: torch.cuda.Event | None  # None: no event could be recorded
    error: str | None


class _Batch(NamedTuple):
    batch: int
    ops: list[PlannedOp]
    ready: torch.cuda.Event  # compute-stream work before start_loading()
    events: list[torch.cuda.Event | None]  # per layer, filled by the load lane


class _LoadJob:
    """One h2d op of a batch while the load lane enqueues it; load lane only."""

    def __init__(self, op: PlannedOp) -> None:
        self.op = op
        self.error: str | None = None
        self.dev_blocks = torch.empty(0, dtype=torch.int64)
        self.host_offsets = torch.empty(0, dtype=torch.int64)


class _Staging:
    """A lane's registered host buffer and the ring over it; ``close`` unregisters."""

    def __init__(self, nbytes: int) -> None:
        self.buffer = allocate_host((nbytes,), torch.uint8, page_aligned=True)
        self.ring = StagingRing(self.buffer, STAGING_SLOTS)  # checks the size first
        self._registration = PinnedRegistration(self.buffer, pin=True)

    def close(self) -> None:
        self._registration.release()


class CudaTransferEngine(QueuedEngine):
    """Copies between a CUDA device pool and a (pinned) host pool on two copy streams.

    Raises ValueError when the device pool is not on CUDA, the pools hold
    different KV, ``io_backend`` is unknown or a page block does not fit a
    staging slot; RuntimeError for ``io_backend="kernel"`` without cupy.
    Threading as in TransferEngine: the owner records events and queues work
    for the lanes; only lanes enqueue copies and launch kernels. The direct
    backend stages through registered memory of its own, so an unpinned host
    pool still works; the kernel backend registers an unpinned pool.
    """

    def __init__(
        self,
        device_pool: DeviceKVPool,
        host_pool: HostKVPool,
        io_backend: IoBackend = "direct",
        staging_bytes: int = STAGING_BYTES,
    ) -> None:
        if device_pool.device.type != "cuda":
            raise ValueError(
                f"CudaTransferEngine needs a CUDA device pool, got {device_pool.device}"
            )
        if io_backend not in ("direct", "kernel"):
            raise ValueError(f"io_backend must be 'direct' or 'kernel', got {io_backend!r}")
        super().__init__(device_pool, host_pool)
        self._device = indexed_device(device_pool.device)
        self._kv = device_pool.shape.kv_per_layer
        self._layers = device_pool.shape.num_layers
        self._token_bytes = device_pool.layer_buffers(0)[0][0].numel() * self._elem_size
        self._load_stream = torch.cuda.Stream(device=self._device)
        self._backup_stream = torch.cuda.Stream(device=self._device)
        self._kernel: BlockCopyKernel | None = None
        self._staging: tuple[_Staging, _Staging] | None = None
        if io_backend == "kernel":
            self._kernel = BlockCopyKernel(device_pool, host_pool)
        else:
            self._staging = (_Staging(staging_bytes), _Staging(staging_bytes))
            self._check_staging(self._staging[0].ring.slot_bytes, host_pool.page_size)
        self._layer_events: list[torch.cuda.Event | None] = []
        self._finisher: Lane[_Inflight] = Lane("hicache-cuda-finish", self._finish)
        self._loader: Lane[_Batch] = Lane("hicache-cuda-load", self._load)
        self._backuper: Lane[_Backup] = Lane("hicache-cuda-backup", self._backup)

    @property
    def load_stream(self) -> torch.cuda.Stream:
        """The stream loads are copied on (read it; queue nothing but test stalls)."""
        return self._load_stream

    @property
    def backup_stream(self) -> torch.cuda.Stream:
        """The stream backups are copied on (read it; queue nothing but test stalls)."""
        return self._backup_stream

    @property
    def _elem_size(self) -> int:
        return self._device_pool.shape.element_size

    @property
    def _dtype(self) -> torch.dtype:
        return self._device_pool.shape.dtype

    def _check_staging(self, slot_bytes: int, host_page: int) -> None:
        """ValueError (after unregistering the staging) unless a page block fits a slot."""
        row = self._kv * host_page * self._token_bytes
        if row > slot_bytes:
            for staging in self._staging or ():
                staging.close()
            raise ValueError(
                f"staging slots of {slot_bytes} bytes cannot hold one page block of "
                f"{row} bytes: raise staging_bytes"
            )

    # ---- owner thread -------------------------------------------------------

    def wait_layer(self, layer: int, timeout: float | None = None) -> None:
        if not self._counter.wait(layer, timeout):
            return
        event = self._layer_events[layer]
        if event is not None:  # the GPU waits, not the host
            torch.cuda.current_stream(self._device).wait_event(event)

    def _start_d2h(self, op: PlannedOp) -> None:
        try:
            ready = torch.cuda.current_stream(self._device).record_event()
        except Exception as exc:  # nothing was queued: fail at once
            self._post(op, _describe(exc))
            return
        self._backuper.put(_Backup(op, ready))

    def _start_batch(self, batch: int, ops: list[PlannedOp]) -> None:
        # A fresh list: a loader still filling the previous batch's list is harmless.
        self._layer_events = [None] * self._layers
        ready = torch.cuda.current_stream(self._device).record_event()
        self._loader.put(_Batch(batch, ops, ready, self._layer_events))

    def _shutdown(self) -> None:
        self._loader.stop()
        self._backuper.stop()
        self._finisher.stop()
        if self._kernel is not None:
            self._kernel.close()
        for staging in self._staging or ():
            staging.close()

    def _post(self, op: PlannedOp, error: str | None) -> None:
        nbytes = 0
        if error is None:
            nbytes = op.plan.num_tokens * self._device_pool.shape.bytes_per_token
        else:
            logger.warning("transfer op %d (%s) failed: %s", op.op_id, op.kind, error)
        self._mailbox.put(Completion(op.op_id, op.kind, error is None, error, nbytes))

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        """An index tensor on the device, through pinned memory (never blocks the lane)."""
        return t.pin_memory().to(self._device, non_blocking=True)

    # ---- backup lane --------------------------------------------------------

    def _backup(self, item: _Backup) -> None:
        ring = self._staging[0].ring if self._staging is not None else None
        error: str | None = None
        try:
            with torch.cuda.device(self._device), torch.cuda.stream(self._backup_stream):
                self._backup_stream.wait_event(item.ready)
                self._enqueue_backup(item.op.plan, ring)
                self._backup_stream.record_event().synchronize()
            if ring is not None:
                ring.flush()  # the scatters into the host pool
        except Exception as exc:  # e.g. out of memory: the op fails, the engine goes on
            error = _describe(exc)
            _wait_queued(self._backup_stream, self._device)
            if ring is not None:
                ring.discard()
        self._post(item.op, error)

    def _enqueue_backup(self, plan: CopyPlan, ring: StagingRing | None) -> None:
        dev_blocks = self._to_device(plan.device_blocks)
        if self._kernel is not None:
            offsets = self._to_device(self._kernel.host_offsets(plan))
            self._kernel.launch(plan, dev_blocks, offsets, True, range(self._layers), self._stream)
            return
        assert ring is not None
        for layer in range(self._layers):
            for blocks in self._pieces(plan, ring):
                self._backup_piece(plan, layer, blocks, dev_blocks, ring)

    @property
    def _stream(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self._device)

    def _pieces(self, plan: CopyPlan, ring: StagingRing) -> list[range]:
        row = self._kv * plan.block_tokens * self._token_bytes
        return block_ranges(plan.device_blocks.numel(), row, ring.slot_bytes)

    def _backup_piece(
        self, plan: CopyPlan, layer: int, blocks: range, dev_blocks: torch.Tensor, ring: StagingRing
    ) -> None:
        index, stage = self._stage(plan, blocks, ring)
        dev_stage = torch.empty(stage.shape, dtype=self._dtype, device=self._device)
        src = dev_blocks[blocks.start : blocks.stop]
        gather_from_device(self._device_pool, layer, plan, src, dev_stage)
        stage.copy_(dev_stage, non_blocking=True)
        part = sub_plan(plan, blocks)

        def scatter() -> None:
            scatter_to_host(self._host_pool, layer, part, stage)

        ring.commit(index, self._stream.record_event(), scatter)

    def _stage(self, plan: CopyPlan, blocks: range, ring: StagingRing) -> tuple[int, torch.Tensor]:
        """A staging slot viewed as ``[kv, len(blocks), block elements]``."""
        block_bytes = plan.block_tokens * self._token_bytes
        index, raw = ring.acquire(self._kv * len(blocks) * block_bytes)
        return index, stage_view(raw, self._dtype, self._kv, len(blocks))

    # ---- load lane ----------------------------------------------------------

    def _load(self, batch: _Batch) -> None:
        jobs = [_LoadJob(op) for op in batch.ops]
        finished = 0
        try:
            with torch.cuda.device(self._device), torch.cuda.stream(self._load_stream):
                self._load_stream.wait_event(batch.ready)
                for job in jobs:
                    self._prepare_load(job)
                for layer in range(self._layers):
                    for job in jobs:
                        self._enqueue_load_layer(job, layer)
                    batch.events[layer] = self._load_stream.record_event()
                    for job in jobs:
                        self._counter.finish(batch.batch, layer, job.error)
                    finished += 1
        except Exception as exc:  # the stream itself failed: fail what is left
            for job in jobs:
                job.error = job.error or _describe(exc)
            for layer in range(finished, self._layers):
                for job in jobs:
                    self._counter.finish(batch.batch, layer, job.error)
        done = _record_after(self._load_stream, self._device)
        for job in jobs:
            self._finisher.put(_Inflight(job.op, done, job.error))

    def _prepare_load(self, job: _LoadJob) -> None:
        try:
            job.dev_blocks = self._to_device(job.op.plan.device_blocks)
            if self._kernel is not None:
                job.host_offsets = self._to_device(self._kernel.host_offsets(job.op.plan))
        except Exception as exc:
            job.error = _describe(exc)

    def _enqueue_load_layer(self, job: _LoadJob, layer: int) -> None:
        if job.error is not None:
            return
        plan = job.op.plan
        try:
            if self._kernel is not None:
                layers = range(layer, layer + 1)
                self._kernel.launch(
                    plan, job.dev_blocks, job.host_offsets, False, layers, self._stream
                )
                return
            assert self._staging is not None
            ring = self._staging[1].ring
            for blocks in self._pieces(plan, ring):
                self._load_piece(plan, layer, blocks, job.dev_blocks, ring)
        except Exception as exc:
            job.error = _describe(exc)

    def _load_piece(
        self, plan: CopyPlan, layer: int, blocks: range, dev_blocks: torch.Tensor, ring: StagingRing
    ) -> None:
        index, stage = self._stage(plan, blocks, ring)
        gather_from_host(self._host_pool, layer, sub_plan(plan, blocks), stage)
        dev_stage = stage.to(self._device, non_blocking=True)
        dst = dev_blocks[blocks.start : blocks.stop]
        scatter_to_device(self._device_pool, layer, plan, dst, dev_stage)
        ring.commit(index, self._stream.record_event(), None)

    # ---- finisher thread ----------------------------------------------------

    def _finish(self, item: _Inflight) -> None:
        error = item.error
        try:
            if item.done is not None:
                item.done.synchronize()
            else:
                _wait_queued(self._load_stream, self._device)
        except Exception as exc:
            error = error or _describe(exc)
        self._post(item.op, error)


def _record_after(stream: torch.cuda.Stream, device: torch.device) -> torch.cuda.Event | None:
    """An event after everything queued on ``stream`` so far, or None if CUDA refuses."""
    try:
        with torch.cuda.device(device):
            return stream.record_event()
    except Exception as exc:
        logger.warning("cannot record an event on the copy stream: %s", _describe(exc))
        return None


def _wait_queued(stream: torch.cuda.Stream, device: torch.device) -> None:
    """Block until what is queued on ``stream`` has run (the whole device if that fails)."""
    event = _record_after(stream, device)
    try:
        if event is not None:
            event.synchronize()
        else:
            torch.cuda.synchronize(device)
    except Exception as exc:  # the device is gone: nothing more can run
        logger.warning("waiting for the copy stream failed: %s", _describe(exc))
