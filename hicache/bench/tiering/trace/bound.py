"""The unbounded-capacity bound of a trace: what a cache that never evicts would serve.

Computed from the trace alone, at the replay's page alignment, so that a
set-up's hit rate and the bound count the same tokens: a request is served
the longest run of whole pages that an earlier request's prompt (inserted
whole pages only, as the tree does) shares with it. Blocks are walked as a
trie of hash-id paths (equal ids after different prefixes are different
blocks), each node keeping the most of its block any earlier prompt covered.
"""

from __future__ import annotations

import numpy as np

from hicache.bench.tiering.trace.file import Trace


def unbounded_hits(trace: Trace, page_size: int) -> np.ndarray:
    """Tokens each request (arrival order) would reuse with unbounded capacity."""
    block = trace.block_tokens
    if page_size < 1 or block % page_size:
        raise ValueError(f"page size {page_size} must divide the trace's {block}-token blocks")
    children: dict[tuple[int, int], int] = {}  # (parent node, block id) -> node
    covered = [block]  # tokens of its block each node's earlier prompts covered; root: all
    out = np.zeros(len(trace.records), np.int64)
    for i, record in enumerate(trace.records):
        aligned = record.input_length // page_size * page_size
        ids = record.blocks.tolist()
        out[i] = _walk(children, covered, ids, aligned, block)
        _insert(children, covered, ids, aligned, block)
    return out


def _walk(
    children: dict[tuple[int, int], int],
    covered: list[int],
    ids: list[int],
    aligned: int,
    block: int,
) -> int:
    node, hit = 0, 0
    for k, block_id in enumerate(ids):
        here = min(block, aligned - k * block)  # this prompt's whole pages in block k
        child = children.get((node, block_id))
        if here <= 0 or child is None:
            break
        hit += min(covered[child], here)
        if covered[child] < block:
            break
        node = child
    return hit


def _insert(
    children: dict[tuple[int, int], int],
    covered: list[int],
    ids: list[int],
    aligned: int,
    block: int,
) -> None:
    node = 0
    for k, block_id in enumerate(ids):
        here = min(block, aligned - k * block)
        if here <= 0:
            return
        child = children.setdefault((node, block_id), len(covered))
        if child == len(covered):
            covered.append(0)
        covered[child] = max(covered[child], here)
        node = child
