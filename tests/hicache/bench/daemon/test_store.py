"""``hicache bench daemon-store`` end to end (small sizes): one row per store and op, ratios
against the first store. Figures are not asserted (they depend on the machine)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from hicache.bench.daemon.store import StoreKind, store_kinds
from hicache.cli import main


def test_the_bench_reports_each_store_and_op_against_the_first(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    argv = ["bench", "daemon-store", "--stores", "lmdb:full,disk:index", "--mib", "1"]
    assert (
        main([*argv, "--page-kib", "64", "--batch", "4", "--repeat", "2", "--json", str(out)]) == 0
    )
    rows = json.loads(out.read_text())
    assert [(r["store"], r["op"]) for r in rows] == [
        ("lmdb:full", "PUT"),
        ("lmdb:full", "GET"),
        ("disk:index", "PUT"),
        ("disk:index", "GET"),
    ]
    assert all(r["ratio"] == 1.0 for r in rows[:2])
    assert all(r["gbps"] > 0 and r["ratio"] > 0 and r["cpu_s_per_gib"] >= 0 for r in rows)


def test_stores_are_backend_and_sync_pairs() -> None:
    assert store_kinds("disk:none, lmdb:full") == [
        StoreKind("disk", "none"),
        StoreKind("lmdb", "full"),
    ]
    for bad in ("disk", "redis:full", "disk:always", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            store_kinds(bad)
