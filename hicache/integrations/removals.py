"""Which engine key a removed page key stood for, so that removals can be announced.

A store reports what it removed (``StorageBackend.take_removed``) by our page
keys, which are hashes of the namespace and the engine's key and cannot be
turned back. An adapter that announces removals to the engine (vLLM's KV
events) remembers the engine key of every page it announced as stored, and
looks the removed page keys up here. The memory is bounded: past ``capacity``
entries the least recently announced is forgotten (its removal then goes
unannounced, as a removal by another process does).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Generic, TypeVar

_K = TypeVar("_K")


class RemovalMap(Generic[_K]):
    """Page key → engine key of pages announced as stored. Thread-safe."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        self._lock = threading.Lock()
        self._keys: OrderedDict[bytes, _K] = OrderedDict()

    def stored(self, page_keys: Sequence[bytes], engine_keys: Sequence[_K]) -> None:
        """Remember the engine key of each page key (refreshing known ones)."""
        if len(page_keys) != len(engine_keys):
            raise ValueError(f"{len(page_keys)} page keys but {len(engine_keys)} engine keys")
        with self._lock:
            for page_key, engine_key in zip(page_keys, engine_keys, strict=True):
                self._keys[page_key] = engine_key
                self._keys.move_to_end(page_key)
            while len(self._keys) > self._capacity:
                self._keys.popitem(last=False)

    def removed(self, page_keys: Sequence[bytes]) -> list[_K]:
        """The engine keys of the known ``page_keys``, forgotten now; unknown ones are skipped."""
        with self._lock:
            found = (self._keys.pop(k, None) for k in page_keys)
            return [k for k in found if k is not None]

    def __len__(self) -> int:
        with self._lock:
            return len(self._keys)
