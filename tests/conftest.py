"""Shared test set-up: GPU tests skip where CUDA is missing; slow tests run
only in the slow lane (``make test-slow``, i.e. ``HICACHE_SLOW=1``)."""

from __future__ import annotations

import os

import pytest
import torch


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
