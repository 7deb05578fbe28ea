"""``HicacheLinker`` under tensor parallelism (two TP ranks), MHA and MLA, as
docs/sglang.md says: MHA ranks each store and load their own shard under their own
namespace; MLA ranks hold the same latent cache, rank 0 alone stores it and every
rank loads that one copy. Every rank gets its KV back bit-exact.

SGLang's real ``UnifiedRadixCache`` per rank (``hicache.bench.sglang.linker``), the
ranks as threads in lockstep whose TP group reduces through ``thread_ranks``, over
one ``file`` store both ranks open.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hicache.bench.sglang.linker import Fetched, Shape
from tests.hicache.integrations.sglang.linker_support import (
    SglangModules,
    UnifiedServer,
    sglang_modules,
)
from tests.hicache.integrations.sglang.thread_ranks import ThreadGroup, patch_distributed

TOKENS = list(range(100, 118))  # four whole pages and a partial one
SHAPES = {"mha": Shape("mha", head_dim=8), "mla": Shape("mla", head_dim=16)}
TP = 2


@pytest.fixture(scope="module")
def sg() -> SglangModules:
    return sglang_modules()


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_every_tp_rank_gets_its_kv_back_bit_exact(
    sg: SglangModules, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    patch_distributed(monkeypatch)
    group = ThreadGroup(TP)
    store = {"hicache_config": "default", "backend": "file", "path": str(tmp_path / "store")}
    servers: list[UnifiedServer] = []
    try:
        for rank in range(TP):
            servers.append(
                UnifiedServer(sg, SHAPES[kind], "python", store, tp_group=group.rank(rank))
            )

        def one_rank(rank: int) -> tuple[list[torch.Tensor], Fetched]:
            server = servers[rank]
            # MHA ranks hold other heads (other KV); MLA ranks the same latent cache.
            written = server.compute(TOKENS, seed=1 + rank if kind == "mha" else 1)
            server.settle()
            group.barrier()  # every rank's offloads are in the store
            server.evict()
            return written, server.fetch(TOKENS)

        results = group.run(one_rank)
        names = [server.linker.namespace.describe() for server in servers]
        stats = [server.linker.stats().storage for server in servers]
    finally:
        for server in reversed(servers):
            server.close()
    for rank, (written, got) in enumerate(results):
        assert (got.device_prefix, len(got.loaded_slots), got.aborted) == (0, 16, False), rank
        assert all(same_bits(w, g) for w, g in zip(written, got.kv, strict=True)), (
            f"rank {rank} loaded KV that is not its own"
        )
    stored = [s.puts if s is not None else -1 for s in stats]
    read = [s.hits if s is not None else -1 for s in stats]
    assert read == [4] * TP  # every rank loads its four pages
    if kind == "mha":  # each rank stores its own shard, under its own namespace
        assert names[0] != names[1] and stored == [4] * TP
    else:  # one namespace, one copy: rank 0's
        assert names[0] == names[1] and stored == [4, 0]
