"""vLLM's lookup of a window with gaps asks the store once (``contains``), not per hole."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from hicache.integrations.vllm import present_per_key
from storage_backends import StorageConfig, create


class CountingBackend:
    """The memory backend, counting the membership calls that reach it."""

    def __init__(self) -> None:
        self.inner = create("memory", StorageConfig(backend="memory", max_bytes=1 << 20))
        self.calls: list[str] = []

    def exists(self, keys: Sequence[bytes]) -> int:
        self.calls.append("exists")
        return self.inner.exists(keys)

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        self.calls.append("contains")
        return self.inner.contains(keys)


def test_a_window_with_gaps_is_one_call() -> None:
    pattern = [True, True, False, True, False, False, True, True, False, True]
    keys = [hashlib.sha256(b"window-%d" % i).digest() for i in range(len(pattern))]
    backend = CountingBackend()
    held = [key for key, present in zip(keys, pattern, strict=True) if present]
    payload = memoryview(b"\x07" * 64)
    assert backend.inner.put(held, [payload] * len(held)) == [True] * len(held)
    assert present_per_key(backend, keys) == pattern  # type: ignore[arg-type]
    assert backend.calls == ["contains"]  # the prefix exists took 5 calls here
