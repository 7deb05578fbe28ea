"""examples/subscribe_events.py, as the KV events page (docs/guide/events.md) shows
it, prints the events of a real cache; the page names the engine releases whose own
Structs decode them."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from hicache.cache import HiRadixCache
from hicache.config.cache import EventsConfig
from hicache.events.kv import ZmqEventPublisher
from tests.hicache.events.kv_event_peers import SGLANG, VLLM
from tests.hicache.helpers import serve, two_tier

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "subscribe_events.py"
EVENTS_PAGE = ROOT / "docs" / "guide" / "events.md"


def pinned() -> dict[str, str]:
    """package -> version, from requirements/engines.txt."""
    lines = (ROOT / "requirements" / "engines.txt").read_text().splitlines()
    return dict(line.split("==") for line in lines if "==" in line and not line.startswith("#"))


def site_hook() -> ModuleType:
    """docs/hooks/pages.py, which puts the example into the page when the site is built."""
    spec = importlib.util.spec_from_file_location(
        "docs_pages", ROOT / "docs" / "hooks" / "pages.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_events_page_shows_the_example_as_it_is() -> None:
    page = site_hook().expand(EVENTS_PAGE.read_text(), "guide/events.md")
    body = EXAMPLE.read_text().split('"""', 2)[2].strip()
    assert f"```python\n{body}\n```" in page
    assert len([line for line in body.splitlines() if line.strip()]) <= 14


@pytest.mark.parametrize("package", ["vllm", "sglang"])
def test_the_events_page_names_the_releases_the_tests_decode_with(package: str) -> None:
    version = pinned()[package]
    name = {"vllm": "vLLM", "sglang": "SGLang"}[package]
    assert f"{name} {version}" in EVENTS_PAGE.read_text()
    # tests/hicache/events/test_events.py decodes every batch with that release's own Structs.
    assert f"{package}=={version}" in (VLLM, SGLANG)


def test_the_example_prints_a_real_cache_s_events() -> None:
    base = two_tier(4, pages=16)
    cfg = replace(base.config, events=EventsConfig(endpoint="tcp://127.0.0.1:*"))
    base.close()
    cache = HiRadixCache(cfg)
    pub = cache.events
    assert isinstance(pub, ZmqEventPublisher)
    cmd = [sys.executable, str(EXAMPLE), pub.endpoint, "3"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert pub.wait_for_subscriber(30.0), "the example never subscribed"
        serve(cache, list(range(8)))  # batch 0: stored on device (and host, if backed up yet)
        cache.drain()  # stored on host, unless batch 0 said so already
        cache.evict(10**9)
        cache.poll()  # removed from device (demoted)
        cache.evict_host(10**9)
        cache.poll()  # removed from host
        assert pub.sequence >= 3
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        cache.close()
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert re.match(r"0 BlockStored GPU \[-?\d+, -?\d+\]$", lines[0]), out
    assert re.search(r"^[01] BlockStored CPU \[", out, re.M), out
    assert re.search(r"^[12] BlockRemoved GPU \[", out, re.M), out
