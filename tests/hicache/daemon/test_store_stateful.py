"""DaemonStore against a model: what its docstrings promise, checked after every step.

- ``put``: per-key success; a key already held (or repeated in the batch) keeps its
  first page; a tenant's pages are its own (same client key, other tenant: other page).
- ``get``: each key's own record or None; the records returned add up to at most
  ``max_bytes``, and from the first key that would exceed it every later key is a miss
  (``truncated``); ``memory_hits + store_hits`` are the hits, whichever tier served them.
- ``delete``: how many distinct keys were present; they are gone from both tiers.
- ``exists``: the count of leading present keys.
- a tenant given a quota later (a restart) keeps its pages: the model does not change.

The memory tier holds three pages, so reads go through to the store and back; the model
runs on every store the daemon can run on (lmdb, disk).
"""

from __future__ import annotations

import shutil
import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hicache.config.daemon import StoreConfig
from hicache.daemon.memory_lru import ENTRY_OVERHEAD
from hicache.daemon.store import DaemonStore, scoped_key
from storage_backends.page_format import HEADER_BYTES

from .conftest import ON_EVERY_STORE, page_key, page_record

SIZE = 200
RECORD = SIZE + HEADER_BYTES
TENANTS = ("shared", "quota")  # "quota" has a store of its own
IDS = st.lists(st.integers(0, 11), max_size=8)


class DaemonStoreModel(RuleBasedStateMachine):
    BACKEND = "lmdb"

    @initialize()
    def open(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="daemon-store-")
        config = StoreConfig(
            backend=self.BACKEND,
            path=f"{self.dir}/store",
            max_bytes=16 << 20,
            memory_bytes=3 * (RECORD + ENTRY_OVERHEAD),
            sync=False,
        )
        self.config = config
        self.store = DaemonStore(config, max_page_bytes=1 << 20, quotas={"quota": 16 << 20})
        self.model: dict[str, dict[bytes, bytes]] = {t: {} for t in TENANTS}
        self.version = 0
        self.reopened = False

    @precondition(lambda self: hasattr(self, "store") and not self.reopened)
    @rule()
    def give_shared_a_quota(self) -> None:
        """Restart with a quota for the tenant that wrote into the shared store: its pages
        there stay its own (read-only fallback), so the model does not change."""
        self.store.close()
        quotas = {"quota": 16 << 20, "shared": 16 << 20}
        self.store = DaemonStore(self.config, max_page_bytes=1 << 20, quotas=quotas)
        self.reopened = True

    def teardown(self) -> None:
        if hasattr(self, "store"):
            self.store.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    @staticmethod
    def _keys(tenant: str, ids: list[int]) -> tuple[list[bytes], list[bytes]]:
        client = [page_key(i) for i in ids]
        return [scoped_key(tenant, k) for k in client], client

    @precondition(lambda self: hasattr(self, "store"))
    @rule(tenant=st.sampled_from(TENANTS), ids=IDS)
    def put(self, tenant: str, ids: list[int]) -> None:
        self.version += 1
        scoped, client = self._keys(tenant, ids)
        records = [page_record(k, self.version * 100 + n, SIZE) for n, k in enumerate(client)]
        assert self.store.put(scoped, records, tenant) == [True] * len(ids)
        held = self.model[tenant]
        for key, record in zip(client, records, strict=True):
            held.setdefault(key, record)

    @precondition(lambda self: hasattr(self, "store"))
    @rule(tenant=st.sampled_from(TENANTS), ids=IDS)
    def delete(self, tenant: str, ids: list[int]) -> None:
        scoped, client = self._keys(tenant, ids)
        present = {k for k in client if k in self.model[tenant]}
        assert self.store.delete(scoped, tenant) == len(present)
        for key in present:
            del self.model[tenant][key]

    @precondition(lambda self: hasattr(self, "store"))
    @rule(tenant=st.sampled_from(TENANTS), ids=IDS, pages=st.integers(0, 9))
    def get(self, tenant: str, ids: list[int], pages: int) -> None:
        max_bytes = pages * RECORD + pages % 3  # at, and just past, a record's end
        scoped, client = self._keys(tenant, ids)
        lookup = self.store.get(scoped, client, max_bytes, tenant)
        want = [self.model[tenant].get(k) for k in client]
        used, truncated = 0, False
        for i, record in enumerate(want):
            used += len(record or b"")
            if used > max_bytes:
                want[i:], truncated = [None] * (len(want) - i), True
                break
        assert [None if r is None else bytes(r) for r in lookup.records] == want
        assert lookup.truncated == truncated
        hits = sum(r is not None for r in want)
        assert lookup.memory_hits + lookup.store_hits == hits
        assert min(lookup.memory_hits, lookup.store_hits) >= 0

    @precondition(lambda self: hasattr(self, "store"))
    @rule(tenant=st.sampled_from(TENANTS), ids=IDS)
    def exists(self, tenant: str, ids: list[int]) -> None:
        scoped, client = self._keys(tenant, ids)
        leading = 0
        while leading < len(client) and client[leading] in self.model[tenant]:
            leading += 1
        assert self.store.exists(scoped, tenant) == leading

    @invariant()
    def sizes(self) -> None:
        if hasattr(self, "store"):
            size = self.store.size()
            assert size.store_entries == sum(len(m) for m in self.model.values())
            assert size.store_corrupt == 0 and size.memory_entries <= 3


class DiskDaemonStoreModel(DaemonStoreModel):
    BACKEND = "disk"


for _model in (DaemonStoreModel, DiskDaemonStoreModel):
    _model.TestCase.settings = settings(max_examples=25, stateful_step_count=20, deadline=None)
test_daemon_store_keeps_its_promises = DaemonStoreModel.TestCase
test_daemon_store_on_disk_keeps_its_promises = DiskDaemonStoreModel.TestCase


@ON_EVERY_STORE
def test_a_key_held_keeps_its_first_page_in_both_tiers(tmp_path, daemon_backend: str) -> None:
    """Repeated in one batch, or put again while held (cached, or read through): the first
    page is what every later read gets, from memory or from LMDB."""
    config = StoreConfig(
        backend=daemon_backend,
        path=str(tmp_path / "s"),
        memory_bytes=RECORD + ENTRY_OVERHEAD,
        sync=False,
    )
    store = DaemonStore(config, max_page_bytes=1 << 20)
    try:
        client = [page_key(i) for i in range(3)]
        scoped = [scoped_key("t", k) for k in client]
        first = [page_record(k, 1, SIZE) for k in client]
        assert store.put([scoped[0], scoped[0]], [first[0], page_record(client[0], 2, SIZE)])
        assert store.put(scoped[1:], first[1:])  # evicts page 0 from memory
        for _ in range(2):  # again while held: in LMDB only, then cached again by the read
            assert store.put(scoped, [page_record(k, 3, SIZE) for k in client]) == [True] * 3
            lookup = store.get(scoped, client, 1 << 20)
            assert [bytes(r) for r in lookup.records if r is not None] == first
    finally:
        store.close()
