"""``HicacheLinker`` loads whose store read times out and completes later: the timed-out
load is reported failed (SGLang's verdict aborts its request), and its late bytes
never land in a later load's buffers: the next request's KV is bit-exact.

SGLang's real ``UnifiedRadixCache`` on CPU (``hicache.bench.sglang.linker``), over a
store whose one armed read answers only once the linker has given up on it and the
next load's read is in flight (``late_store``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from hicache.bench.sglang.linker import Shape
from tests.hicache.integrations.sglang import late_store
from tests.hicache.integrations.sglang.linker_support import (
    SglangModules,
    UnifiedServer,
    sglang_modules,
)

FIRST = list(range(100, 116))  # four whole pages each
SECOND = list(range(200, 216))
STORE = {
    "hicache_config": "remote",
    "backend": "tests.hicache.integrations.sglang.late_store:LateRead",
    "timeout_s": 0.3,
}


@pytest.fixture(scope="module")
def sg() -> SglangModules:
    return sglang_modules()


@pytest.fixture
def server(sg: SglangModules, request: pytest.FixtureRequest) -> Iterator[UnifiedServer]:
    late_store.PAGES.clear()
    built = UnifiedServer(sg, request.param, "python", STORE)
    yield built
    late_store.LATE.let_the_late_one_land()  # nothing left waiting
    built.close()
    late_store.PAGES.clear()


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize(
    "server",
    [Shape("mha", head_dim=8), Shape("mla", head_dim=16)],
    ids=["mha", "mla"],
    indirect=True,
)
def test_a_late_read_fails_its_load_and_never_lands_in_the_next(server: UnifiedServer) -> None:
    first = server.compute(FIRST, seed=11)
    second = server.compute(SECOND, seed=12)
    server.settle()
    server.evict()
    late_store.LATE.arm()
    timed_out = server.fetch(FIRST)  # its read answers after the linker gave up
    assert (len(timed_out.loaded_slots), timed_out.aborted) == (16, True)
    assert server.linker.stats().failures == {"load failed": 1}
    got = server.fetch(SECOND)  # the late bytes land while this load's read is in flight
    assert late_store.LATE.landed.is_set(), "the late read never answered"
    assert not got.aborted and len(got.loaded_slots) == 16
    assert all(same_bits(w, g) for w, g in zip(second, got.kv, strict=True)), (
        "the late read's bytes landed in the next load"
    )
    again = server.fetch(FIRST)  # the timed-out request's pages load fine later
    assert not again.aborted
    assert all(same_bits(w, g) for w, g in zip(first, again.kv, strict=True))
    assert server.linker.stats().failures == {"load failed": 1}
