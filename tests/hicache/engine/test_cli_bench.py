"""``python -m hicache.engine`` and the engine benchmark, at toy sizes."""

from __future__ import annotations

import argparse
import json
import logging
import random
import socket
from pathlib import Path
from types import MappingProxyType

import pytest

from hicache.bench.engine import bench
from hicache.config.cache import CacheConfig
from hicache.engine.__main__ import main

DEFAULT = Path(__file__).resolve().parents[3] / "configs" / "default.toml"
SMALL = MappingProxyType(
    {
        "model.num_layers": 2,
        "model.dtype": "float32",
        "device.device": "cpu",
        "device.num_tokens": 2048,
        "host.reserve_gb": 0.0,
        "policy.prefetch_policy": "wait_complete",
    }
)


def table_rows(text: str) -> list[list[int]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == ["turn"])
    return [[int(float(v)) for v in line.split()] for line in lines[start + 1 :]]


def test_cli_chat_walks_down_the_tiers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sets = [f"{k}={v}" for k, v in SMALL.items()] + [f"storage.path={tmp_path / 'store'}"]
    argv = ["--config", str(DEFAULT), "--turns", "4", "--turn-tokens", "40", "--hidden", "64"]
    argv += ["--vocab", "128", "--max-new-tokens", "3"]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 0
    out = capsys.readouterr()
    rows = table_rows(out.out)
    assert [r[0] for r in rows] == [1, 2, 3, 4]
    assert "s2h " in out.err and "prefill <=" in out.err  # the rates it measured
    device, host, storage = (tuple(r[i] for r in rows) for i in (2, 3, 4))
    assert device[1] > 0 and host[2] > 0 and storage[3] > 0
    assert device[0] == host[0] == storage[0] == 0


def test_cli_reports_bad_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", str(DEFAULT), "--set", "device.page_size=0"]) == 2
    assert "page_size" in capsys.readouterr().err


def test_engine_bench_reuses_each_tier_and_writes_json(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    sizes = ["--prefix-tokens", "128", "--suffix-tokens", "8", "--hidden", "64", "--vocab", "256"]
    out = ["--repeat", "2", "--dir", str(tmp_path), "--json", str(tmp_path / "out.json")]
    args = parser.parse_args([*sizes, *out])
    args.config = CacheConfig.from_toml(DEFAULT, SMALL)
    assert bench.run(args) == 0
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["rounds"] == 2
    assert set(doc["ttft_ms"]) == set(bench.CASES)
    assert all(0 < v["p50"] <= v["p90"] for v in doc["ttft_ms"].values())
    assert doc["suffix_compute_ms"] == doc["ttft_ms"]["device"]
    assert set(doc["tier_cost_ms"]) == {"host", "storage", "storage_cold"}
    assert set(doc["probe_ms_per_1k_tokens"]) == {"load_back", "prefetch", "prefetch_cold"}
    assert all(v["p50"] > 0 for v in doc["probe_ms_per_1k_tokens"].values())
    cold = doc["cold_store"]
    assert cold["drops"] == 4 and cold["store_bytes"] > 0
    assert isinstance(cold["page_cache_dropped"], bool)
    assert doc["hits_last_round"]["storage_cold"] == [0, 0, 128]
    assert doc["speedup_host"] > 0 and doc["speedup_storage"] > 0
    assert not list(tmp_path.glob("hicache-bench-*")), "the scratch store was not removed"


def test_engine_bench_mla_variant(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    argv = ["--prefix-tokens", "64", "--suffix-tokens", "8", "--hidden", "64", "--vocab", "256"]
    argv += ["--attention", "mla", "--kv-lora-rank", "32", "--rope-dim", "8", "--repeat", "1"]
    args = parser.parse_args([*argv, "--dir", str(tmp_path), "--json", str(tmp_path / "o.json")])
    args.config = CacheConfig.from_toml(DEFAULT, SMALL)
    assert bench.run(args) == 0
    doc = json.loads((tmp_path / "o.json").read_text())
    assert doc["hits_last_round"]["host"] == [0, 64, 0]


def test_engine_bench_round_hits_the_intended_tier_and_times_probes(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--prefix-tokens", "128", "--suffix-tokens", "8"])
    args.hidden, args.vocab = 64, 256
    config = bench.bench_config(CacheConfig.from_toml(DEFAULT, SMALL), tmp_path / "s", 1024)
    runner = bench.Runner(config, args)
    try:
        result = runner.round(random.Random(0))
        runner.engine.cache.check_integrity()
    finally:
        runner.close()
    assert [p.kind for p in result.probes] == list(bench.PROBES)
    assert all(p.tokens == 128 and p.ms > 0 for p in result.probes)
    hits = {s.case: (s.hits.device, s.hits.host, s.hits.storage) for s in result.samples}
    assert hits == {
        "recompute": (0, 0, 0),
        "device": (128, 0, 0),
        "host": (0, 128, 0),
        "storage": (0, 0, 128),
        "storage_cold": (0, 0, 128),
    }
    assert len(result.drops) == 2 and all(d.files >= 1 for d in result.drops)


def test_cli_store_goes_to_the_user_cache_and_is_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    xdg = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    argv = ["--turns", "2", "--turn-tokens", "40", "--hidden", "64", "--vocab", "128"]
    for key, value in SMALL.items():
        argv += ["--set", f"{key}={value}"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    stores = list((xdg / "hicache" / "store").iterdir())
    assert len(stores) == 1 and f"new store at {stores[0]}" in first
    assert list(work.iterdir()) == []  # nothing in the working directory
    assert main(argv) == 0
    assert f"reusing the store at {stores[0]}" in capsys.readouterr().out


def test_cli_opens_an_lmdb_store_left_by_an_earlier_default_as_it_is(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The default store was ``lmdb`` before it was ``disk``: a user's store in the
    default place is opened as the LMDB store it is (its pages reused), with one log
    line that names ``hicache store migrate``."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    argv = ["--turns", "2", "--turn-tokens", "40", "--hidden", "64", "--vocab", "128"]
    for key, value in SMALL.items():
        argv += ["--set", f"{key}={value}"]
    assert main([*argv, "--set", "storage.backend=lmdb"]) == 0
    (store,) = list((tmp_path / "xdg" / "hicache" / "store").iterdir())
    capsys.readouterr()
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert main(argv) == 0  # the shipped default: disk
    assert f"storage lmdb, reusing the store at {store}" in capsys.readouterr().out
    named = [r for r in caplog.records if "hicache store migrate" in r.getMessage()]
    assert len(named) == 1 and str(store) in named[0].getMessage()
    assert [p.name for p in store.parent.iterdir()] == [store.name]  # no second store


def test_cli_names_a_metrics_port_in_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = ["--set", f"metrics.port={port}", "--set", f"storage.path={tmp_path / 's'}"]
        for key, value in SMALL.items():
            argv += ["--set", f"{key}={value}"]
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"metrics.port {port}" in err and "in use" in err


def report_doc(host_p50: float) -> dict[str, object]:
    ttft = {c: {"p50": 10.0, "p90": 12.0} for c in bench.CASES}
    ttft["recompute"] = {"p50": 50.0, "p90": 55.0}
    ttft["host"] = {"p50": host_p50, "p90": host_p50 + 3.0}
    cost = {t: {"p50": ttft[t]["p50"] - 10.0, "p90": 2.0} for t in bench.TIERS}
    return {
        "rounds": 5,
        "ttft_ms": ttft,
        "tier_cost_ms": cost,
        "probe_ms_per_1k_tokens": {k: {"p50": 0.5, "p90": 0.7} for k in bench.PROBES},
        "cold_store": {
            "drops_that_took_effect": 5,
            "drops": 5,
            "resident_before_bytes": 2 << 20,
            "resident_after_bytes": 0,
            "store_bytes": 2 << 20,
        },
    }


def test_engine_bench_report_has_units_no_nan_and_names_noise() -> None:
    lines: list[str] = []
    bench.print_report(report_doc(host_p50=9.5), lines.append)
    text = "\n".join(lines)
    assert "nan" not in text.lower()
    header = next(line for line in lines if line.startswith("case"))
    assert header.count("ms") == 4  # every figure column says its unit
    rows = {line.split()[0]: line.split() for line in lines}
    assert rows["recompute"][3:] == ["—", "—"] and rows["device"][3:] == ["—", "—"]
    assert rows["host"][3] == "-0.50"
    (note,) = [line for line in lines if line.startswith("note:")]
    assert "host p50 is 0.50 ms below the device p50: noise" in note
    assert "device 2.00 ms, host 3.00 ms" in note
    assert "2.0 MiB -> 0.0 MiB of 2.0 MiB" in text
    quiet: list[str] = []
    bench.print_report(report_doc(host_p50=11.0), quiet.append)
    assert not [line for line in quiet if line.startswith("note:")]
