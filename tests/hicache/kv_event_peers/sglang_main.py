"""SGLang 0.5.23: ``python/sglang/srt/disaggregation/kv_events.py``
(sgl-project/sglang, read from the released wheel). The envelope has no
``omit_defaults``; events are tagged maps with defaults omitted; media are
``StorageMedium``'s values."""

from __future__ import annotations

import enum
from typing import Any, Optional, Union

import msgspec


class EventBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[Any]
    attn_dp_rank: Optional[int] = None  # noqa: UP045 -- declared as the peer does


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class StorageMedium(str, enum.Enum):  # noqa: UP042 -- declared as the peer does
    GPU = "GPU"
    CPU = "CPU_PINNED"
    DISK = "DISK"
    EXTERNAL = "EXTERNAL"


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: Optional[int]  # noqa: UP045
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]  # noqa: UP045
    medium: Optional[str] = None  # noqa: UP045
    cache_salt: Optional[str] = None  # noqa: UP045
    session_id: Optional[str] = None  # noqa: UP045
    lora_name: Optional[str] = None  # noqa: UP045


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: Optional[str] = None  # noqa: UP045


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]  # noqa: UP007


MEDIA = {m.value for m in StorageMedium}
