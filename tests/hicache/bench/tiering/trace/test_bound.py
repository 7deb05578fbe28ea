"""The unbounded-capacity bound: by hand, and against the real tree with room for everything."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from hicache.bench.tiering.serving import serve_tokens
from hicache.bench.tiering.trace.bound import unbounded_hits
from hicache.bench.tiering.trace.file import prompt_tokens, read_trace
from hicache.cache import HiRadixCache
from hicache.config.cache import CacheConfig, DeviceConfig, HostConfig

# Blocks of 64 tokens: (hash ids, input_length).
HAND = [
    ([1, 2], 100),  # nothing before
    ([1, 2, 3], 192),  # block 1 whole, block 2 as far as request 1's whole pages reached
    ([1, 2, 3], 150),  # blocks 1 and 2; the 22 tokens of block 3 are under a page
    ([5, 2], 128),  # block 2 after 5 is another prefix
    ([1, 2, 3, 4], 250),  # three blocks; block 4 is new
    ([1], 20),  # under one page
    ([2, 3], 128),  # blocks 2 and 3 were only ever seen after block 1
]


def write_trace(path: Path, rows: list[tuple[list[int], int]]) -> Path:
    lines = [
        json.dumps({"timestamp": i, "input_length": n, "output_length": 1, "hash_ids": ids})
        for i, (ids, n) in enumerate(rows)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_bound_by_hand(tmp_path: Path) -> None:
    trace = read_trace(write_trace(tmp_path / "t.jsonl", HAND), block_tokens=64)
    # page 32: request 1 leaves 96 tokens (block 1, half of block 2), request 2 reuses them
    assert unbounded_hits(trace, 32).tolist() == [0, 96, 128, 0, 192, 0, 0]
    # page 64: request 1 leaves block 1 only
    assert unbounded_hits(trace, 64).tolist() == [0, 64, 128, 0, 192, 0, 0]
    with pytest.raises(ValueError, match="must divide"):
        unbounded_hits(trace, 48)


def random_rows(rng: random.Random, n: int) -> list[tuple[list[int], int]]:
    """Conversations that grow and share a few system prompts, with partial last blocks."""
    rows: list[tuple[list[int], int]] = []
    histories = [[rng.randrange(3)] for _ in range(6)]  # a shared first block
    next_id = 10
    for _ in range(n):
        h = histories[rng.randrange(len(histories))]
        grow = rng.randrange(1, 4)
        h += list(range(next_id, next_id + grow))
        next_id += grow
        length = (len(h) - 1) * 64 + rng.randrange(1, 65)
        rows.append((list(h), length))
        if rng.random() < 0.3:  # the partial block is replaced by a whole one next time
            h[-1] = next_id
            next_id += 1
    return rows


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("page", [16, 64])
def test_the_bound_is_what_the_tree_serves_with_unbounded_room(
    tmp_path: Path, seed: int, page: int
) -> None:
    rows = random_rows(random.Random(seed), 40)
    trace = read_trace(write_trace(tmp_path / "t.jsonl", rows), block_tokens=64)
    total = sum(n for _, n in rows)
    config = CacheConfig(
        device=DeviceConfig(device="cpu", page_size=page, num_tokens=(total // page + 1) * page),
        host=HostConfig(enabled=False),
    )
    served = []
    with HiRadixCache(config) as cache:
        for record in trace.records:
            served.append(serve_tokens(cache, prompt_tokens(record, 64).tolist()).device)
            cache.check_integrity()
    assert np.array_equal(unbounded_hits(trace, page), served)
