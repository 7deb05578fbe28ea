"""``hicache bench engine --sweep`` at toy sizes: every policy at each bandwidth,
the table's verdicts, the JSON and the PNG."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from hicache.bench.engine import bench, sweep
from hicache.bench.engine.sweep import POLICIES, RECOMPUTE, Cell, verdicts
from hicache.config.cache import CacheConfig
from tests.hicache.engine.test_cli_bench import DEFAULT, SMALL


def test_the_sweep_runs_every_policy_at_every_bandwidth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sweep, "DECISION_ROUNDS", 20)
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    # Hidden 256: a hit saves ~8 ms of recompute, so the break-even bandwidth (~30 MB/s)
    # sits far from both cells. At hidden 64 a hit saved ~0.5 ms, which the machine's
    # noise could cancel: the break-even moved from 150 MB/s to past the fast cell, and
    # cost then rightly recomputed there.
    argv = ["--sweep", "--prefix-tokens", "64", "--suffix-tokens", "8", "--hidden", "256"]
    argv += ["--vocab", "256", "--repeat", "1", "--warmup", "1", "--bandwidths", "0.5,500"]
    argv += ["--json", str(tmp_path / "s.json"), "--png", str(tmp_path / "s.png")]
    args = parser.parse_args(argv)
    args.config = CacheConfig.from_toml(DEFAULT, SMALL)
    assert bench.run(args) == 0
    doc = json.loads((tmp_path / "s.json").read_text())
    assert [r["mb_per_s"] for r in doc["rows"]] == [0.5, 500.0]
    for row in doc["rows"]:
        assert set(row["ttft_ms"]) == {*POLICIES, RECOMPUTE}
        assert min(row["ratio_to_best"]["wait_complete"], row["ratio_to_best"][RECOMPUTE]) == 1.0
    slow, fast = doc["rows"]
    # 256 KiB of KV at 0.5 MB/s: 0.5 s to load (at least the 0.13 s of 64 KiB checked
    # here), a few ms to recompute.
    assert slow["ttft_ms"]["wait_complete"] >= 0.9 * 65536 / 0.5e6 * 1e3
    assert slow["storage_tokens_cost"] == [0] and fast["storage_tokens_cost"] == [64]
    assert doc["per_request_us"]["match_prefix_us"] > 0 and doc["per_request_us"]["decision_us"] > 0
    assert (tmp_path / "s.png").stat().st_size > 10_000


def test_verdicts_compare_each_policy_with_the_better_fixed_choice() -> None:
    loaded = {"wait_complete": (64,), "timeout": (64,), "best_effort": (0,), RECOMPUTE: (0,)}
    cells = [
        Cell(p, 1.0, (ms,), loaded.get(p, (0,)))
        for p, ms in (("best_effort", 90), ("timeout", 300), ("wait_complete", 400),
                      ("cost", 105), (RECOMPUTE, 100))
    ]  # fmt: skip
    (row,) = verdicts(cells)
    assert row["better_fixed"] == "recompute" and row["cost_same_choice"] == 1.0
    assert row["ratio_to_best"] == {
        "best_effort": 0.9, "timeout": 3.0, "wait_complete": 4.0, "cost": 1.05, RECOMPUTE: 1.0
    }  # fmt: skip
    assert row["cost_meets_target"]
    (worse,) = verdicts([c._replace(ttft_ms=(120,)) if c.policy == "cost" else c for c in cells])
    assert not worse["cost_meets_target"]
    mixed = [c for c in cells if c.policy != "cost"] + [Cell("cost", 1.0, (105,), (64, 16, 0, 40))]
    (row,) = verdicts(mixed)
    assert row["cost_same_choice"] == 0.5  # 16 and 0 recomputed (most of) the prefix
