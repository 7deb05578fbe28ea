"""DiskParts: what a DiskBackend's read and write paths share."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from storage_backends.config import StorageConfig
from storage_backends.counters import StatCounters
from storage_backends.disk.index import DiskIndex
from storage_backends.disk.io_pool import IoPool
from storage_backends.disk.segments import SegmentFiles
from storage_backends.log_limit import LogLimiter
from storage_backends.recency import PendingTouches


@dataclass(frozen=True)
class DiskParts:
    """The open parts of one DiskBackend, owned (opened and closed) by it; the read path
    (``DiskReads``) and the put path (``DiskWrites``) use them, never each other."""

    config: StorageConfig
    root: Path
    index: DiskIndex
    segments: SegmentFiles
    pool: IoPool
    counters: StatCounters
    log: LogLimiter
    touches: PendingTouches
    write_lock: threading.Lock  # serialises this process's index write transactions
