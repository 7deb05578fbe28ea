"""``hicache bench storage``: every page size, both ops, against the baseline of the same run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hicache.cli import main
from storage_backends.mooncake_local import MooncakeUnavailableError, mooncake_binaries
from storage_backends.redis_cluster import ClusterOptions, LocalRedisCluster, redis_server_binary


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
    from tests.bench.test_benches import SMALL

    cfg = tmp_path / "small.toml"
    cfg.write_text(SMALL)
    out = tmp_path / "out"
    with LocalRedisCluster(ClusterOptions(masters=3)) as cluster:
        argv = ["bench", "tiering", "--config", str(cfg), "--clients", "8", "--rounds", "3"]
        argv += ["--set", "storage.backend=redis", "--set", f"storage.endpoint={cluster.endpoint}"]
        assert main([*argv, "--out", str(out)]) == 0
        clients = [cluster.client(i) for i in range(len(cluster.nodes))]
        stored = sum(int(client.dbsize()) for client in clients)
        for client in clients:
            client.close()
    assert "+ storage (redis at redis://" in capsys.readouterr().out
    by = {c["name"]: c for c in json.loads((out / "tiering.json").read_text())["configs"]}
    assert by["device+host+storage"]["peak_bytes"]["storage"] > 0
    assert by["device+host+storage"]["hit_rate"] >= by["device"]["hit_rate"]
    assert stored > 0  # the pages went to the cluster
