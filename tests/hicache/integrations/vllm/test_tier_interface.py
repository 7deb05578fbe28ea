"""Every public method of vLLM's ``SecondaryTierManager`` at the pinned release is either
implemented by ``HicacheTier`` or inherited on purpose (listed below with why), so that a
release bump that adds a method fails here and shows what is new."""

from __future__ import annotations

import inspect

from vllm.v1.kv_offload.tiering.base import SecondaryTierManager

from hicache.integrations.vllm import HicacheTier

# Inherited on purpose: name -> why the base class's behaviour is right for us.
INHERITED = {
    "block_size_bytes": "the chunk size vLLM's view gives; read as is",
    "bp_detector": "vLLM's backpressure detector, kept as vLLM passed it",
    "touch": "the store updates recency on every read; a touch would cost a round trip",
    "serve_external_requests": "no remote peer drives this tier",
}


def public_members(cls: type) -> set[str]:
    return {
        n
        for n, v in inspect.getmembers(cls)
        if not n.startswith("_")
        and (callable(v) or isinstance(inspect.getattr_static(cls, n), property))
    }


def test_every_base_method_is_implemented_or_inherited_on_purpose() -> None:
    base = public_members(SecondaryTierManager)
    ours = {n for n in base if n in HicacheTier.__dict__}
    unaccounted = base - ours - set(INHERITED)
    assert not unaccounted, f"new in vLLM's SecondaryTierManager: implement or list {unaccounted}"
    assert not set(INHERITED) & ours, "listed as inherited but implemented"
    assert set(INHERITED) <= base, "listed but gone from the base"
