from __future__ import annotations

import itertools
import json
from pathlib import Path

from hicache.bench.workloads import (
    FewShotSpec,
    LongDocSpec,
    MultiTurnSpec,
    fewshot,
    longdoc,
    multiturn,
)
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


def test_tiering_bench_reports_every_tier(tmp_path: Path) -> None:
    cfg = tmp_path / "small.toml"
    cfg.write_text(SMALL)
    out = tmp_path / "out"
    argv = [
        "bench",
        "tiering",
        "--config",
        str(cfg),
        "--clients",
        "8",
        "--rounds",
        "3",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    report = json.loads((out / "tiering.json").read_text())
    names = [c["name"] for c in report["configs"]]
    assert names == ["no cache", "device", "device+host", "device+host+storage"]
    by = {c["name"]: c for c in report["configs"]}
    assert by["no cache"]["hit_rate"] == 0
    assert by["device+host+storage"]["hit_rate"] >= by["device"]["hit_rate"]
    assert by["device+host+storage"]["hit_rate_by_tier"]["storage"] > 0
    assert by["device+host"]["bytes_moved"]["d2h"] > 0
    assert (out / "tiering.png").stat().st_size > 0


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
