"""``hicache bench transfer`` at toy size on CPU (gpu_check.sh runs it on CUDA)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hicache.bench.transfer import bench


def test_transfer_bench_writes_one_result_per_direction_layout_and_page(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out = tmp_path / "t.json"
    argv = ["--device", "cpu", "--op-mb", "1", "--page-tokens", "1", "16", "--layers", "2"]
    args = parser.parse_args([*argv, "--repeat", "1", "--json", str(out)])
    assert bench.run(args) == 0
    rows = json.loads(out.read_text())
    keys = {(r["direction"], r["layout"], r["page_tokens"]) for r in rows}
    assert keys == {
        (d, lay, p)
        for d in ("d2h", "h2d")
        for lay in ("layer_first", "page_first")
        for p in (1, 16)
    }
    assert all(r["gbps"] > 0 and r["baseline_gbps"] > 0 and r["ratio"] > 0 for r in rows)
