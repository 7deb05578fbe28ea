"""Backends from outside the project: ``package.module:Class`` and entry points."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hicache.cache import HiRadixCache
from hicache.config.cache import CacheConfig
from storage_backends import StorageConfig, create
from storage_backends.guard import GuardedBackend
from storage_backends.memory import MemoryBackend
from storage_backends.plugins import ENTRY_POINT_GROUP, entry_point_names


class PluginBackend(MemoryBackend):
    """An outside backend: the memory one, under another class and module."""

    created: list[StorageConfig] = []  # noqa: RUF012  # what each construction got

    def __init__(self, config: StorageConfig) -> None:
        super().__init__(config)
        PluginBackend.created.append(config)


DOTTED = f"{__name__}:PluginBackend"


def test_dotted_name_loads_like_a_builtin() -> None:
    backend = create(DOTTED, StorageConfig(backend=DOTTED))
    try:
        assert isinstance(backend, PluginBackend)
        assert PluginBackend.created[-1].backend == DOTTED
    finally:
        backend.close()


def test_the_cache_stores_pages_in_a_dotted_backend() -> None:
    overrides = {"storage.backend": DOTTED, "device.device": "cpu", "host.reserve_gb": 0.0}
    cache = HiRadixCache(CacheConfig.from_mapping({}, overrides))
    try:
        tokens = list(range(64))
        m = cache.match_prefix(tokens)
        cache.inc_lock_ref(m.last_device_node)
        slots = cache.alloc_device(len(tokens))
        assert slots is not None
        cache.cache_finished_req(tokens, torch.cat([m.device_indices, slots]), m.last_device_node)
        cache.drain()
        cache.check_integrity()
        guard = cache.storage.backend  # type: ignore[union-attr]
        assert isinstance(guard, GuardedBackend)  # every backend is guarded
        assert isinstance(guard.backend, PluginBackend)
        assert guard.backend.stats().entries == 4
    finally:
        cache.close()


def _install_entry_point(site: Path, name: str, target: str) -> None:
    """A minimal installed distribution that registers ``name`` -> ``target``."""
    dist = site / "hicache_test_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: hicache-test-plugin\nVersion: 0.1\n"
    )
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{name} = {target}\n")


def test_entry_point_name_loads_like_a_builtin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install_entry_point(tmp_path, "testplugin", DOTTED)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "testplugin" in entry_point_names()
    config = StorageConfig(backend="testplugin")
    backend = create("testplugin", config)
    try:
        assert isinstance(backend, PluginBackend)
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("no_such_pkg.mod:Cls", "does not import"),
        (f"{__name__}:Missing", "does not import"),
    ],
)
def test_a_plugin_that_does_not_import_is_a_clear_error(name: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        create(name, StorageConfig(backend=name))


def test_an_unknown_plain_name_is_refused_by_the_config() -> None:
    with pytest.raises(ValueError, match=r"package\.module:Class"):
        StorageConfig(backend="nosuchstore")
