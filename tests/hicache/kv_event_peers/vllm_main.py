"""vLLM main: ``vllm/distributed/kv_events.py`` (vllm-project/vllm), the
version with typed extra keys, ``event_version`` and ``ownership``."""

from __future__ import annotations

from typing import Any

import msgspec

ExternalBlockHash = bytes | int


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class ExtraKey(msgspec.Struct, gc=False, frozen=True, tag=True):
    pass


class LoRAKey(ExtraKey, frozen=True, tag="lora"):
    name: str


class CacheSaltKey(ExtraKey, frozen=True, tag="cache_salt"):
    salt: str


class PromptEmbedsKey(ExtraKey, frozen=True, tag="prompt_embeds"):
    hash: bytes


class MultiModalKey(ExtraKey, frozen=True, tag="mm"):
    modality: str
    hash: str
    block_offset: int


class LegacyExtraKey(ExtraKey, frozen=True, tag="legacy"):
    value: Any


ExtraKeyUnion = ExtraKey | LoRAKey | CacheSaltKey | PromptEmbedsKey | MultiModalKey | LegacyExtraKey


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    event_version: int = 1
    extra_keys: list[tuple[ExtraKeyUnion, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


MEDIA = {"GPU", "CPU", "STORAGE"}
