"""Two vLLM "servers" (two processes, each with its own HicacheTier) share
chunks through one daemon; another model's server does not see them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from vllm.v1.kv_offload.base import LookupResult

from hicache.bench.common.processes import ServerProcess
from hicache.integrations.vllm_cpu import (
    PrimaryBuffer,
    TierDriver,
    cpu_offloading_spec,
    create_tier,
)
from tests.hicache.integrations.vllm.helpers import CHUNK, key, payload, remote_tier

ROOT = Path(__file__).resolve().parents[4]


def test_two_processes_share_through_one_daemon(shared_daemon: ServerProcess) -> None:
    blocks = 6
    writer = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.hicache.integrations.vllm.share_worker",
            shared_daemon.endpoint,
            str(blocks),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert writer.returncode == 0, writer.stdout + writer.stderr
    primary = PrimaryBuffer(blocks, CHUNK)
    tier = create_tier(
        remote_tier(shared_daemon.endpoint), primary, cpu_offloading_spec(CHUNK, blocks)
    )
    other = create_tier(
        remote_tier(shared_daemon.endpoint),
        PrimaryBuffer(blocks, CHUNK),
        cpu_offloading_spec(CHUNK, blocks, model="org/another-model"),
    )
    try:
        keys = [key(n) for n in range(blocks)]
        assert TierDriver(tier).lookup(keys) == [LookupResult.HIT] * blocks
        assert TierDriver(other).lookup(keys) == [LookupResult.MISS] * blocks
        slots = list(reversed(range(blocks)))
        assert TierDriver(tier).jobs([(keys, slots)], True)[0].success
        for n, slot in zip(range(blocks), slots, strict=True):
            assert primary.chunk(slot) == payload(n)
    finally:
        tier.shutdown()
        other.shutdown()
