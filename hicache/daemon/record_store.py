"""RecordStore: what the daemon needs of the page store behind its memory tier, and the
stores that provide it (``store.backend``: ``lmdb`` or ``disk``).

The daemon stores each client's page record (header + payload, as the client framed
it, its header checked) as a record of the backend under the tenant-scoped key: the
header's key rewritten, nothing hashed (``record_framing``; every read checks the
checksum). It never knows which backend is
behind it: both satisfy ``RecordStore`` as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Protocol

from storage_backends.base import StorageStats
from storage_backends.config import StorageConfig
from storage_backends.disk import DiskBackend
from storage_backends.lmdb.backend import LmdbBackend
from storage_backends.store_kind import as_found
from storage_backends.trusted_records import RecordsPut

logger = logging.getLogger(__name__)


class RecordStore(Protocol):
    """A local page store as the daemon uses it (part of ``storage_backends``' protocol,
    plus ``sizes`` and the whole-record ``get_records``/``put_records``).

    Thread-safety: every method may run concurrently on several threads, except
    ``close``, once nothing else runs. A miss is never an exception; a store whose
    structure fails raises ``StoreDamagedError`` (the daemon moves it aside);
    ``StorageClosedError`` after ``close``; ``ValueError`` for a key not of 32 bytes.
    """

    def exists(self, keys: Sequence[bytes]) -> int:
        """How many leading keys are present. Mutates nothing."""
        ...

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        """Per key, whether it is present. Mutates nothing."""
        ...

    def sizes(self, keys: Sequence[bytes]) -> list[int | None]:
        """Per key, the stored payload length (None: absent). Mutates nothing."""
        ...

    def get_records(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        """Whole verified records (header naming the store key, then the payload) copied
        into ``dst``, each of ``HEADER_BYTES`` + the stored payload length (another length
        is a miss); a miss's buffer may be partly written. Updates recency; drops damaged
        pages. ValueError for a buffer shorter than a header."""
        ...

    def put_records(self, keys: Sequence[bytes], records: Sequence[memoryview]) -> list[bool]:
        """Store whole records as framed (``trusted_records``: the checksum is not
        computed, every read checks it; the header's key becomes the store key). Committed when it
        returns (durable as ``sync`` says); per-key success, a key already present is
        kept and reported stored. May evict the least recent. ValueError, storing
        nothing, for a record that is not a whole record."""
        ...

    def store_records(self, keys: Sequence[bytes], records: Sequence[memoryview]) -> RecordsPut:
        """``put_records``, also telling per key whether the page stored now is this
        call's record (``written``; never True for a key held before, whose first page is
        kept). A store that cannot tell reports no key written."""
        ...

    def delete(self, keys: Sequence[bytes]) -> int:
        """Remove keys; how many were present (a failed delete may report 0)."""
        ...

    def stats(self) -> StorageStats:
        """Size and counters. Mutates nothing."""
        ...

    def close(self) -> None:
        """Release the store (idempotent)."""
        ...


class LmdbRecords(LmdbBackend):
    """An LMDB store as a ``RecordStore``: its puts do not say which keys they wrote, so
    ``store_records`` reports none (the daemon caches an LMDB store's pages on their
    second read only)."""

    def store_records(self, keys: Sequence[bytes], records: Sequence[memoryview]) -> RecordsPut:
        return RecordsPut(self.put_records(keys, records), [False] * len(keys))


Opener = Callable[[StorageConfig], RecordStore]

# The kinds of store the daemon can run on; ``StoreConfig.backend`` names one.
OPENERS: Mapping[str, Opener] = MappingProxyType({"lmdb": LmdbRecords, "disk": DiskBackend})


def open_record_store(config: StorageConfig) -> RecordStore:
    """The store at ``config.path``, opened as the kind it already holds
    (``store_kind.as_found``: an LMDB daemon store under ``backend = "disk"`` stays an
    LMDB store, logged, never replaced by an empty one); else as ``config.backend``.
    ValueError for a backend the daemon cannot run on; raises what opening raises."""
    found = as_found(config)
    opener = OPENERS.get(found.backend)
    if opener is None:
        raise ValueError(f"store.backend must be one of {tuple(OPENERS)}, got {found.backend!r}")
    store = opener(found)
    logger.info("store %s: %s, sync %s", found.store_dir(), found.backend, found.sync_level.value)
    return store
