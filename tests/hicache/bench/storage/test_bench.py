"""``hicache bench storage``: every page size, both ops, against the baseline of the same run."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from redis.cluster import RedisCluster

from hicache.cli import main
from storage_backends.mooncake.local import MooncakeUnavailableError, mooncake_binaries
from storage_backends.redis.backend import parse_endpoint
from storage_backends.redis.cluster import ClusterOptions, LocalRedisCluster, redis_server_binary


@pytest.mark.parametrize("backend", ["lmdb", "redis", "mooncake"])
def test_storage_bench_reports_every_page_size(tmp_path: Path, backend: str) -> None:
    if backend == "redis" and redis_server_binary() is None:
        pytest.skip("redis-server is not installed (`make test` installs Debian's redis-server)")
    if backend == "mooncake":
        try:
            mooncake_binaries()
        except MooncakeUnavailableError as exc:
            pytest.skip(f"optional mooncake backend: {exc}")
    out = tmp_path / "storage.json"
    argv = ["bench", "storage", "--backend", backend, "--total-mb", "4", "--batch-mb", "1"]
    argv += ["--repeat", "1", "--no-sync", "--dir", str(tmp_path), "--json", str(out)]
    assert main([*argv, "--redis-masters", "1"]) == 0
    rows = json.loads(out.read_text())
    assert [(r["op"], r["page_bytes"]) for r in rows] == [
        (op, size) for size in (64 << 10, 512 << 10, 2 << 20) for op in ("put", "get")
    ]
    assert all(r["backend"] == backend and r["gbps"] > 0 and r["baseline_gbps"] > 0 for r in rows)
    assert list(tmp_path.iterdir()) == [out]  # the scratch store and any cluster are gone


def test_tiering_bench_runs_its_storage_row_on_redis(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed (`make test` installs Debian's redis-server)")
    from tests.hicache.bench.test_benches import SMALL

    cfg = tmp_path / "small.toml"
    cfg.write_text(SMALL)
    out = tmp_path / "out"
    with LocalRedisCluster(ClusterOptions(masters=3)) as cluster:
        argv = ["bench", "tiering", "--config", str(cfg), "--clients", "8", "--rounds", "3"]
        argv += ["--set", "storage.backend=redis", "--set", f"storage.endpoint={cluster.endpoint}"]
        fleet = RedisCluster(startup_nodes=parse_endpoint(cluster.endpoint))
        fleet.set("hicache:someone-else", b"kept")  # a fleet's key under the default prefix
        fleet.close()
        assert main([*argv, "--out", str(out)]) == 0
        clients = [cluster.client(i) for i in range(len(cluster.nodes))]
        left = [k for c in clients for k in c.scan_iter(count=1000)]
        for client in clients:
            client.close()
    printed = capsys.readouterr().out
    assert "+ storage (redis at redis://" in printed
    pattern = r"removed the bench's ([\d,]+) keys under '(hicache-[^']+):\*'"
    (removed,) = re.findall(pattern, printed)
    by = {c["name"]: c for c in json.loads((out / "tiering.json").read_text())["configs"]}
    assert by["device+host+storage"]["peak_bytes"]["storage"] > 0  # the pages went to the cluster
    assert by["device+host+storage"]["hit_rate"] >= by["device"]["hit_rate"]
    assert int(removed[0].replace(",", "")) > 0
    assert left == [b"hicache:someone-else"]  # the bench's keys are gone, nobody else's


def test_the_store_measured_by_default_is_the_default_store(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "storage", "--help"])
    assert exit_info.value.code == 0
    assert re.search(r"\(default:\s+disk\)", capsys.readouterr().out)


def test_disk_grid_reports_every_side_and_says_whether_reads_were_cold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "disk.json"
    argv = ["bench", "storage", "--backend", "disk", "--cell-mb", "1", "--pages-kb", "64,256"]
    argv += ["--batches", "4,64", "--threads", "2", "--repeat", "2", "--dir", str(tmp_path)]
    with caplog.at_level(logging.INFO):
        assert main([*argv, "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    cells = [(r["page_bytes"], r["batch"], r["threads"]) for r in rows[::3]]
    assert cells == [(64 << 10, 4, 2), (64 << 10, 16, 2), (256 << 10, 4, 2)]  # 1 MiB a cell
    assert [r["op"] for r in rows] == ["put", "get cold", "get warm"] * 3
    sides = {"disk", "raw", "raw+xxh3", "lmdb", "file-per-page"}
    assert all(set(r["gbps"]) == sides and min(r["gbps"].values()) > 0 for r in rows)
    assert all(set(r["ratio"]) == set(r["cpu_ratio"]) == sides - {"disk"} for r in rows)
    printed = capsys.readouterr().out
    for r in rows[1::3]:  # the cold reads say whether the page cache was dropped
        assert isinstance(r["page_cache_dropped"], bool)
    assert ("NOT dropped" in printed) == (not all(r["page_cache_dropped"] for r in rows[1::3]))
    assert "targets (wall):" in printed
    assert list(tmp_path.iterdir()) == [out]
    # The grid opens 12 stores (3 cells x 2 rounds x disk and lmdb), each twice (fresh,
    # then clean for the cold reads): routine opens log nothing at INFO, so the bench's
    # output is not one line per store it opened.
    lines = [r for r in caplog.records if r.name.startswith("storage_backends")]
    assert len(lines) <= 2, [r.getMessage() for r in lines]


def test_storage_open_bench_opens_each_size_in_a_fresh_process(tmp_path: Path) -> None:
    out = tmp_path / "open.json"
    argv = ["bench", "storage-open", "--backends", "disk", "--sizes", "20,40", "--repeat", "1"]
    assert main([*argv, "--dir", str(tmp_path), "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["backend"], r["pages"]) for r in rows] == [("disk", 20), ("disk", 40)]
    assert all(r["cold_open_s"] > 0 and r["index_bytes_per_page"] > 0 for r in rows)
    assert all(r["rss_open_mib"] > 0 for r in rows)
    assert all(r["fill_pages_per_s"] > 0 and r["unclean_open_s"] is None for r in rows)
    assert list(tmp_path.iterdir()) == [out]


def test_storage_open_bench_times_the_open_after_a_killed_holder(tmp_path: Path) -> None:
    out = tmp_path / "open.json"
    argv = ["bench", "storage-open", "--backends", "disk,lmdb", "--sizes", "20", "--repeat", "1"]
    argv += ["--unclean", "--fill-batch", "7", "--dir", str(tmp_path), "--json", str(out)]
    assert main(argv) == 0
    rows = json.loads(out.read_text())
    assert [(r["backend"], r["pages"]) for r in rows] == [("disk", 20), ("lmdb", 20)]
    assert all(r["unclean_open_s"] > 0 for r in rows)  # every page still served after it
