"""vLLM uses hicache's stores as a secondary offloading tier (vLLM 0.33 tiering API).

vLLM's ``OffloadingConnector`` with ``TieringOffloadingSpec`` keeps offloaded
KV in a CPU primary tier and cascades every chunk to its secondary tiers; a
chunk found only in a secondary tier is promoted (loaded) back into the
primary tier. ``HicacheTier`` is such a secondary tier over our stores (the
daemon by default, LMDB, file, Redis, a plug-in), loaded by vLLM's
``SecondaryTierFactory`` from ``type`` + ``module_path`` with no change to
vLLM::

    "secondary_tiers": [{"type": "HicacheTier",
                         "module_path": "hicache.integrations.vllm",
                         "hicache_config": "remote"}]

How it maps (docs/vllm.md):

- vLLM calls every method on its scheduler thread under its manager's lock;
  none of ours blocks there. Lookups go through vLLM's own
  ``AsyncLookupManager`` (as its ``fs`` tier does): RETRY until a worker has
  asked the store. Loads and stores run on ``TierJobRunner`` threads and come
  back through ``get_finished_jobs``.
- Keys: an ``OffloadKey`` (block hash ‖ KV group) becomes our page key
  ``sha256(namespace digest ‖ OffloadKey)``; the namespace holds what the key
  leaves out, the same fields vLLM's ``fs`` tier hashes into its directory
  name (model, dtype, tokens per hash, blocks per chunk, parallel sizes, KV
  groups) plus the chunk's byte size.
- Values: one stored page per primary-tier chunk, our checksummed page format.
  Loads are copied straight into the chunk's slice of the primary tier's
  memoryview once verified, stores read from it: no staging copy. A damaged
  or missing page fails the load for its key (vLLM recomputes it), never
  wrong bytes in the primary tier.
- Never raises into vLLM after construction: a failed backend call is a miss
  or a failed ``JobResult``, counted (``get_stats``) and logged rate-limited.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.v1.kv_offload.base import (
    ConfigInfoMapping,
    Locality,
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingEvent,
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.file_mapper import FileMapper
from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager
from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from hicache.integrations.common import (
    DEFAULT_HICACHE_CONFIG,
    FailureLog,
    Keyer,
    Namespace,
    backend_errors,
    open_backend,
    resolve_storage_config,
)
from hicache.integrations.load_deadline import LoadBounds, prefill_speed
from hicache.integrations.removals import RemovalMap
from hicache.integrations.vllm_jobs import FinishedJob, JobOutcome, TierJobRunner
from storage_backends.base import StorageBackend

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec

logger = logging.getLogger(__name__)

# Stored chunks whose removal this tier can announce at most (the most recent ones).
ANNOUNCED_KEYS = 1 << 20

__all__ = ["HicacheTier", "TierMetrics", "present_per_key", "vllm_namespace"]


class TierMetrics:
    """Prometheus counters this tier reports through ``get_stats`` (vLLM adds
    its own per-tier read/write bytes and job failure counters)."""

    LOAD_FAILED_CHUNKS = "vllm:kv_offload_hicache_load_failed_chunks"
    STORE_FAILED_CHUNKS = "vllm:kv_offload_hicache_store_failed_chunks"
    BACKEND_ERRORS = "vllm:kv_offload_hicache_backend_errors"
    DOCS: ClassVar[dict[str, str]] = {
        LOAD_FAILED_CHUNKS: "Chunks the hicache tier could not load (missing, damaged "
        "or store unreachable); vLLM recomputes them.",
        STORE_FAILED_CHUNKS: "Chunks the hicache tier could not store.",
        BACKEND_ERRORS: "hicache backend calls or jobs that failed other than by a miss "
        "(no reply in time, a daemon down or refusing, an error reply, an exception).",
    }


def vllm_namespace(offloading_spec: OffloadingSpec, chunk_bytes: int) -> Namespace:
    """What partitions this engine's chunks: the fields vLLM's ``fs`` tier
    hashes into its directory name (``FileMapper``, parallel-agnostic where
    vLLM says the bytes are) plus the chunk size in bytes."""
    mapper = FileMapper.from_offloading_spec(
        root_dir="",
        offloading_spec=offloading_spec,
        blocks_per_file=offloading_spec.blocks_per_chunk,
        parallel_agnostic=True,
    )
    fields: dict[str, object] = {
        name: value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        for name, value in mapper.get_run_config().items()
    }
    fields.update(engine="vllm", rank=mapper.rank, chunk_bytes=chunk_bytes)
    return Namespace.of(fields)


def present_per_key(backend: StorageBackend, keys: Sequence[bytes]) -> list[bool]:
    """Per-key presence in one ``contains`` call (vLLM's sliding-window lookups ask
    about keys past a hole; the prefix ``exists`` would cost a call per hole)."""
    return list(backend.contains(keys))


class _StoreLookup(AsyncLookupManager):
    """vLLM's async lookup front end, asking our store on its worker thread."""

    def __init__(self, tier: HicacheTier, tier_type: str) -> None:
        super().__init__(tier_type=tier_type)
        self._tier = tier

    def batch_lookup(self, keys: list[OffloadKey], req_context: ReqContext) -> Iterable[bool]:
        return self._tier.batch_present(keys)


class HicacheTier(SecondaryTierManager):
    """A vLLM secondary tier over a hicache store (see the module doc).

    Tier config keys (``secondary_tiers`` entry): ``hicache_config`` (a shipped
    config name or a TOML path whose ``[storage]`` section picks the store;
    ``remote`` by default), ``workers`` (I/O threads, default 8),
    ``enable_kv_events`` and ``locality`` (as vLLM's ``fs`` tier),
    ``prefill_tokens_per_s`` (the engine's prefill speed: loads then stop at a
    deadline from the store's measured reads), and any ``[storage]`` field as
    an override (``endpoint``, ``path``, ``timeout_s``, ...). An unknown key
    is a ValueError naming it, at construction.

    Thread-safety: vLLM serialises calls under its manager lock; our workers
    touch only the backend (thread-safe) and the primary view's slices of the
    jobs vLLM pinned for them. Construction raises ValueError for a bad
    config and what the backend raises when its store cannot be opened; no
    other method raises.
    """

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        hicache_config: str = DEFAULT_HICACHE_CONFIG,
        workers: int = 8,
        enable_kv_events: bool = False,
        locality: str | None = None,
        backpressure_detector: BackpressureDetector | None = None,
        prefill_tokens_per_s: float = 0.0,
        **storage_overrides: Any,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        # Everything that can refuse the config runs before this tier holds a view of
        # the primary region: a view left behind keeps vLLM from unmapping it.
        self.locality = Locality(locality) if locality is not None else None
        self.storage_config = resolve_storage_config(
            hicache_config, storage_overrides, source=f"HicacheTier ({tier_type})"
        )
        self.namespace = vllm_namespace(offloading_spec, self.block_size_bytes)
        # With the engine's prefill speed, a load stops at the deadline the store's
        # measured reads give it; the chunks not read are recomputed (load_deadline).
        chunk_tokens = (
            max(offloading_spec.tokens_per_block, default=1) * offloading_spec.blocks_per_chunk
        )
        speed = prefill_speed({"prefill_tokens_per_s": prefill_tokens_per_s})
        self.bounds = LoadBounds(chunk_tokens, speed, self.storage_config.backend)
        self._keyer: Keyer = self.namespace.keyer()
        self._failures = FailureLog(logger)
        self._events: list[OffloadingEvent] | None = (
            []
            if enable_kv_events and offloading_spec.kv_events_config.enable_kv_cache_events
            else None
        )
        # Room for what the store holds, and for the pages stored since the last
        # take_events whose removals are not collected yet.
        self._announced: RemovalMap[OffloadKey] = RemovalMap(
            min(self.storage_config.max_bytes // self.block_size_bytes + 4096, ANNOUNCED_KEYS)
        )
        self._job_keys: dict[int, list[OffloadKey]] = {}
        self._counts = dict.fromkeys(TierMetrics.DOCS, 0)
        self._errors_reported = 0
        self._closed = False
        self._backend = open_backend(self.storage_config)
        self._flat = primary_kv_view.cast("B")
        self._num_chunks = len(self._flat) // self.block_size_bytes
        try:
            self._runner = TierJobRunner(workers, self._failures, name=f"hicache-vllm-{tier_type}")
            self._lookup = _StoreLookup(self, tier_type)
        except BaseException:
            self._flat.release()
            self._backend.close()
            raise
        logger.info(
            "hicache tier %r: %s store, namespace %s",
            tier_type,
            self.storage_config.backend,
            self.namespace.describe(),
        )

    # --- vLLM's SecondaryTierManager interface (scheduler thread) ---------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        found: bool | None = self._failures.call(
            "lookup", lambda: self._lookup.lookup(key, req_context), False
        )
        if found is None:
            return LookupResult.RETRY
        return LookupResult.HIT if found else LookupResult.MISS

    def submit_store(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, is_load=False)

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, is_load=True)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        return [self._result(done) for done in self._runner.finished()]

    def has_pending_work(self) -> bool:
        return self._runner.busy()

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self._events is None:
            return ()
        self._collect_removals(self._events)
        events, self._events = self._events, []
        return events

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._failures.call(
            "lookup cleanup", lambda: self._lookup.cleanup(req_context.req_id), None
        )

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._failures.call("lookup flush", self._lookup.flush, None)

    def drain_jobs(self) -> None:
        self._runner.wait_idle()

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._failures.call("shutdown lookups", self._lookup.shutdown, None)
        self._runner.shutdown()
        self._failures.call("close backend", self._backend.close, None)
        # vLLM unmaps the primary region after its tiers shut down, and cannot while
        # a view of it is alive: the workers' slices are gone, ours goes now.
        self._failures.call("release the primary view", self._flat.release, None)

    @classmethod
    def build_metric_definitions(
        cls, extra_config: dict[str, Any]
    ) -> dict[str, OffloadingMetricMetadata]:
        return {
            name: OffloadingCounterMetadata(documentation=doc)
            for name, doc in TierMetrics.DOCS.items()
        }

    def get_stats(self) -> OffloadingConnectorStats | None:
        errors = self._failures.total() + backend_errors(self._backend)
        self._counts[TierMetrics.BACKEND_ERRORS] += errors - self._errors_reported
        self._errors_reported = errors
        if not any(self._counts.values()):
            return None
        stats = OffloadingConnectorStats()
        for name, value in self._counts.items():
            if value:
                stats.increase_counter(name, value)
        self._counts = dict.fromkeys(TierMetrics.DOCS, 0)
        return stats

    @classmethod
    def config_info_keys(cls, tier_config: dict[str, Any]) -> tuple[str, ...]:
        return ("hicache_backend",)

    def config_info(self) -> ConfigInfoMapping:
        return {"hicache_backend": self.storage_config.backend}

    # --- ours ---------------------------------------------------------------------------

    def _collect_removals(self, events: list[OffloadingEvent]) -> None:
        """Removal events for the pages the store removed that this tier announced."""
        removed: list[bytes] = self._failures.call("take removed", self._backend.take_removed, [])
        keys = self._announced.removed(removed)
        if keys:
            events.append(self._event(keys, removed=True))

    def _event(self, keys: list[OffloadKey], removed: bool) -> OffloadingEvent:
        # Owned by this tier, as vLLM's own evicting tiers announce theirs, but with no
        # removal promised: pages the daemon or another process evicts never show up in
        # take_removed, and a promise would keep vLLM's metadata for them forever.
        return OffloadingEvent(
            keys=keys,
            medium=Medium.STORAGE,
            removed=removed,
            locality=self.locality,
            ownership=self.tier_type,
        )

    def batch_present(self, keys: Sequence[OffloadKey]) -> list[bool]:
        """Per-key presence in the store (lookup worker thread; all False on error)."""
        return self._failures.call(
            "lookup",
            lambda: present_per_key(self._backend, self._keyer.keys(keys)),
            [False] * len(keys),
        )

    def failure_counts(self) -> dict[str, int]:
        """Failures so far by kind (lookup, load, store, ...), for tests and logs."""
        return self._failures.counts()

    def _submit(self, job: TransferJob, is_load: bool) -> None:
        keys = list(job.keys)
        self._job_keys[job.job_id] = keys
        chunk_ids = [int(c) for c in job.chunk_ids]
        io = self._load_io if is_load else self._store_io
        self._runner.submit(job.job_id, is_load, functools.partial(io, keys, chunk_ids))

    def _chunks(self, chunk_ids: Sequence[int], count: int) -> list[memoryview]:
        if len(chunk_ids) != count:
            raise ValueError(f"{count} keys but {len(chunk_ids)} chunk ids")
        size = self.block_size_bytes
        bad = [c for c in chunk_ids if not 0 <= c < self._num_chunks]
        if bad:
            raise ValueError(f"chunk ids {bad[:4]} outside the primary tier's {self._num_chunks}")
        return [self._flat[c * size : (c + 1) * size] for c in chunk_ids]

    def _load_io(self, keys: list[OffloadKey], chunk_ids: list[int]) -> JobOutcome:
        """Worker: verified pages straight into the primary tier's chunks, up to
        the load's deadline (the chunks past it fail: vLLM recomputes them)."""
        dst, keyed = self._chunks(chunk_ids, len(keys)), self._keyer.keys(keys)
        size = self.block_size_bytes
        hits = self.bounds.read(
            len(keys), size, lambda lo, hi: self._backend.get(keyed[lo:hi], dst[lo:hi]), False
        )
        return JobOutcome(tuple(hits), sum(hits) * size)

    def _store_io(self, keys: list[OffloadKey], chunk_ids: list[int]) -> JobOutcome:
        """Worker: the primary tier's chunks into the store (present keys are skipped)."""
        src = self._chunks(chunk_ids, len(keys))
        stored = self._backend.put(self._keyer.keys(keys), src)
        return JobOutcome(tuple(stored), sum(stored) * self.block_size_bytes)

    def _result(self, done: FinishedJob) -> JobResult:
        keys = self._job_keys.pop(done.job_id, [])
        ok = done.outcome.ok if done.outcome is not None else (False,) * len(keys)
        success = len(ok) == len(keys) and all(ok)
        nbytes = done.outcome.nbytes if done.outcome is not None else 0
        if success:
            if not done.is_load and self._events is not None and keys:
                self._announced.stored(self._keyer.keys(keys), keys)
                self._events.append(self._event(keys, removed=False))
            return JobResult(done.job_id, True, None, done.seconds, nbytes)
        failed = [k for k, good in zip(keys, ok, strict=False) if not good] or keys
        if not done.is_load:
            self._counts[TierMetrics.STORE_FAILED_CHUNKS] += len(failed)
            return JobResult(done.job_id, False, None, done.seconds, nbytes)
        self._counts[TierMetrics.LOAD_FAILED_CHUNKS] += len(failed)
        # A chunk that failed to load must not keep its cached HIT, or vLLM
        # would promote it again forever (the livelock vLLM's fs tier avoids).
        self._lookup.mark_miss(failed)
        loaded = tuple(k for k, good in zip(keys, ok, strict=False) if good)
        return JobResult(done.job_id, False, loaded or None, done.seconds, nbytes)
