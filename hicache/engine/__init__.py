"""The reference engine: a tiny Llama-style model and a scheduler loop around HiRadixCache."""

from hicache.engine.model import ModelSpec, Segment, TinyLlama
from hicache.engine.request import Request, RequestOutput, TierHits
from hicache.engine.scheduler import Engine, EngineOptions

__all__ = [
    "Engine",
    "EngineOptions",
    "ModelSpec",
    "Request",
    "RequestOutput",
    "Segment",
    "TierHits",
    "TinyLlama",
]
