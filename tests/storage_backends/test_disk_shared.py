"""Two processes writing, reading, deleting and evicting on one disk store at once,
with room for few pages so that slots are reused under each other's reads: every
hit is the page's own bytes, also when the two use different page sizes (two models
on one store: each one's puts make room among the other's pages)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from storage_backends import StorageConfig, create

SIZE = 16384
CAPACITY_PAGES = 6
KEYS = 24
ROUNDS = 400

WORKER = """
import hashlib, random, sys
from storage_backends import StorageConfig
from storage_backends.disk import DiskBackend

path, seed, size, capacity, keys, rounds = sys.argv[1:7]
size, capacity, keys, rounds = int(size), int(capacity), int(keys), int(rounds)
store = DiskBackend(
    StorageConfig(backend="disk", path=path, max_bytes=capacity, sync="none", io_threads=2)
)
rng = random.Random(int(seed))

def key(i):
    return hashlib.sha256(f"shared-{size}-{i}".encode()).digest()

def payload(i):
    return hashlib.sha256(f"bytes-{i}".encode()).digest() * (size // 32)

wrong = hits = 0
for _ in range(rounds):
    ids = rng.sample(range(keys), 4)
    op = rng.random()
    if op < 0.45:
        store.put([key(i) for i in ids], [memoryview(payload(i)) for i in ids])
    elif op < 0.95:
        dst = [memoryview(bytearray(size)) for _ in ids]
        for i, hit, buf in zip(ids, store.get([key(i) for i in ids], dst), dst):
            hits += hit
            wrong += hit and bytes(buf) != payload(i)
    else:
        store.delete([key(i) for i in ids[:1]])
stats = store.stats()
store.close()
print(f"hits={hits} wrong={wrong} evictions={stats.evictions}", flush=True)
sys.exit(1 if wrong else 0)
"""


@pytest.mark.parametrize("sizes", [(SIZE, SIZE), (SIZE, SIZE + 3072)])
def test_two_processes_share_one_store_without_a_wrong_byte(
    tmp_path: Path, sizes: tuple[int, int]
) -> None:
    path = tmp_path / "store"
    capacity = CAPACITY_PAGES * (SIZE + 64)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    workers = []
    for seed, size in zip((1, 2), sizes, strict=True):
        args = [str(path), str(seed), str(size), str(capacity), str(KEYS), str(ROUNDS)]
        command = [sys.executable, "-c", WORKER, *args]
        workers.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env))
    outputs = [w.communicate(timeout=120)[0] for w in workers]
    for worker, out in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, out
        assert "wrong=0" in out and "hits=0" not in out and "evictions=0" not in out, out
    store = create("disk", StorageConfig(backend="disk", path=str(path), max_bytes=capacity))
    try:
        assert store.stats().entries <= CAPACITY_PAGES
    finally:
        store.close()
