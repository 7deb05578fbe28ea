from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import hicache
from hicache.bench.common.workloads import (
    FewShotSpec,
    LongDocSpec,
    MultiTurnSpec,
    fewshot,
    longdoc,
    multiturn,
)
from hicache.bench.tiering import bench as tiering
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
num_tokens = 4096
[host]
ratio = 2.0
reserve_gb = 0.0
[storage]
backend = "lmdb"
path = "unused"
max_bytes = 268435456
"""


def test_workloads_are_seeded_and_share_prefixes() -> None:
    a = list(multiturn(MultiTurnSpec(conversations=4, turns=3, seed=1)))
    b = list(multiturn(MultiTurnSpec(conversations=4, turns=3, seed=1)))
    assert a == b and len(a) == 12
    by_conv = [r for r in a if r.conversation == 0]
    for prev, nxt in itertools.pairwise(by_conv):
        assert nxt.tokens[: len(prev.tokens)] == prev.tokens  # each turn extends the last
    docs = list(longdoc(LongDocSpec(documents=2, questions=3, document_tokens=(100, 200))))
    assert len(docs) == 6
    shots = list(fewshot(FewShotSpec(prefixes=2, queries=2, prefix_tokens=(50, 60))))
    assert len(shots) == 4


def _tiering(tmp_path: Path, out: str, *extra: str) -> dict[str, Any]:
    cfg = tmp_path / "small.toml"
    cfg.write_text(SMALL)
    argv = ["bench", "tiering", "--config", str(cfg), "--clients", "8", "--rounds", "3"]
    assert main([*argv, "--out", str(tmp_path / out), *extra]) == 0
    report: dict[str, Any] = json.loads((tmp_path / out / "tiering.json").read_text())
    return report


def test_tiering_bench_reports_every_tier(tmp_path: Path) -> None:
    report = _tiering(tmp_path, "out")
    names = [c["name"] for c in report["configs"]]
    assert names == ["no cache", "device", "device+host", "device+host+storage"]
    by = {c["name"]: c for c in report["configs"]}
    assert by["no cache"]["hit_rate"] == 0
    assert by["device+host+storage"]["hit_rate"] >= by["device"]["hit_rate"]
    assert by["device+host+storage"]["hit_rate_by_tier"]["storage"] > 0
    assert by["device+host"]["bytes_moved"]["d2h"] > 0
    assert (tmp_path / "out" / "tiering.png").stat().st_size > 0
    assert report["seed"] == 0 and report["config"]["device"]["num_tokens"] == 4096
    assert report["provenance"]["hicache_version"] == hicache.__version__
    assert "git_commit" in report["provenance"]


def _figures(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in c.items() if k != "cache_ms_per_request"} for c in report["configs"]]


def test_tiering_bench_is_reproducible(tmp_path: Path) -> None:
    first = _tiering(tmp_path, "a", "--seed", "3")
    second = _tiering(tmp_path, "b", "--seed", "3")
    assert _figures(first) == _figures(second)
    other = _tiering(tmp_path, "c", "--seed", "4")
    assert _figures(other) != _figures(first)  # the seed does change the trace


@pytest.mark.parametrize("backend", ["memory", "file"])
def test_tiering_bench_uses_the_configured_backend(tmp_path: Path, backend: str) -> None:
    report = _tiering(tmp_path, "out", "--set", f"storage.backend={backend}")
    assert report["config"]["storage"]["backend"] == backend
    full = report["configs"][-1]
    assert full["hit_rate_by_tier"]["storage"] > 0


def test_tiering_bench_on_a_device_only_config(tmp_path: Path) -> None:
    argv = ["--set", "host.enabled=false", "--set", "storage.backend=none"]
    report = _tiering(tmp_path, "out", *argv)
    assert report["configs"][-1]["hit_rate_by_tier"]["storage"] > 0


def test_tiering_gain_is_none_against_a_zero_base(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Four long documents asked in shuffled order: each evicts the last from
    # the device before it is asked again, so the device tier alone never hits.
    argv = ["--workload", "longdoc", "--clients", "4", "--set", "device.num_tokens=16384"]
    report = _tiering(tmp_path, "out", *argv)
    assert report["configs"][1]["hit_rate"] == 0
    assert report["configs"][-1]["hit_rate"] > 0
    assert report["gain_vs_device"] is None
    assert "n/a" in capsys.readouterr().out
    assert tiering.ratio(0.5, 0.0) is None and tiering.ratio(0.5, 0.25) == 2.0


def test_tree_bench_json(tmp_path: Path) -> None:
    cfg = tmp_path / "small.toml"
    cfg.write_text(SMALL)
    out = tmp_path / "tree.json"
    argv = [
        "bench",
        "tree",
        "--config",
        str(cfg),
        "--conversations",
        "10",
        "--turns",
        "3",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    assert {"page_size", "ops", "seconds", "us_per_op", "hit_tokens"} <= set(data)
    assert data["ops"] > 0 and data["hit_tokens"] > 0


def test_bad_config_is_a_clear_error(tmp_path: Path, capsys: object) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[device]\npage_size = -1\n")
    assert main(["bench", "tree", "--config", str(cfg)]) == 2


@pytest.mark.parametrize("name", ["default", "device-only"])
def test_shipped_configs_run_the_main_job(tmp_path: Path, name: str) -> None:
    argv = ["bench", "tiering", "--config", name, "--clients", "2", "--rounds", "2"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "tiering.json").read_text())
    assert report["configs"][-1]["hit_rate"] > 0


def test_tree_bench_against_sglang(tmp_path: Path) -> None:
    """hicache and SGLang's trees on one trace, alternating: equal hit rates;
    without SGLang the peer side is skipped with a message, hicache still runs."""
    cfg = tmp_path / "small.toml"
    cfg.write_text(SMALL)
    out = tmp_path / "against.json"
    argv = ["bench", "tree", "--config", str(cfg), "--against", "sglang", "--page-sizes", "1,16"]
    argv += ["--conversations", "6", "--turns", "3", "--repeat", "2", "--json", str(out)]
    # Its own process, as from the command line: stand-ins that other tests
    # leave in sys.modules (vLLM's grammar engines) would reach SGLang's imports.
    code = f"from hicache.cli import main; raise SystemExit(main({argv!r}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.read_text())
    sides = {(s["side"], s["page_size"]): s for s in data["sides"]}
    assert {("hicache", 1), ("hicache", 16)} <= set(sides)
    for (_, ps), s in sides.items():
        assert len(s["us_per_request"]) == 2 and s["best_us"] > 0
        assert abs(s["hit_rate"] - sides[("hicache", ps)]["hit_rate"]) <= 0.005
    assert sides[("hicache", 16)]["hit_rate"] > 0
    if len(sides) == 2:
        assert "skipping the SGLang side" in done.stderr
    else:
        assert {("sglang-radix", 16), ("sglang-unified-rust", 16)} <= set(sides)
