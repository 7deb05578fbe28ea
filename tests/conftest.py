"""Shared test set-up: GPU tests skip where CUDA is missing; slow tests run
only in the slow lane (``make test-slow``, i.e. ``HICACHE_SLOW=1``); no test
writes to the real per-user cache directory; hypothesis profiles."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hypothesis import settings

# `make test` (CI) runs the "ci" profile: the same examples on every run, so a CI
# failure reproduces anywhere, and the failing example's blob printed to replay it
# with @reproduce_failure. Elsewhere ("dev", the default) each run draws new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("dev")


@pytest.fixture(autouse=True)
def _private_user_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Point ``$XDG_CACHE_HOME`` (default stores) at a temporary directory."""
    cache = tmp_path_factory.mktemp("xdg-cache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skips = {}
    if not torch.cuda.is_available():
        skips["gpu"] = pytest.mark.skip(reason="needs CUDA")
    if os.environ.get("HICACHE_SLOW") != "1":
        skips["slow"] = pytest.mark.skip(reason="slow lane: make test-slow")
    for item in items:
        for marker, skip in skips.items():
            if marker in item.keywords:
                item.add_marker(skip)


def pytest_report_header(config: pytest.Config) -> str:
    """Say which hot path the run tests: compiled (Cython) or pure Python."""
    from device_pool import native

    return f"hicache hot path: {native.describe()}"
