"""KV events as vLLM's routers decode them.

Schema: ``vllm/distributed/kv_events.py`` in vllm-project/vllm (checked against
the vllm 0.33.0 wheel: the tests decode with its Structs). The batch is a
positional array ``[ts, events]`` (``data_parallel_rank`` is a trailing
default that is never set here); each event is a msgpack map
whose ``"type"`` key names the event class, with fields left at their default
omitted. Fields that vLLM declares with defaults and that hicache never sets
(``extra_keys``, ``group_idx``, ``kv_cache_spec_*``, ``locality``, ``ownership``,
``session_id``, ``lookahead_token_ids``) are left out of these Structs: with
``omit_defaults`` they would not appear on the wire anyway, and a map-decoding
peer fills them with its own defaults.

Mapping of hicache's fields:

- block hashes: ``block_hash(page_key)``, an int64 (vLLM accepts ints or bytes);
- namespace -> ``lora_name``: vLLM folds the LoRA name into its block hashes,
  so it is the field by which a vLLM router tells apart equal tokens cached
  under different adapters, which is what a namespace does here. The
  deprecated integer ``lora_id`` is always None (a namespace is a string);
- medium: device -> ``"GPU"``, host -> ``"CPU"``, storage -> ``"STORAGE"``
  (vLLM's ``MEDIUM_GPU`` / ``MEDIUM_CPU`` / ``MEDIUM_STORAGE``).

Replay replies carry the topic, as vLLM's publisher sends them:
``[topic, seq, payload]``, ended by ``[b"", END_SEQ, b""]``.
"""

from __future__ import annotations

import msgspec

from hicache.events.formats.base import StructFormat, block_hash, parent_hash
from hicache.events.kv import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

MEDIA = {"device": "GPU", "host": "CPU", "storage": "STORAGE"}


class VllmBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[VllmEvent]
    data_parallel_rank: int | None = None


class _Event(msgspec.Struct, omit_defaults=True, gc=False, tag_field="type"):
    """Base of vLLM's events: tagged maps, the tag being the class name."""


class VllmBlockStored(_Event, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class VllmBlockRemoved(_Event, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class VllmAllBlocksCleared(_Event, tag="AllBlocksCleared"):
    pass


VllmEvent = VllmBlockStored | VllmBlockRemoved | VllmAllBlocksCleared


class VllmFormat(StructFormat[VllmBatch]):
    """vLLM's schema; ``storage_backend`` is accepted for the registry's one
    constructor shape (vLLM names every storage tier ``STORAGE``)."""

    name = "vllm"

    def __init__(self, storage_backend: str = "") -> None:
        super().__init__(VllmBatch)

    def convert(self, event: KVEvent) -> VllmEvent:
        if isinstance(event, BlockStored):
            return VllmBlockStored(
                block_hashes=[block_hash(k) for k in event.block_hashes],
                parent_block_hash=parent_hash(event.parent_block_hash),
                token_ids=list(event.token_ids),
                block_size=event.block_size,
                lora_id=None,
                medium=MEDIA[event.medium],
                lora_name=event.namespace,
            )
        if isinstance(event, BlockRemoved):
            hashes = [block_hash(k) for k in event.block_hashes]
            return VllmBlockRemoved(hashes, MEDIA[event.medium])
        if isinstance(event, AllBlocksCleared):
            return VllmAllBlocksCleared()
        raise ValueError(f"not a KV event: {event!r}")
