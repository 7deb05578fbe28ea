"""Shared test set-up: GPU tests skip where CUDA is missing; no test writes
to the real per-user cache directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True)
def _private_user_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Point ``$XDG_CACHE_HOME`` (default stores) at a temporary directory."""
    cache = tmp_path_factory.mktemp("xdg-cache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
