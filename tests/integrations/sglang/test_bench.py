"""`hicache bench sglang` on a tiny geometry: every target reports figures (timings unchecked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hicache.bench import sglang as bench
from hicache.bench.processes import ServerProcess

TINY = bench.Geometry(pages=4, page_size=4, layers=2, heads=1, head_dim=8, layout="page_first")


@pytest.mark.parametrize("target", [bench.BASELINE, "lmdb (in-process)", "daemon"])
def test_each_target_reports_set_and_get(
    target: str, tmp_path: Path, shared_daemon: ServerProcess
) -> None:
    figures = bench._run_target(target, TINY, tmp_path, shared_daemon.endpoint, repeat=1)
    assert set(figures) == {(op, b) for op in ("set", "get") for b in bench.BATCHES}
    assert all(gbps > 0 for gbps in figures.values())


def test_bench_is_registered() -> None:
    from hicache.bench import BENCHMARKS, load

    assert BENCHMARKS["sglang"].module == "hicache.bench.sglang"
    assert load("sglang") is bench
