"""Module paths that moved in the layout keep importing for one release, with a warning;
the public names and the paths that became packages keep working without one."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

from hicache import _moved
from storage_backends._moved import new_name


def _fresh(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        monkeypatch.delitem(sys.modules, loaded)


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_an_old_path_warns_and_is_the_module_at_its_new_path(
    old: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    try:
        new = importlib.import_module(_moved.MOVED[old])
    except ModuleNotFoundError as exc:  # a third-party stack it loads only with stand-ins
        if (exc.name or "").split(".")[0] in {"hicache", "storage_backends"}:
            raise
        pytest.skip(f"{_moved.MOVED[old]} does not import on its own here: {exc}")
    _fresh(old, monkeypatch)
    with pytest.warns(DeprecationWarning, match=_moved.MOVED[old]):
        module = importlib.import_module(old)
    assert module is new
    assert module.__spec__ is not None and module.__spec__.name == new.__name__


def test_a_module_below_a_moved_package_is_not_loaded_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hicache.events.formats import sglang

    _fresh("hicache.event_formats", monkeypatch)
    with pytest.warns(DeprecationWarning):
        from hicache.event_formats.sglang import SglangFormat
    assert SglangFormat is sglang.SglangFormat


def test_public_names_and_paths_that_became_packages_need_no_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        from hicache import CacheConfig, HiRadixCache, InsertResult, MatchResult, extend_key
        from hicache.bench.sglang import Geometry
        from hicache.bench.storage import open_target
        from hicache.bench.tiering import TierReport, build_trace
        from hicache.cli import main
        from hicache.config import CacheConfig as config_cls
        from hicache.events import BlockStored
        from storage_backends.remote import RemoteBackend
    from hicache.bench.sglang.l3 import Geometry as geometry
    from hicache.bench.storage.targets import open_target as opener
    from hicache.bench.tiering.bench import build_trace as builder
    from hicache.bench.tiering.serving import TierReport as report
    from hicache.cache import HiRadixCache as cache_cls
    from hicache.cli.app import main as app_main
    from hicache.config.cache import CacheConfig as cache_config
    from hicache.events.kv import BlockStored as stored
    from hicache.tree.radix_tree import extend_key as extend
    from storage_backends.remote.client import RemoteBackend as client

    assert (HiRadixCache, main, CacheConfig, config_cls) == (
        cache_cls,
        app_main,
        *[cache_config] * 2,
    )
    assert (BlockStored, RemoteBackend, extend_key) == (stored, client, extend)
    assert (Geometry, open_target, TierReport, build_trace) == (geometry, opener, report, builder)
    assert MatchResult.__name__ == "MatchResult" and InsertResult.__name__ == "InsertResult"


def test_a_path_that_never_existed_still_fails() -> None:
    assert new_name("hicache.no_such_module", _moved.MOVED) is None
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("hicache.no_such_module")
