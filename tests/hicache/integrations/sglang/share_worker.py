"""A second "SGLang server": writes pages through HicacheStorage to a daemon, then exits.

``python -m tests.hicache.integrations.sglang.share_worker ENDPOINT MODEL TP_RANK SEED
PAGES [TP_SIZE]`` (TP_SIZE 2 by default) prints the number of pages stored.
"""

from __future__ import annotations

import sys

from hicache.integrations.sglang_cpu import enter_sglang

enter_sglang()

from hicache.integrations.sglang_cpu import Controller, HostPool, chain_hashes  # noqa: E402
from tests.hicache.integrations.sglang.helpers import ours, remote_extra  # noqa: E402


def main(endpoint: str, model: str, tp_rank: int, seed: int, pages: int, tp_size: int = 2) -> int:
    pool = HostPool("mha", "page_first", pages)
    for page in range(pages):
        pool.fill(page, seed + page)
    backend = ours(pool, remote_extra(endpoint), model=model, tp_rank=tp_rank, tp_size=tp_size)
    hashes = chain_hashes(list(range(seed, seed + pages * pool.page_size)), None, pool.page_size)
    stored = Controller(backend, pool, True).backup(hashes, list(range(pages)))
    backend.close()
    return stored // pool.page_size


if __name__ == "__main__":
    endpoint, model, rank, seed, pages = sys.argv[1:6]
    tp_size = int(sys.argv[6]) if len(sys.argv) > 6 else 2
    print(main(endpoint, model, int(rank), int(seed), int(pages), tp_size))
