"""With the cache, greedy outputs and final logits equal a full recompute, bit for bit.

Both models: MHA, and MLA whose pools keep one latent per token and layer
(tests/hicache/engine/test_mla.py has the MLA-specific checks).

Every reuse path is exercised: device hits, host load-backs, storage prefetches
(and a restarted engine reading the same store). Chunked prefill runs with a
different chunk size than the reference: the model is batch-invariant (see
hicache.engine.invariant), so even chunking does not change a single bit.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from hicache.engine import ModelSpec, Request
from hicache.policies.prefetch import PREFETCH_POLICIES
from tests.hicache.engine.helpers import (
    SPECS,
    assert_clean,
    assert_same,
    chat,
    config,
    engine,
    generate,
    push_to_host,
    push_to_storage,
    reference,
    tokens,
)

PAGE_SIZES = [1, 16]


def user_turns(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [tokens(rng, n) for n in (40, 21, 33, 18)]


def shared_prompt_requests(seed: int, count: int = 6) -> list[Request]:
    rng = random.Random(seed)
    system = tokens(rng, 72)
    return [
        Request(f"r{i}", tuple(system + tokens(rng, rng.randrange(3, 20))), 3) for i in range(count)
    ]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_chat_device_hits(page_size: int, spec: ModelSpec) -> None:
    turns = user_turns(1)
    want = chat(reference(chunk_size=1000, spec=spec), turns)
    eng = engine(config(page_size, 1024, spec=spec), chunk_size=24, spec=spec)
    got = chat(eng, turns)
    assert_same(got, want)
    assert all(out.hits.device > 0 and out.hits.host == 0 for out in got[1:])
    assert_clean(eng.cache)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_chat_host_load_back(page_size: int, layout: str, spec: ModelSpec) -> None:
    turns = user_turns(2)
    want = chat(reference(spec=spec), turns)
    eng = engine(config(page_size, 1024, host=True, spec=spec, layout=layout), spec=spec)
    got = chat(eng, turns, between=push_to_host)
    assert_same(got, want)
    assert all(out.hits.host > 0 and out.hits.device == 0 for out in got[1:])
    assert_clean(eng.cache)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_chat_storage_prefetch_and_restart(tmp_path: Path, page_size: int, spec: ModelSpec) -> None:
    turns = user_turns(3)
    want = chat(reference(spec=spec), turns)
    eng = engine(config(page_size, 1024, store=tmp_path / "store", spec=spec), spec=spec)
    got = chat(eng, turns, between=push_to_storage)
    assert_same(got, want)
    assert all(out.hits.storage > 0 and out.hits.device == 0 for out in got[1:])
    assert_clean(eng.cache)
    eng.cache.close()
    # A new engine process-alike over the same store reuses the last turn's pages.
    again = engine(config(page_size, 1024, store=tmp_path / "store", spec=spec), spec=spec)
    last = chat(again, turns)
    assert_same(last, want)
    assert last[0].hits.storage > 0
    again.cache.close()


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("policy", sorted(PREFETCH_POLICIES))
def test_prefetch_policies_stay_correct(tmp_path: Path, page_size: int, policy: str) -> None:
    turns = user_turns(4)[:2]
    want = chat(reference(), turns)
    eng = engine(config(page_size, 1024, store=tmp_path / "s", prefetch_policy=policy))
    assert_same(chat(eng, turns, between=push_to_storage), want)
    assert_clean(eng.cache)
    eng.cache.close()


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_shared_system_prompt_batched(page_size: int, spec: ModelSpec) -> None:
    requests = shared_prompt_requests(5)
    want = generate(reference(spec=spec), requests)
    eng = engine(config(page_size, 2048, spec=spec), chunk_size=100, spec=spec)
    got = generate(eng, requests)
    assert_same(got, want)
    assert sum(out.hits.device for out in got) >= 64 * (len(requests) - 2)
    assert_clean(eng.cache)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_shared_system_prompt_across_tiers(tmp_path: Path, page_size: int) -> None:
    requests = shared_prompt_requests(6, count=4)
    want = generate(reference(), requests)
    eng = engine(config(page_size, 2048, store=tmp_path / "store"))
    got = generate(eng, requests[:1])
    push_to_host(eng.cache)
    got += generate(eng, requests[1:2])
    push_to_storage(eng.cache)
    got += generate(eng, requests[2:])
    assert_same(got, want)
    assert got[1].hits.host >= 64 and got[2].hits.storage >= 64
    assert_clean(eng.cache)
    eng.cache.close()


def test_namespaces_do_not_share() -> None:
    turns = user_turns(7)[:2]
    eng = engine(config(16, 1024))
    chat(eng, turns, namespace="a")
    other = chat(eng, turns, namespace="b")
    assert other[0].hits.total == 0
    assert_same(other, chat(reference(), turns))
