"""Damaged LMDB stores: byte flips and truncation of data.mdb at many offsets.

Each damaged copy is opened (behind the guard the cache uses) in a child
process, which must never die by a signal, never hand out wrong bytes, and
either serve intact pages or start empty after quarantining the store.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from storage_backends import StorageConfig, create

SIZE = 3000  # larger than LMDB's inline limit: B-tree pages and overflow pages both
COUNT = 48
REPO = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent(
    f"""
    import hashlib, json, sys
    from storage_backends import StorageConfig
    from storage_backends.guard import open_guarded

    def key(i):
        return hashlib.sha256(f"page-{{i}}".encode()).digest()

    def payload(i):
        seed = hashlib.sha256(f"payload-{{i}}".encode()).digest()
        return (seed * ({SIZE} // 32 + 1))[:{SIZE}]

    for case, path in enumerate(sys.argv[1:]):
        config = StorageConfig(backend="lmdb", path=path, max_bytes=1 << 20, fingerprint="ab12")
        store = open_guarded("lmdb", config)
        at_open = store.stats().quarantined
        dst = [memoryview(bytearray({SIZE})) for _ in range({COUNT})]
        hits = store.get([key(i) for i in range({COUNT})], dst)
        wrong = sum(hit and bytes(d) != payload(i) for i, (hit, d) in enumerate(zip(hits, dst)))
        store.exists([key(i) for i in range({COUNT})])
        more = range(100, 160)
        store.put([key(i) for i in more], [memoryview(payload(i)) for i in more])
        store.delete([key(i) for i in range(0, {COUNT}, 3)])
        fresh = [memoryview(bytearray({SIZE}))]
        # The first write may be the one that finds the damage (then a miss).
        usable = any(store.put([key(999)], [memoryview(payload(999))]) == [True] for _ in "12")
        usable = usable and store.get([key(999)], fresh) == [True]
        usable = usable and bytes(fresh[0]) == payload(999)
        print(json.dumps(dict(case=case, at_open=at_open, hits=sum(hits), wrong=wrong,
                              usable=usable, quarantined=store.stats().quarantined)), flush=True)
        store.close()
    """
)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """data.mdb of a store holding COUNT pages (some deleted, so the free list is used)."""
    root = tmp_path_factory.mktemp("pristine") / "store"
    config = StorageConfig(backend="lmdb", path=str(root), max_bytes=1 << 20, fingerprint="ab12")
    store = create("lmdb", config)
    keys = [hashlib.sha256(f"page-{i}".encode()).digest() for i in range(COUNT + 8)]
    blobs = [
        hashlib.sha256(f"payload-{i}".encode()).digest() * (SIZE // 32 + 1)
        for i in range(COUNT + 8)
    ]
    store.put(keys, [memoryview(blob[:SIZE]) for blob in blobs])
    store.delete(keys[COUNT:])
    store.close()
    return (root / "data.mdb").read_bytes()


def _damage(data: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    kind = rng.choice(["truncate", "header", "header", "anywhere"])
    if kind == "truncate":
        return bytes(buf[: rng.randrange(len(buf))])
    for _ in range(rng.choice([1, 2, 8])):
        if kind == "header":  # B-tree and meta page headers: the structure itself
            offset = rng.randrange(len(buf) // 4096) * 4096 + rng.randrange(64)
        else:
            offset = rng.randrange(len(buf))
        buf[offset] ^= 1 << rng.randrange(8)
    return bytes(buf)


def _run_cases(tmp_path: Path, data: bytes, seed: int, cases: int) -> list[dict[str, int]]:
    rng = random.Random(seed)
    paths = []
    for case in range(cases):
        path = tmp_path / f"case{case}"
        path.mkdir()
        (path / "data.mdb").write_bytes(_damage(data, rng))
        paths.append(str(path))
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *paths], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"child exit {done.returncode}: {done.stderr[-3000:]}"
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(results) == cases
    for result, path in zip(results, paths, strict=True):
        moved = list(tmp_path.glob(f"{Path(path).name}.damaged-*"))
        assert result["wrong"] == 0, result
        assert result["usable"], result
        assert bool(moved) == (result["quarantined"] > 0), result
        if result["at_open"]:
            assert result["hits"] == 0, result
        shutil.rmtree(path)
        for m in moved:
            shutil.rmtree(m)
    return results


def test_damaged_store_never_crashes_or_serves_wrong_bytes(tmp_path: Path, pristine: bytes) -> None:
    results = _run_cases(tmp_path, pristine, seed=1, cases=20)  # 300 more: make test-slow
    # The damage is real: some stores were quarantined, some served their pages.
    assert any(r["at_open"] for r in results)
    assert any(r["hits"] for r in results)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2, 7))
def test_damaged_store_many_more_offsets(tmp_path: Path, pristine: bytes, seed: int) -> None:
    _run_cases(tmp_path, pristine, seed=seed, cases=60)


def test_truncated_store_is_quarantined_not_a_sigbus(tmp_path: Path, pristine: bytes) -> None:
    (tmp_path / "case0").mkdir()
    (tmp_path / "case0" / "data.mdb").write_bytes(pristine[: len(pristine) // 2])
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "case0")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["at_open"] == 1 and result["hits"] == 0 and result["usable"]
