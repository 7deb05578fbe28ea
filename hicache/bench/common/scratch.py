"""A bench's scratch pages in a shared network store: removed when it is done.

A path store (lmdb, file) lives in a temporary directory that goes away by
itself; a network store is shared, so the bench writes under a key prefix of
its own (``tiering.storage_setup``) and deletes that prefix afterwards.
"""

from __future__ import annotations

import logging

from storage_backends import StorageConfig

logger = logging.getLogger(__name__)


def release_scratch(storage: StorageConfig) -> str | None:
    """Remove what the bench wrote under ``storage.key_prefix``; a line saying
    what happened (None for a store that needs nothing removed)."""
    prefix = storage.key_prefix
    if storage.backend == "redis":
        from redis.exceptions import RedisError

        from storage_backends.errors import StorageOpenError
        from storage_backends.redis.backend import delete_prefix

        try:
            n = delete_prefix(storage)
        except (RedisError, StorageOpenError, OSError) as exc:
            logger.warning("could not remove the bench's redis keys: %r", exc)
            return f"left the bench's keys under '{prefix}:*' in the cluster (removal failed)"
        return f"removed the bench's {n:,} keys under '{prefix}:*' from the cluster"
    if storage.backend == "mooncake":  # a Mooncake Store cannot be listed
        return f"the bench's pages stay in Mooncake under the fresh key prefix '{prefix}'"
    return None
