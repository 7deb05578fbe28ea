"""`hicache bench tiering --trace` end to end: a hand-made trace whose hit rates per tier
and link traffic are known by hand, the report, determinism, the store probe, bad input."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

import pytest

from hicache.bench.tiering.trace.models import parse_model
from hicache.bench.tiering.trace.probe import probe
from hicache.cli import main
from hicache.config.cache import CacheConfig, DeviceConfig
from storage_backends import StorageConfig

CONFIG = """
[device]
device = "cpu"
[host]
reserve_gb = 0.0
[storage]
backend = "{backend}"
[policy]
load_back_threshold = 16
prefetch_threshold = 64
"""
# Prompts of two 64-token blocks (4 pages of 32), one every second. X1 = [1, 2], ...
ORDER = [1, 1, 2, 1, 3, 2, 1]
TOTAL = 128 * len(ORDER)
# Device 128 tokens (one prompt), host 256 (two), storage 1024 (all three); worked out by
# hand (LRU at each tier, write-through, every backup written to storage):
#   1 X1 miss            2 X1 device        3 X2 miss (X1 demoted to host)
#   4 X1 host (X2 demoted)                  5 X3 miss (X1 demoted; host drops X2)
#   6 X2 miss, or from storage (host drops X1)   7 X1 miss, or from storage (host drops X3)
EXPECTED = {
    "device 128": {"device": 128, "host": 0, "storage": 0},
    "device 128 + host 256": {"device": 128, "host": 128, "storage": 0},
    "device 128 + host 256 + storage 1,024": {"device": 128, "host": 128, "storage": 256},
}
# Tokens over each link in the storage set-up: backups of X1, X2, X3; loads at 4, 6, 7;
# the three written to storage; two fetched back.
MOVED = {"d2h": 384, "h2d": 384, "h2s": 384, "s2h": 256}
MODEL = "2/1/8/float16"  # 64 bytes of KV a token
FLAGS = ["--page-size", "32", "--block-tokens", "64", "--model", MODEL, "--window-s", "2"]
FLAGS += ["--jobs", "1"]
SIZES = ["--device-tokens", "128", "--host-tokens", "256", "--storage-tokens", "1024"]


def hand_trace(path: Path) -> Path:
    rows = [
        {
            "timestamp": 1000 * i,
            "input_length": 128,
            "output_length": 9,
            "hash_ids": [2 * x - 1, 2 * x],
        }
        for i, x in enumerate(ORDER)
    ]
    path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    return path


def bench(tmp_path: Path, out: str, *extra: str, backend: str = "disk") -> dict[str, Any]:
    cfg = tmp_path / "c.toml"
    cfg.write_text(CONFIG.format(backend=backend))
    argv = ["bench", "tiering", "--config", str(cfg), "--out", str(tmp_path / out), *extra]
    assert main(argv) == 0
    report: dict[str, Any] = json.loads((tmp_path / out / "trace-hand.json").read_text())
    assert (tmp_path / out / "trace-hand.png").stat().st_size > 0
    return report


@pytest.mark.parametrize("backend", ["disk", "lmdb"])
def test_a_hand_made_trace_gives_the_hit_rates_worked_out_by_hand(
    tmp_path: Path, backend: str
) -> None:
    """With ``disk``, the store's rates are given; with ``lmdb``, measured here (a tiny probe)."""
    trace = hand_trace(tmp_path / "hand.jsonl.gz")
    rates = ["--disk-gbps", "0.000003,0.000005"] if backend == "disk" else ["--probe-mib", "1"]
    report = bench(tmp_path, "out", "--trace", str(trace), *FLAGS, *SIZES, *rates, backend=backend)
    figures = {f["name"]: f for f in report["figures"]}
    assert list(figures) == list(EXPECTED)
    for name, tiers in EXPECTED.items():
        f = figures[name]
        assert f["hit_rate_by_tier"] == {t: n / TOTAL for t, n in tiers.items()}, name
        assert f["prefill_tokens_saved"] == sum(tiers.values())
        assert f["bound_hit_rate"] == 512 / TOTAL  # requests 2, 4, 6, 7 reuse a whole prompt
    full = figures["device 128 + host 256 + storage 1,024"]
    assert full["tokens_moved"] == MOVED
    assert full["bytes_moved"] == {k: 64 * v for k, v in MOVED.items()}
    assert full["tokens"] == {"device": 128, "host": 256, "storage": 1024}
    # 2-s windows: writes of 128 tokens in windows 0, 1, 2 and none in 3; reads in 2 and 3
    write, read = full["link_gbps"]["h2s"], full["link_gbps"]["s2h"]
    per_window = 128 * 64 / 2 / 1e9
    assert write["mean"] == pytest.approx(0.75 * per_window)
    assert write["p99"] == pytest.approx(per_window)
    assert read["mean"] == pytest.approx(0.5 * per_window)
    assert read["p99"] == pytest.approx(per_window)
    assert report["config"]["storage"]["backend"] == backend
    if backend == "disk":
        verdicts = {v["link"]: v["verdict"] for v in report["verdicts"]}
        assert verdicts == {"h2s": "keeps up", "s2h": "keeps up on average only"}
        return
    sources = ["lmdb store (direct)", report["stores"][1]["source"]]
    assert [s["source"] for s in report["stores"]] == sources
    judged = {(v["link"], v["source"]) for v in report["verdicts"]}
    assert judged == {(link, s) for link in ("h2s", "s2h") for s in sources}


def conversations(path: Path, seed: int) -> Path:
    """20 chats of 6 turns, turns interleaved across chats (each turn 1-3 more 64-token
    blocks, the last one partial), over 3 shared first blocks: reuse at every distance."""
    rng = random.Random(seed)
    chats = [[1000 + c % 3] for c in range(20)]
    rows, next_id = [], 1
    for _ in range(6):
        for c in rng.sample(range(20), 20):
            chats[c] += range(next_id, next_id + rng.randint(1, 3))
            next_id = chats[c][-1] + 1
            length = 64 * len(chats[c]) - rng.randrange(64)
            stamp = 1000 * len(rows) + rng.randrange(900)
            rows.append({"timestamp": stamp, "input_length": length, "output_length": 1,
                         "hash_ids": list(chats[c])})  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_figures_are_the_same_on_every_run(tmp_path: Path) -> None:
    """Every tier but the largest store too small for the chats: evictions everywhere, hits
    from every tier; a store that holds every page reaches the trace's bound."""
    trace = conversations(tmp_path / "chats.jsonl", seed=5)
    sizes = ["--device-tokens", "2k", "--host-tokens", "4k", "--storage-tokens", "8k,24k"]
    flags = ["--page-size", "16", "--block-tokens", "64", "--disk-gbps", "1"]
    # A one-page prefetch is worth it here: the bound counts every page a store could give.
    flags += ["--set", "policy.prefetch_threshold=16", "--json"]
    argv = ["--trace", str(trace), *sizes, *flags]
    first = bench_json(tmp_path, [*argv, str(tmp_path / "a.json"), "--jobs", "1"])
    second = bench_json(tmp_path, [*argv, str(tmp_path / "b.json"), "--jobs", "1"])
    assert first["figures"] == second["figures"]
    rates = [f["hit_rate"] for f in first["figures"]]
    assert rates == sorted(rates) and len(set(rates)) == len(rates)  # each tier adds hits
    small, large = first["figures"][-2:]
    assert min(small["hit_rate_by_tier"].values()) > 0
    assert small["hit_rate"] < small["bound_hit_rate"] == large["hit_rate"]


def bench_json(tmp_path: Path, argv: list[str]) -> dict[str, Any]:
    cfg = tmp_path / "c.toml"
    cfg.write_text(CONFIG.format(backend="disk"))
    out = tmp_path / "out"
    assert main(["bench", "tiering", "--config", str(cfg), "--out", str(out), *argv]) == 0
    report: dict[str, Any] = json.loads(Path(argv[argv.index("--json") + 1]).read_text())
    return report


def test_set_ups_replayed_in_worker_processes_give_the_same_figures(tmp_path: Path) -> None:
    trace = hand_trace(tmp_path / "hand.jsonl.gz")
    argv = ["--trace", str(trace), *FLAGS, *SIZES, "--disk-gbps", "1", "--jobs", "2"]
    report = bench(tmp_path, "out", *argv)
    assert [f["name"] for f in report["figures"]] == list(EXPECTED)  # in the sweep's order
    for f in report["figures"]:
        assert f["hit_rate_by_tier"] == {t: n / TOTAL for t, n in EXPECTED[f["name"]].items()}
    assert report["figures"][-1]["tokens_moved"] == MOVED


def test_device_and_host_rows_only(tmp_path: Path) -> None:
    trace = hand_trace(tmp_path / "hand.jsonl.gz")
    sizes = ["--device-tokens", "128,256", "--host-tokens", "none", "--storage-tokens", "10k"]
    report = bench(tmp_path, "out", "--trace", str(trace), *FLAGS, *sizes)
    rates = {f["name"]: f["hit_rate_by_tier"]["device"] for f in report["figures"]}
    # 256 tokens keep X1 through X2 (request 4) but not through X3 and X2 (request 7)
    assert rates == {"device 128": 128 / TOTAL, "device 256": 256 / TOTAL}
    assert report["stores"] == [] and report["verdicts"] == []  # nothing to judge, no probe


def test_the_store_and_a_daemon_are_measured(tmp_path: Path) -> None:
    config = CacheConfig(device=DeviceConfig(device="cpu"), storage=StorageConfig(backend="disk"))
    rates = probe(config, parse_model("4/2/64/float16"), 4 << 20, tmp_path)
    assert [r.source.split(" (")[0] for r in rates] == ["disk store", "daemon over tcp"]
    for r in rates:
        assert r.write_gbps is not None and r.write_gbps > 0
        assert r.read_gbps is not None and r.read_gbps > 0
        assert "fsync" in r.note
    assert list(tmp_path.iterdir()) == []  # nothing left behind


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--page-size", "48"], "must divide --block-tokens"),
        (["--model", "huge"], "--model 'huge'"),
        (["--device-tokens", "100"], "longest prompt"),
        (["--storage-tokens", "lots"], "--storage-tokens"),
        (["--disk-gbps", "0"], "--disk-gbps"),
        (["--set", "device.num_tokens=4096"], "--device-tokens"),
        (["--set", "model.num_layers=2"], "--model"),
        (["--engines", "2"], "--engines"),
    ],
)
def test_bad_flags_are_clear_errors_before_any_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    trace = hand_trace(tmp_path / "hand.jsonl.gz")
    cfg = tmp_path / "c.toml"
    cfg.write_text(CONFIG.format(backend="disk"))
    argv = ["bench", "tiering", "--config", str(cfg), "--trace", str(trace), *FLAGS, *SIZES]
    assert main([*argv, *extra, "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_bad_trace_line_is_named_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 64, "output_length": 1, "hash_ids": [1]}\n{\n')
    assert main(["bench", "tiering", "--trace", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert f"{bad}, line 2: not JSON" in capsys.readouterr().err
