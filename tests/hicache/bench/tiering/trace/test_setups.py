"""Tier sizes in tokens, the sweep's set-ups, the model geometry and the window rates."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from hicache.bench.tiering import stores
from hicache.bench.tiering.trace.models import MODEL_PRESETS, parse_model, replay_bytes_per_token
from hicache.bench.tiering.trace.rates import link_rate, per_window
from hicache.bench.tiering.trace.setups import (
    TierSizes,
    build_setup,
    check_sizes,
    human_tokens,
    parse_token_list,
    sweep,
)
from hicache.cache import HiRadixCache
from hicache.config.cache import CacheConfig, DeviceConfig
from storage_backends import StorageConfig
from storage_backends.page_format import HEADER_BYTES


def test_token_lists() -> None:
    assert parse_token_list("1M,3M", "--x") == (1_000_000, 3_000_000)
    assert parse_token_list("500k, 2.5M,7", "--x") == (500_000, 2_500_000, 7)
    assert parse_token_list("none", "--x", allow_none=True) == ()
    for bad in ("none", "1T", "-1", "0", "1M,,2M", "a"):
        with pytest.raises(ValueError, match="--x"):
            parse_token_list(bad, "--x")
    assert [human_tokens(n) for n in (10**6, 2_500_000, 500_000, 999_936)] == [
        "1M",
        "2.5M",
        "500k",
        "999,936",
    ]


def test_the_sweep_and_its_checks() -> None:
    sizes = sweep((1000,), (3000,), (10_000, 50_000), 512)
    assert [s.label for s in sizes] == [
        "device 1k",
        "device 1k + host 3k",
        "device 1k + host 3k + storage 10k",
        "device 1k + host 3k + storage 50k",
    ]
    assert sizes[0].tokens("device") == 512 and sizes[-1].tokens("storage") == 49_664
    assert len(sweep((1000, 2000), (), (10_000,), 512)) == 2  # no host: no storage rows
    check_sizes(sizes, longest_prompt=512)
    with pytest.raises(ValueError, match="longest prompt"):
        check_sizes(sizes, longest_prompt=513)
    with pytest.raises(ValueError, match="under one page"):
        check_sizes([TierSizes(1024, 100, 0, 512)], longest_prompt=1)


@pytest.mark.parametrize("backend", ["disk", "lmdb", "memory"])
def test_each_tier_holds_exactly_the_tokens_asked(tmp_path: Path, backend: str) -> None:
    base = CacheConfig(
        device=DeviceConfig(device="cpu"), storage=StorageConfig(backend=backend, path="x")
    )
    # (5632, 999_936): device × (host / device) is a hair under host in floating point
    for device, host in ((1_000_000, 3_000_000), (5632, 999_936), (999_999, 333_333)):
        sizes = TierSizes(device, host, 10_000_000, 512)
        setup = build_setup(base, sizes, tmp_path / "store")
        page = 512 * replay_bytes_per_token()
        assert setup.config.storage.backend == backend  # the store the config names
        assert setup.config.storage.max_bytes == (10_000_000 // 512) * (HEADER_BYTES + page)
        if backend != "memory":
            assert setup.config.storage.path == str(tmp_path / "store")  # a fresh directory
        dry = replace(setup.config, storage=StorageConfig())
        with HiRadixCache(dry) as cache:
            assert cache.device_pool.allocator.capacity == sizes.tokens("device")
            assert cache.host_pool is not None
            assert cache.host_pool.allocator.capacity == sizes.tokens("host")


def test_a_network_store_cannot_be_sized_from_here(tmp_path: Path) -> None:
    remote = CacheConfig(storage=StorageConfig(backend="remote", endpoint="tcp://127.0.0.1:1"))
    with pytest.raises(ValueError, match="capacity its server sets"):
        build_setup(remote, TierSizes(1024, 2048, 4096, 512), tmp_path)
    build_setup(remote, TierSizes(1024, 2048, 0, 512), tmp_path)  # no storage row: fine


@pytest.mark.parametrize("backend", ["disk", "lmdb", "file"])
def test_the_tiering_bench_gives_a_path_store_a_fresh_directory(
    tmp_path: Path, backend: str
) -> None:
    config = CacheConfig(storage=StorageConfig(backend=backend))  # path "": the user's cache dir
    assert stores.storage_setup(config, tmp_path / "s").path == str(tmp_path / "s")


def test_models() -> None:
    assert MODEL_PRESETS["llama3-8b"].bytes_per_token == 131_072
    assert MODEL_PRESETS["llama3-70b"].bytes_per_token == 327_680
    assert parse_model("80/8/128/bfloat16").bytes_per_token == 327_680
    assert parse_model("2/1/8/fp8").bytes_per_token == 32
    for bad in ("llama", "80/8/128", "80/8/128/int3", "0/8/128/float16"):
        with pytest.raises(ValueError, match="--model"):
            parse_model(bad)


def test_window_rates_by_hand() -> None:
    windows = np.array([0, 0, 1, 1, 3])  # window 2 is empty and still counts
    tokens = np.array([10, 20, 0, 5, 40])
    assert per_window(tokens, windows).tolist() == [30, 5, 0, 40]
    r = link_rate(tokens, windows, 2.0, 1_000_000_000)  # 1 GB a token, 2-s windows
    assert r.mean == pytest.approx(75 / 4 / 2) and r.peak == 20
    assert r.p99 == pytest.approx(np.percentile([15, 2.5, 0, 20], 99))
