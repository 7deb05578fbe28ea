"""A worker thread that handles queued items in order and never dies on an error."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Lane(Generic[T]):
    """A thread that applies ``handle`` to queued items in order.

    ``put`` is thread-safe; ``stop`` (one caller) handles everything queued so
    far, then joins. Handlers report their own failures; an exception that
    escapes one is a bug, logged, and the lane goes on.
    """

    def __init__(self, name: str, handle: Callable[[T], None]) -> None:
        self._items: queue.SimpleQueue[T | None] = queue.SimpleQueue()
        self._handle = handle
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, item: T) -> None:
        self._items.put(item)

    def stop(self) -> None:
        self._items.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (item := self._items.get()) is not None:
            try:
                self._handle(item)
            except Exception:
                logger.exception("%s failed", self._thread.name)
