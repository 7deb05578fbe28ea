"""``hicache bench daemon`` and ``hicache bench tiering --engines 2`` end to end (small sizes).

Figures are not asserted (they depend on the machine); the shapes of the
reports are, and so is the one property the sharing bench exists to show:
through one daemon, an engine reuses the prefixes the other computed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hicache.bench.daemon.bench import FAIRNESS_TRANSPORTS, SHORT, TRANSPORTS
from hicache.bench.tiering.bench import build_trace
from hicache.bench.tiering.sharing import split
from hicache.cli import main

SMALL = """
[model]
num_layers = 2
kv_heads = 1
head_dim = 8
dtype = "float32"
[device]
device = "cpu"
page_size = 16
num_tokens = 16384
[host]
ratio = 2.0
reserve_gb = 0.0
[policy]
prefetch_threshold = 16
[storage]
backend = "lmdb"
path = "unused"
max_bytes = 268435456
"""

ROW_KEYS = {
    "op",
    "transport",
    "clients",
    "page_bytes",
    "pages",
    "gbps",
    "baseline_gbps",
    "ratio",
    "cpu_ratio",
    "p50_us",
    "p99_us",
    "puts_per_commit",
}


def test_daemon_bench_reports_every_op_shape_transport_and_client_count(tmp_path: Path) -> None:
    out = tmp_path / "daemon.json"
    argv = ["bench", "daemon", "--clients", "1,2", "--mib", "2", "--repeat", "1"]
    argv += ["--exists-calls", "5", "--fairness-mib", "4", "--json", str(out)]
    assert main(argv) == 0  # 1: pages lost
    report = json.loads(out.read_text())
    rows = report["cells"]
    assert all(set(row) == ROW_KEYS for row in rows)
    probes = {(r["transport"], r["probe"], r["load"]) for r in report["fairness"]}
    loads = ("quiet", "bulk GETs", "bulk PUTs")
    assert probes == {
        (t, p, load) for t in FAIRNESS_TRANSPORTS for p in ("GET 1 page", "PING") for load in loads
    }
    assert all(0 < r["p50_us"] <= r["p99_us"] and r["samples"] > 0 for r in report["fairness"])
    cells = {(r["op"], r["transport"], r["clients"], r["page_bytes"], r["pages"]) for r in rows}
    expected = {
        (op, t, c, size, pages)
        for op in ("PUT", "GET", "EXISTS")
        for t in TRANSPORTS
        for c in (1, 2)
        for size, pages in SHORT
    }
    assert cells == expected
    for row in rows:
        moved = row["op"] != "EXISTS"
        assert (row["gbps"] > 0 and row["baseline_gbps"] > 0) == moved
        assert row["ratio"] > 0 and row["cpu_ratio"] > 0 and 0 < row["p50_us"] <= row["p99_us"]
        assert (row["puts_per_commit"] >= 1) == (row["op"] == "PUT")


def test_two_engines_reuse_each_other_only_through_the_daemon(tmp_path: Path) -> None:
    cfg = tmp_path / "small.toml"
    cfg.write_text(SMALL)
    out = tmp_path / "out"
    argv = ["bench", "tiering", "--config", str(cfg), "--engines", "2", "--clients", "16"]
    assert main([*argv, "--rounds", "1", "--out", str(out)]) == 0
    own, shared = json.loads((out / "tiering.json").read_text())["engines"]
    assert own["name"] == "2 engines, own LMDB each"
    assert shared["name"] == "2 engines, shared daemon"
    assert shared["hit_rate"] > own["hit_rate"]
    # Engine 0 starts alone in both runs; engine 1 gains from engine 0's system prompts.
    assert shared["hit_rate_by_engine"][1] > own["hit_rate_by_engine"][1]
    assert shared["hit_rate_by_tier"]["storage"] > 0


def test_split_gives_each_engine_half_the_clients_and_every_system_prompt() -> None:
    trace = build_trace("multiturn", 32, 2, 0)
    halves = split(trace, "multiturn", 8)
    convs = [{r.conversation for r in half} for half in halves]
    assert len(convs[0]) == len(convs[1]) == 16 and not convs[0] & convs[1]
    assert all({c % 8 for c in half} == set(range(8)) for half in convs)
    assert sorted(map(id, halves[0] + halves[1])) == sorted(map(id, trace))
    with pytest.raises(ValueError, match="at least 16"):
        split(build_trace("multiturn", 8, 1, 0), "multiturn", 8)
