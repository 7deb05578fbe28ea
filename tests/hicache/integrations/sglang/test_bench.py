"""`hicache bench sglang` on a tiny geometry: every target reports figures (timings unchecked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hicache.bench.common.processes import ServerProcess
from hicache.bench.sglang import bench
from hicache.cli import main

TINY = bench.Geometry(pages=4, page_size=4, layers=2, heads=1, head_dim=8, layout="page_first")


@pytest.mark.parametrize(
    "target", [bench.BASELINE, "lmdb (in-process)", "disk (in-process)", "daemon"]
)
def test_each_target_reports_set_and_get(
    target: str, tmp_path: Path, shared_daemon: ServerProcess
) -> None:
    pid = shared_daemon.pid if target == "daemon" else 0
    one = bench._Target(target, TINY, tmp_path, shared_daemon.endpoint, pid)
    bench._run_targets([one], repeat=1)
    bench.close_storage(one.backend)
    expected = {(op, b) for op in ("set", "get") for b in bench.BATCHES}
    assert set(one.best) == set(one.best_cpu) == expected
    assert all(gbps > 0 for gbps in [*one.best.values(), *one.best_cpu.values()])


def test_bench_is_registered() -> None:
    from hicache.bench import BENCHMARKS, load

    assert BENCHMARKS["sglang"].module == "hicache.bench.sglang.bench"
    assert load("sglang") is bench


def test_a_dir_that_does_not_exist_is_made_and_left_empty(tmp_path: Path) -> None:
    scratch = tmp_path / "not" / "yet"
    argv = ["bench", "sglang", "--pages", "16", "--layers", "2", "--repeat", "1"]
    assert main([*argv, "--dir", str(scratch)]) == 0
    assert scratch.is_dir() and not any(scratch.iterdir())
