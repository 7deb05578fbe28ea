"""A second "vLLM server" for the sharing test: stores blocks through its own
HicacheTier into a daemon, then exits (run as ``python -m``)."""

from __future__ import annotations

import sys

from hicache.integrations.vllm_cpu import enter_vllm

enter_vllm()

from hicache.integrations.vllm_cpu import (  # noqa: E402
    PrimaryBuffer,
    TierDriver,
    cpu_offloading_spec,
    create_tier,
)
from tests.hicache.integrations.vllm.helpers import CHUNK, key, payload, remote_tier  # noqa: E402


def main(endpoint: str, blocks: int) -> int:
    primary = PrimaryBuffer(blocks, CHUNK)
    tier = create_tier(remote_tier(endpoint), primary, cpu_offloading_spec(CHUNK, blocks))
    try:
        for n in range(blocks):
            primary.fill(n, payload(n))
        results = TierDriver(tier).jobs(
            [([key(n) for n in range(blocks)], list(range(blocks)))], False
        )
        print("stored", all(r.success for r in results), flush=True)
        return 0 if all(r.success for r in results) else 1
    finally:
        tier.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
