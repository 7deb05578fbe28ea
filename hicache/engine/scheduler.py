"""An SGLang-shaped scheduler loop over a HiRadixCache and a TinyLlama.

Each tick: poll the cache, start storage prefetches for new requests, then
run one prefill batch (the chunked request's next chunk, then newly admitted
requests, up to ``chunk_size`` new tokens) or, when there is nothing to
prefill, one batched greedy decode step over every running request.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from hicache.cache import HiRadixCache
from hicache.engine.invariant import padded_len
from hicache.engine.model import Segment, TinyLlama
from hicache.engine.request import ReqState, Request, RequestOutput, TierHits
from transfer import TransferError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineOptions:
    """``use_cache=False`` is the reference mode: no prefix is ever matched or
    inserted, every request computes its whole context in slots of its own."""

    use_cache: bool = True
    chunk_size: int = 256  # new tokens per prefill forward pass
    max_running: int = 16  # admitted requests (prefilling or decoding)

    def __post_init__(self) -> None:
        if self.chunk_size < 1 or self.max_running < 1:
            raise ValueError("chunk_size and max_running must be >= 1")


class _Chunk(NamedTuple):
    state: ReqState
    length: int  # tokens computed for ``state`` in this forward pass


class Engine:
    """Runs requests to completion through ``model`` with ``cache`` as its KV store.

    Mutates: ``cache`` (tree, pools, locks, prefetches — through its public API
    only) and the engine's own queues. Single-threaded: the engine is the
    cache's owner thread. A request that cannot get device memory waits; a
    running one may be retracted (its KV freed, its lock dropped) and queued
    again to recompute.
    """

    def __init__(
        self, model: TinyLlama, cache: HiRadixCache, options: EngineOptions | None = None
    ) -> None:
        model.spec.check_pool(cache.device_pool)
        self.model = model
        self.cache = cache
        self.options = options or EngineOptions()
        self._storage = self.options.use_cache and cache.storage is not None
        self._waiting: deque[ReqState] = deque()
        self._running: list[ReqState] = []  # admitted, oldest first
        self._ids = itertools.count()
        self._warm = False  # a forward pass has run (the first one's speed is not reported)

    # ------------------------------------------------------------- public
    def submit(self, request: Request) -> None:
        """Queue ``request``. ValueError if it could never fit the device pool,
        the model's positions or its vocabulary."""
        total = len(request.prompt) + request.max_new_tokens
        if padded_len(total, self.cache.page_size) > self.cache.device_pool.size:
            raise ValueError(f"request {request.request_id!r} needs more than the device pool")
        if total > self.model.spec.max_positions:
            raise ValueError(f"request {request.request_id!r} exceeds the model's positions")
        if min(request.prompt) < 0 or max(request.prompt) >= self.model.spec.vocab:
            raise ValueError(f"request {request.request_id!r} has tokens outside the vocabulary")
        cache_id = f"{request.request_id}#{next(self._ids)}"
        self._waiting.append(ReqState(request, time.perf_counter(), cache_id))

    def is_idle(self) -> bool:
        return not self._waiting and not self._running

    def step(self) -> list[RequestOutput]:
        """One scheduler tick; returns the requests that finished in it."""
        self.cache.poll()
        if self._storage:
            for state in self._waiting:
                if not state.prefetch_checked:
                    self._start_prefetch(state)
        batch = self._schedule_prefill()
        if batch:
            return self._prefill(batch)
        if self._running:
            return self._decode()
        if self._waiting:
            self._wait_for_prefetches()  # only storage prefetches are pending
        return []

    def run(self) -> list[RequestOutput]:
        """Tick until every submitted request has finished; outputs in finish order."""
        done: list[RequestOutput] = []
        while not self.is_idle():
            done.extend(self.step())
        return done

    def generate(self, requests: Sequence[Request]) -> list[RequestOutput]:
        """Submit ``requests`` (unique ids), run them all, return their outputs in order."""
        for request in requests:
            self.submit(request)
        by_id = {out.request_id: out for out in self.run()}
        return [by_id[r.request_id] for r in requests]

    # ----------------------------------------------------------- storage
    def _start_prefetch(self, state: ReqState) -> None:
        state.prefetch_checked = True
        key, ns = state.reusable, state.request.namespace
        # The prefetch looks storage up on the I/O workers (never here).
        match = self.cache.match_prefix(key, ns)
        fetching = self.cache.prefetch(state.cache_id, key, ns, match.last_host_node)
        state.prefetching = fetching > 0

    def _wait_for_prefetches(self) -> None:
        """Wait for the first waiting prefetch as long as its policy would (no
        longer: a ``cost`` deadline or a ``timeout`` budget ends the wait)."""
        state = next((s for s in self._waiting if s.prefetching), None)
        if state is None:
            self.cache.drain()
            return
        status = self.cache.check_prefetch(state.cache_id)
        if not status.ready:
            self.cache.wait_prefetch(state.cache_id, timeout_s=status.wait_s)

    def _prefetch_ready(self, state: ReqState) -> bool:
        """False while the prefetch policy says ``state`` must still wait."""
        if not state.prefetching:
            return True
        status = self.cache.check_prefetch(state.cache_id)
        if not status.ready:
            return False
        self.cache.release_prefetch(state.cache_id)
        state.prefetching = False
        state.fetched = status.fetched_tokens
        return True

    # --------------------------------------------------------- admission
    def _schedule_prefill(self) -> list[_Chunk]:
        budget = self.options.chunk_size
        batch: list[_Chunk] = []
        chunked = next((s for s in self._running if not s.decoding), None)
        if chunked is not None:
            batch.append(self._continue_chunk(chunked, budget))
            budget -= batch[-1].length
        while budget > 0 and self._can_admit(batch):
            chunk = self._admit_next(budget)
            if chunk is None:
                break
            batch.append(chunk)
            budget -= chunk.length
        return batch

    def _can_admit(self, batch: list[_Chunk]) -> bool:
        # One request at a time may be part-way through its prefill.
        whole = all(c.state.computed + c.length == len(c.state.tokens) for c in batch)
        return whole and bool(self._waiting) and len(self._running) < self.options.max_running

    def _admit_next(self, budget: int) -> _Chunk | None:
        state = next((s for s in self._waiting if self._prefetch_ready(s)), None)
        if state is None:
            return None
        self._waiting.remove(state)
        self._lock_prefix(state)
        n = min(budget, len(state.tokens) - state.computed)
        if not self._reserve(state, n):
            self._release(state)
            self._waiting.appendleft(state)
            return None
        self._running.append(state)
        return _Chunk(state, n)

    def _continue_chunk(self, state: ReqState, budget: int) -> _Chunk:
        n = min(budget, len(state.tokens) - state.computed)
        while not self._reserve(state, n):
            victims = [s for s in self._running if s is not state]
            if not victims:
                raise RuntimeError(
                    f"{state.request_id}: device pool exhausted with nothing to retract"
                )
            self._retract(victims[-1])
        return _Chunk(state, n)

    def _lock_prefix(self, state: ReqState) -> None:
        """Match the reusable prefix, load host hits back, lock the result."""
        if not self.options.use_cache:
            state.hits = TierHits(0, 0, 0)
            return
        match = self.cache.match_prefix(state.reusable, state.request.namespace)
        admitted = self.cache.admit(match)  # loads host hits back, locks the prefix
        state.slots, state.last_node = admitted.device_indices, admitted.last_node
        state.computed = state.tree_len = admitted.device_indices.numel()
        loaded = admitted.loaded_tokens
        if state.first_token_at is None:  # the admission that yields the first token counts
            storage = min(state.fetched, loaded)
            state.hits = TierHits(match.device_hit_length, loaded - storage, storage)

    # ------------------------------------------------------------ memory
    def _reserve(self, state: ReqState, n: int) -> bool:
        """Make ``state.slots`` cover ``computed + n`` tokens; False if the pool cannot."""
        need = state.computed + n - state.slots.numel()
        if need <= 0:
            return True
        new = self.cache.alloc_device(need)
        if new is None:
            # Nodes under a backup or a load stay locked until it lands: let them.
            self.cache.drain()
            new = self.cache.alloc_device(need)
        if new is None:
            return False
        state.slots = torch.cat([state.slots, new])
        return True

    def _release(self, state: ReqState) -> None:
        """Free the request's own slots and drop its lock; it keeps its tokens."""
        own = state.slots[state.tree_len :]
        if own.numel():
            self.cache.free_device(own)
        if state.last_node is not None:
            self.cache.dec_lock_ref(state.last_node)
        state.slots = state.slots[:0]
        state.computed = state.tree_len = 0
        state.last_node = None
        state.decoding = False

    def _retract(self, state: ReqState) -> None:
        logger.debug("retracting %s after %d tokens", state.request_id, state.computed)
        self._running.remove(state)
        self._release(state)
        state.retractions += 1
        self._waiting.appendleft(state)

    # ----------------------------------------------------------- forward
    def _forward(
        self, segments: list[Segment], states: list[ReqState], prefill: bool = False
    ) -> torch.Tensor | None:
        """Logits of each segment's last token; None (and the batch retracted)
        when a host load-back failed, so that its requests recompute."""
        self.cache.start_loading()
        start = time.perf_counter()
        try:
            logits = self.model.forward(segments, self.cache.device_pool, self.cache.wait_layer)
        except TransferError as e:
            logger.warning("KV load-back failed (%s); recomputing %d requests", e, len(states))
            for state in states:
                self._retract(state)
            # Let the batch's other copies land and the failed ones be applied, so
            # that no later match hands out device slots whose load is unfinished.
            self.cache.drain()
            return None
        if prefill and self._warm:  # its speed is what a load of cached KV competes with
            tokens = sum(seg.tokens.numel() for seg in segments)
            self.cache.record_prefill(tokens, time.perf_counter() - start)
        # The first pass pays one-time costs (lazy initialisation, first allocations).
        self._warm = True
        return logits

    def _prefill(self, batch: list[_Chunk]) -> list[RequestOutput]:
        segments = [
            Segment(
                _ids(s.tokens[s.computed : s.computed + n]), s.computed, s.slots[: s.computed + n]
            )
            for s, n in batch
        ]
        logits = self._forward(segments, [c.state for c in batch], prefill=True)
        if logits is None:
            return []
        finished: list[RequestOutput] = []
        for (state, n), row in zip(batch, logits, strict=True):
            state.computed += n
            if self.options.use_cache:
                self._cache_progress(state)
            if state.computed == len(state.tokens):
                state.decoding = True
                finished += self._emit(state, row)
        return finished

    def _decode(self) -> list[RequestOutput]:
        for state in list(self._running):
            while state in self._running and not self._reserve(state, 1):
                self._retract(self._running[-1])
        states = list(self._running)
        if not states:
            return []
        segments = [
            Segment(
                _ids(s.tokens[s.computed : s.computed + 1]), s.computed, s.slots[: s.computed + 1]
            )
            for s in states
        ]
        logits = self._forward(segments, states)
        if logits is None:
            return []
        finished: list[RequestOutput] = []
        for state, row in zip(states, logits, strict=True):
            state.computed += 1
            finished += self._emit(state, row)
        return finished

    # ------------------------------------------------------------ results
    def _cache_progress(self, state: ReqState) -> None:
        """Insert what the request computed so far; adopt the tree's slots."""
        n = state.computed
        assert state.last_node is not None
        res = self.cache.cache_unfinished_req(
            state.tokens[:n], state.slots[:n], state.last_node, state.request.namespace
        )
        k = res.device_indices.numel()
        state.slots = torch.cat([res.device_indices, state.slots[k:]])
        state.tree_len, state.last_node = k, res.last_node

    def _emit(self, state: ReqState, logits: torch.Tensor) -> list[RequestOutput]:
        """Append the greedy token; finish the request when it has all its tokens."""
        state.tokens.append(int(torch.argmax(logits)))
        state.logits = logits
        if state.first_token_at is None:
            state.first_token_at = time.perf_counter()
        if not state.finished:
            return []
        self._running.remove(state)
        if self.options.use_cache:
            n = state.computed
            assert state.last_node is not None
            self.cache.cache_finished_req(
                state.tokens[:n], state.slots[:n], state.last_node, state.request.namespace
            )
        else:
            self.cache.free_device(state.slots)
        state.last_node = None
        return [state.output()]


def _ids(tokens: list[int]) -> torch.Tensor:
    return torch.tensor(tokens, dtype=torch.int64)
