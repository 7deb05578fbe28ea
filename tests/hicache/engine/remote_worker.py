"""One engine process against a cache daemon (run by tests/hicache/engine/test_remote_storage.py).

``python -m tests.hicache.engine.remote_worker ENDPOINT OUT`` loads configs/remote.toml
(the model shrunk to the tests' tiny SPEC), chats the fixed user turns with
every turn's KV pushed down to storage, and saves the outputs to ``OUT``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from hicache.config.cache import CacheConfig
from tests.hicache.engine.helpers import SPEC, chat, engine, push_to_storage, tokens

PAGE_SIZE = 16
REPO = Path(__file__).resolve().parents[3]


def remote_config(endpoint: str, timeout_s: float = 5.0) -> CacheConfig:
    """configs/remote.toml for the tiny test model on CPU, storage at ``endpoint``."""
    overrides: dict[str, str | int | float | bool] = {
        "storage.endpoint": endpoint,
        "storage.timeout_s": timeout_s,
        "storage.breaker_cooldown_s": 0.2,
        "model.num_layers": SPEC.num_layers,
        "model.kv_heads": SPEC.kv_heads,
        "model.head_dim": SPEC.head_dim,
        "model.dtype": SPEC.dtype,
        "device.device": "cpu",
        "device.page_size": PAGE_SIZE,
        "device.num_tokens": 1024,
        "host.reserve_gb": 0.0,
        "policy.load_back_threshold": 1,
        "policy.prefetch_threshold": 1,
        "policy.prefetch_policy": "wait_complete",
    }
    return CacheConfig.from_toml(REPO / "configs" / "remote.toml", overrides)


def user_turns() -> list[list[int]]:
    import random

    rng = random.Random(7)
    return [tokens(rng, n) for n in (70, 25, 40)]


def main(endpoint: str, out: Path) -> int:
    torch.set_num_threads(1)
    eng = engine(remote_config(endpoint))
    try:
        outs = chat(eng, user_turns(), between=push_to_storage)
    finally:
        eng.cache.close()
    torch.save(
        [(o.output_tokens, o.final_logits, o.hits.storage, o.hits.device) for o in outs], out
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))
