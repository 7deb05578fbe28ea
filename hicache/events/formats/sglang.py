"""KV events as SGLang's routers decode them.

Schema: ``python/sglang/srt/disaggregation/kv_events.py`` in sgl-project/sglang
(checked against the sglang 0.5.23 wheel). The batch is a positional array
``[ts, events, attn_dp_rank]`` declared without ``omit_defaults``, so the rank
is always present (nil here); each event is a msgspec-tagged map (``"type"`` =
class name) with defaults omitted, as vLLM's are.

Mapping of hicache's fields:

- block hashes: ``block_hash(page_key)``, an int64 -- SGLang derives its own
  the same way, from the first 8 bytes of a sha256 page hash;
- namespace -> ``cache_salt``: SGLang partitions its radix tree by an extra
  key built from the LoRA id and the request's cache salt, and the salt is the
  string half of it that events carry, so a router keys tenants by it. The
  integer ``lora_id`` is always None (a namespace is a string);
- medium, as SGLang's ``StorageMedium`` spells it: device -> ``"GPU"``, host ->
  ``"CPU_PINNED"``, storage -> ``"DISK"`` for a store on local disk (``disk``,
  ``lmdb``, ``file``) and ``"EXTERNAL"`` for any other (the daemon, Redis, a plugin).

Replay replies follow SGLang's publisher: ``[topic, seq, payload]`` per
batch, ended by ``[b"", END_SEQ, b""]`` (the same framing as vLLM's).
"""

from __future__ import annotations

import msgspec

from hicache.events.formats.base import StructFormat, block_hash, parent_hash
from hicache.events.kv import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

LOCAL_DISK_BACKENDS = ("disk", "lmdb", "file")


class SglangBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[SglangEvent]
    attn_dp_rank: int | None = None


class _Event(msgspec.Struct, omit_defaults=True, gc=False, tag_field="type"):
    """Base of SGLang's events: tagged maps, the tag being the class name."""


class SglangBlockStored(_Event, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None
    cache_salt: str | None = None
    session_id: str | None = None


class SglangBlockRemoved(_Event, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = None


class SglangAllBlocksCleared(_Event, tag="AllBlocksCleared"):
    pass


SglangEvent = SglangBlockStored | SglangBlockRemoved | SglangAllBlocksCleared


class SglangFormat(StructFormat[SglangBatch]):
    """SGLang's schema; ``storage_backend`` (a storage backend name) picks the
    medium storage pages are announced in."""

    name = "sglang"

    def __init__(self, storage_backend: str = "disk") -> None:
        storage = "DISK" if storage_backend in LOCAL_DISK_BACKENDS else "EXTERNAL"
        self.media = {"device": "GPU", "host": "CPU_PINNED", "storage": storage}
        super().__init__(SglangBatch)

    def convert(self, event: KVEvent) -> SglangEvent:
        if isinstance(event, BlockStored):
            return SglangBlockStored(
                block_hashes=[block_hash(k) for k in event.block_hashes],
                parent_block_hash=parent_hash(event.parent_block_hash),
                token_ids=list(event.token_ids),
                block_size=event.block_size,
                lora_id=None,
                medium=self.media[event.medium],
                cache_salt=event.namespace,
            )
        if isinstance(event, BlockRemoved):
            hashes = [block_hash(k) for k in event.block_hashes]
            return SglangBlockRemoved(hashes, self.media[event.medium])
        if isinstance(event, AllBlocksCleared):
            return SglangAllBlocksCleared()
        raise ValueError(f"not a KV event: {event!r}")
