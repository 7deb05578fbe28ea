"""A batch's reads or writes on a small thread pool: pread/pwrite release the GIL, so
the bytes in flight grow with the threads."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

_T = TypeVar("_T")
_R = TypeVar("_R")


class IoPool:
    """Runs ``fn`` over items in up to ``threads`` chunks; small batches run inline.
    Thread-safe; ``fn`` should not raise (callers return per-item outcomes); if it does,
    ``map`` raises only once every item's ``fn`` has finished."""

    def __init__(self, threads: int) -> None:
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="disk-io")
            return self._pool

    @property
    def threads(self) -> int:
        return self._threads

    def map(
        self, fn: Callable[[_T], _R], items: Sequence[_T], parts: int | None = None
    ) -> list[_R]:
        """``fn`` of each item, in order, on up to ``parts`` threads (None: all of them)."""
        chunks = min(self._threads, len(items), self._threads if parts is None else parts)
        if chunks < 2:
            return [fn(item) for item in items]
        shares = [items[i::chunks] for i in range(chunks)]
        futures = [self._executor().submit(_run_all, fn, part) for part in shares[1:]]
        try:
            results = [_run_all(fn, shares[0])]  # this thread does a share too
        finally:
            # Returns or raises only once no item is in use: a caller then reuses their
            # buffers (a read that raised must not go on filling a buffer given back).
            wait(futures)
        results += [f.result() for f in futures]
        out: list[_R] = [None] * len(items)  # type: ignore[list-item]
        for start, part in enumerate(results):
            out[start::chunks] = part
        return out

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


def _run_all(fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
    return [fn(item) for item in items]
