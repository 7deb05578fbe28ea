"""Admission: a request's hits in the lower tiers taken into use, for the façade.

A host hit is loaded back to the device (``load_back``, ``admit``); a storage hit
is prefetched into reserved host slots (``prefetch``), followed (``status``),
released when the request goes on (``release``: the pages that arrived go to the
tree at once, and under a policy that cuts, the rest of the read stops), and
landed in the tree as host-only nodes when its job completes (``landed``). How
much of a hit is worth loading, and how long a request waits for it, is the
prefetch policy's word over the measured rates (DESIGN §12).

``HiRadixCache`` owns one and calls it on its owner thread, as it would call its
own methods: it reaches the parts (the residency tree, the host tier, the storage
tier, the observer) but never their records, which the façade routes. Room
for a load (device slots) or a prefetch (host slots) comes from ``Demotion``,
which evicts. The storage tier comes with each call: the façade drops it when it
closes.
"""

from __future__ import annotations

import torch

from hicache.config.cache import PolicyConfig
from hicache.demotion import Demotion
from hicache.keys.hashing import NodeKeys, page_keys
from hicache.observe.observer import Observer
from hicache.policies.prefetch import PrefetchPolicy, StoragePlan, create_prefetch_policy
from hicache.policies.prefetch_cost import CostSettings, PrefixParts
from hicache.tiers.host import HostTier
from hicache.tiers.records import PrefetchDone, PrefetchState
from hicache.tiers.residency import ResidencyTree
from hicache.tiers.results import AdmitResult, LoadBackResult, MatchResult, PrefetchStatus
from hicache.tiers.storage import StorageTier, prefetch_outcome
from hicache.tree.door import check_count, check_namespace, check_on_path
from hicache.tree.errors import CacheError
from hicache.tree.paging import align_down, empty_slots
from hicache.tree.radix_tree import Tokens, TreeNode, as_token_list


class Admission:
    """Load-backs and prefetches for the façade (see the module docstring).

    Owner thread only. Raises ``ValueError`` / ``CacheError`` for bad input
    before anything changes, as the façade's methods document.
    """

    def __init__(
        self,
        policy: PolicyConfig,
        bytes_per_token: int,
        residency: ResidencyTree,
        host: HostTier | None,
        observer: Observer,
        keys: NodeKeys,
        demotion: Demotion,
    ) -> None:
        self._config = policy
        self._page_size = keys.page_size
        self._bytes_per_token = bytes_per_token
        self._residency = residency
        self._host = host
        self._observer = observer
        self._keys = keys
        self._demotion = demotion
        self.policy: PrefetchPolicy = create_prefetch_policy(policy.prefetch_policy)
        self._cost = CostSettings(policy.cost_margin, policy.cost_probe_s)

    # host hits -----------------------------------------------------------------
    def load_back(
        self, store: StorageTier | None, last_host_node: TreeNode, host_hit_length: int
    ) -> LoadBackResult:
        """``HiRadixCache.init_load_back`` (``store``: what eviction may wait for)."""
        check_count(host_hit_length, "host_hit_length")
        host = self._host
        if host is None or host.transfer is None:
            raise CacheError("the host tier is disabled or closed")
        residency = self._residency
        residency.check_node(last_host_node, locked=False)
        chain = residency.host_chain(last_host_node)
        total = sum(len(n.key) for n in chain)
        anchor = chain[0].parent if chain else last_host_node
        assert anchor is not None
        threshold = max(self._config.load_back_threshold, 1)
        if total == 0 or total < threshold or host_hit_length <= 0:
            return LoadBackResult(empty_slots(), anchor, 0)
        # Pin what we stand on while allocation evicts: the device prefix and
        # the host copies to load.
        residency.lock(anchor)
        pin = host.pin(chain)
        try:
            slots = self._demotion.alloc_device(total, store)
        finally:
            host.unpin(pin)
            residency.unlock(anchor)
        if slots is None:
            return LoadBackResult(empty_slots(), anchor, 0)
        residency.attach_device(chain, slots)
        residency.lock(chain[-1])
        host.queue_load(chain, slots)
        return LoadBackResult(slots.clone(), chain[-1], int(slots.numel()))

    def admit(self, store: StorageTier | None, match: MatchResult) -> AdmitResult:
        """``HiRadixCache.admit``."""
        prefix, last, loaded = match.device_indices, match.last_device_node, 0
        can_load = self._host is not None and self._host.transfer is not None
        if match.host_hit_length and can_load and self._worth_loading(match):
            lb = self.load_back(store, match.last_host_node, match.host_hit_length)
            if lb.loaded_tokens:
                prefix, last = torch.cat([prefix, lb.device_indices]), lb.last_node
                loaded = lb.loaded_tokens
        self._residency.lock(last)
        return AdmitResult(prefix, last, loaded)

    def _worth_loading(self, match: MatchResult) -> bool:
        """The prefetch policy's word on loading the host hit back (``cost``:
        only when it arrives clearly before it could be recomputed)."""
        parts = PrefixParts(
            match.device_hit_length,
            match.host_hit_length,
            0,
            self._page_size,
            self._bytes_per_token,
        )
        return self.policy.plan(parts, self._observer.rates.snapshot(), self._cost).host > 0

    # storage hits --------------------------------------------------------------
    def prefetch(
        self,
        store: StorageTier,
        request_id: str,
        tokens: Tokens,
        namespace: str | None,
        last_host_node: TreeNode,
    ) -> int:
        """``HiRadixCache.prefetch``, once the request id is checked and there is a
        storage tier."""
        host, residency, ps = self._host, self._residency, self._page_size
        assert host is not None
        if store.has_prefetch(request_id):
            raise CacheError(f"request {request_id!r} already has a prefetch")
        check_namespace(namespace)
        key = as_token_list(tokens)
        residency.check_node(last_host_node, locked=False)
        start = check_on_path(residency.tree, last_host_node, key, namespace, "last_host_node")
        aligned, threshold = align_down(len(key), ps), self._config.prefetch_threshold
        min_pages = -(-threshold // ps)
        if aligned - start <= 0 or aligned - start < threshold:
            return 0
        chain = residency.host_chain(last_host_node)
        host_len = sum(len(n.key) for n in chain)
        parts = PrefixParts(start - host_len, host_len, aligned - start, ps, self._bytes_per_token)
        plan = StoragePlan(self.policy, parts, self._observer.rates.snapshot(), self._cost)
        metrics = self._observer.metrics
        if not plan.pages((aligned - start) // ps) and not plan.pages(min_pages):
            metrics.add("prefetch_started")  # judged too slow: not even looked up
            metrics.add("prefetch_declined")
            return 0
        keys = page_keys(self._keys.chain_from(last_host_node), namespace, key[start:aligned], ps)
        pin = host.pin(chain)  # what the pages hang from
        self._demotion.make_host_room(aligned - start)
        slots = host.reserve(aligned - start)
        if slots is None:
            host.unpin(pin)
            return 0
        page_bytes = self._bytes_per_token * ps
        store.start_prefetch(
            request_id, key, namespace, start, keys, slots, pin, min_pages, plan, page_bytes
        )
        metrics.add("prefetch_started")
        return aligned - start

    def status(self, store: StorageTier, state: PrefetchState) -> PrefetchStatus:
        """Where ``state`` stands under the prefetch policy (``check_prefetch``)."""
        total = len(state.keys) * self._page_size
        per_1k = self._config.prefetch_timeout_per_1k_s
        budget = self._config.prefetch_timeout_base_s + per_1k * total / 1000
        return store.status(state, self.policy, budget)

    def release(self, store: StorageTier, request_id: str) -> None:
        """``HiRadixCache.release_prefetch``, once there is a storage tier."""
        state = store.prefetch(request_id)
        waited = self._observer.rates.clock() - state.started
        if not state.done:
            got = store.take_arrived(request_id, self.policy.cuts)
            if got.cut:
                self._observer.metrics.add("prefetch_cuts")
                if got.seconds > 0:  # counts with what it moved (a page at least: one was due)
                    page = self._page_size * self._bytes_per_token
                    self._observer.rates.record_s2h(max(got.nbytes, page), got.seconds)
            self._adopt(got.state, got.lo, got.hi)
        store.release(request_id)
        self._observer.latency("prefetch_wait", waited)  # prefetch() until the request went on

    def landed(self, done: PrefetchDone) -> None:
        """A prefetch job finished (the façade routes its ``PrefetchDone`` here): its
        pages become host-only nodes, the host slots it did not fill are freed."""
        host = self._host
        assert host is not None
        state = done.state
        got = max(done.fetched_pages * self._page_size, state.taken)
        metrics = self._observer.metrics
        metrics.record_transfer("s2h", done.nbytes, done.ok)
        outcome = prefetch_outcome(done, self._page_size, self._config.prefetch_threshold)
        metrics.add(f"prefetch_{outcome}")
        if done.read is not None and not state.cut:  # a cut read was counted when cut
            self._observer.rates.record_s2h(*done.read)
        host.free_reserved(state.host_slots[got:])
        self._adopt(state, state.taken, got)
        host.unpin(state.pin_id)

    def _adopt(self, state: PrefetchState, lo: int, hi: int) -> None:
        """Tokens ``[lo, hi)`` of a prefetch's reserved host slots landed: they
        become a host-only node below what the tree holds of their prefix."""
        if hi <= lo:
            return
        host = self._host
        assert host is not None
        slots, ps = state.host_slots[lo:hi], self._page_size
        graft = self._residency.graft(
            state.key[: state.start + hi], state.namespace, state.start + lo
        )
        # graft.have < 0: the prefix they hang from is gone, nothing to attach to.
        host.free_reserved(slots if graft.have < 0 else slots[: graft.have])
        if graft.node is not None:
            host.adopt(graft.node, slots[graft.have :])
            self._keys.assign(graft.node, state.keys[(lo + graft.have) // ps : hi // ps])
            self._observer.stored(graft.node, "host")
