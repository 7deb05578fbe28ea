"""``hicache bench vllm`` at toy size: every row measured, ratios over vLLM's fs tier."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from hicache.bench.common.processes import daemon_setting
from hicache.cli import main
from storage_backends.store_kind import detect


def test_bench_vllm_reports_every_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rows.json"
    argv = ["bench", "vllm", "--chunk-kb", "4", "--chunks", "64", "--targets", "lmdb,disk"]
    argv += ["--repeat", "2"]  # rounds: one row per cell all the same, the best of them
    assert main([*argv, "--dir", str(tmp_path / "stores"), "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert len(rows) == 3 * 2 * 3
    assert {(r["target"], r["op"], r["per_job"]) for r in rows} == {
        (t, op, n) for t in ("fs", "lmdb", "disk") for op in ("store", "load") for n in (1, 8, 64)
    }
    assert all(r["gbps"] > 0 for r in rows)
    assert all(r["ratio"] == 1.0 for r in rows if r["target"] == "fs")
    assert "ratio = over vLLM's fs tier" in capsys.readouterr().out


@pytest.mark.parametrize("backend", ["lmdb", "disk"])
def test_daemon_set_reaches_the_daemon(tmp_path: Path, backend: str) -> None:
    """``--daemon-set store.backend=...``: the daemon's store is of that kind."""
    stores = tmp_path / "stores"
    argv = ["bench", "vllm", "--chunk-kb", "4", "--chunks", "64", "--targets", "daemon-ipc"]
    argv += ["--dir", str(stores), "--repeat", "1", "--daemon-set", f"store.backend={backend}"]
    assert main([*argv, "--daemon-set", "store.sync=none"]) == 0
    assert detect(stores / "daemon-ipc-store") == backend


@pytest.mark.parametrize("text", ["store.backend", "backend=disk", "store. x=1", "=1"])
def test_a_malformed_daemon_setting_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        daemon_setting(text)


def test_a_second_run_in_the_same_dir_starts_from_empty_stores(tmp_path: Path) -> None:
    """Stores an earlier run left under ``--dir`` hold the chunks already; the next run
    must not store into them (a store of chunks present measures nothing)."""
    stores = tmp_path / "stores"
    argv = ["bench", "vllm", "--chunk-kb", "4", "--chunks", "64", "--targets", "disk"]
    argv += ["--dir", str(stores), "--repeat", "1"]
    assert main(argv) == 0
    planted = stores / "disk" / "left-by-an-earlier-run"
    planted.write_bytes(b"x")
    assert main(argv) == 0
    assert not planted.exists()
