"""Old module paths that moved when ``hicache/`` was split into sub-packages (and
``hicache/bench/`` into one sub-package per suite).

For one release an import of an old path (``import hicache.metrics``, ``from
hicache.radix_tree import extend_key``) still works: it gets the module at its
new path, the same object, and a DeprecationWarning naming that path. The
finder that answers them is ``storage_backends._moved``'s (the one mechanism,
kept in the lower package so that ``storage_backends`` can use it for its own
moved modules); this module holds ``hicache``'s map.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from storage_backends import _moved

# old path -> new path (docs/architecture.md, "Where the code lives"; remove after next release)
MOVED: Mapping[str, str] = MappingProxyType(
    {
        "hicache.bad_token": "hicache.tree.bad_token",
        "hicache.bench.daemon_cells": "hicache.bench.daemon.cells",
        "hicache.bench.daemon_fairness": "hicache.bench.daemon.fairness",
        "hicache.bench.daemon_profile": "hicache.bench.daemon.profiler",
        "hicache.bench.daemon_store": "hicache.bench.daemon.store",
        "hicache.bench.disk_grid": "hicache.bench.storage.disk_grid",
        "hicache.bench.disk_sides": "hicache.bench.storage.disk_sides",
        "hicache.bench.mooncake_target": "hicache.bench.storage.mooncake",
        "hicache.bench.page_cache": "hicache.bench.common.page_cache",
        "hicache.bench.processes": "hicache.bench.common.processes",
        "hicache.bench.provenance": "hicache.bench.common.provenance",
        "hicache.bench.scratch": "hicache.bench.common.scratch",
        "hicache.bench.sglang_drivers": "hicache.bench.tree.sglang_drivers",
        "hicache.bench.sglang_linker": "hicache.bench.sglang.linker",
        "hicache.bench.sglang_linker_rows": "hicache.bench.sglang.linker_rows",
        "hicache.bench.sglang_trees": "hicache.bench.tree.sglang_trees",
        "hicache.bench.sharing": "hicache.bench.tiering.sharing",
        "hicache.bench.storage_targets": "hicache.bench.storage.targets",
        "hicache.bench.store_open": "hicache.bench.storage.store_open",
        "hicache.bench.tiering_plot": "hicache.bench.tiering.plot",
        "hicache.bench.workloads": "hicache.bench.common.workloads",
        "hicache.bench.zmq_echo": "hicache.bench.common.zmq_echo",
        "hicache.cli_common": "hicache.config.flags",
        "hicache.config_doc": "hicache.config.doc",
        "hicache.config_loader": "hicache.config.loader",
        "hicache.daemon.config": "hicache.config.daemon",
        "hicache.daemon.protocol": "storage_backends.remote.protocol",
        "hicache.door": "hicache.tree.door",
        "hicache.errors": "hicache.tree.errors",
        "hicache.event_formats": "hicache.events.formats",
        "hicache.eviction": "hicache.policies.eviction",
        "hicache.hashing": "hicache.keys.hashing",
        "hicache.host_tier": "hicache.tiers.host",
        "hicache.integrity": "hicache.tree.integrity",
        "hicache.metrics": "hicache.observe.metrics",
        "hicache.native": "device_pool.native",
        "hicache.observer": "hicache.observe.observer",
        "hicache.paging": "hicache.tree.paging",
        "hicache.policy_registry": "hicache.policies.registry",
        "hicache.prefetch_policy": "hicache.policies.prefetch",
        "hicache.prometheus": "hicache.observe.prometheus",
        "hicache.radix_tree": "hicache.tree.radix_tree",
        "hicache.records": "hicache.tiers.records",
        "hicache.residency": "hicache.tiers.residency",
        "hicache.results": "hicache.tiers.results",
        "hicache.shipped": "hicache.config.shipped",
        "hicache.storage_tier": "hicache.tiers.storage",
        "hicache.store_cli": "hicache.cli.store",
        "hicache.token_ids": "hicache.tree.token_ids",
        "hicache.write_policy": "hicache.policies.write",
    }
)


def install() -> None:
    """Put the finder of ``MOVED`` first on ``sys.meta_path`` (once)."""
    _moved.install(MOVED)
