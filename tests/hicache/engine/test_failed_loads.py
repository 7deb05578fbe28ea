"""Every load-back failing: the engine still finishes with the reference's outputs."""

from __future__ import annotations

import dataclasses
import random

from hicache.cache import HiRadixCache
from hicache.engine import Engine, EngineOptions, Request, TinyLlama
from hicache.factory import build_device_pool, build_host_pool
from tests.hicache.engine.helpers import (
    SPEC,
    assert_same,
    config,
    generate,
    push_to_host,
    reference,
    tokens,
)
from transfer import CpuTransferEngine, FaultInjection


@dataclasses.dataclass(frozen=True)
class Switchable(FaultInjection):
    """Fails every op once switched on (a broken copy path, not a blip)."""

    on: list[bool] = dataclasses.field(default_factory=lambda: [False])

    def fails(self, op_id: int) -> bool:
        return self.on[0]


def test_persistently_failing_loads_fall_back_to_recompute() -> None:
    rng = random.Random(5)
    shared = tokens(rng, 40)
    a = Request("A", tuple(shared + tokens(rng, 8)), 2)
    b = Request("B", tuple(tokens(rng, 80)), 1)  # does not fit beside A: admission drains
    want = reference().generate([a, b])
    cfg = config(1, 96, host=True)
    device = build_device_pool(cfg)
    host = build_host_pool(cfg, device)
    assert host is not None
    faults = Switchable()
    cache = HiRadixCache(cfg, device, host, CpuTransferEngine(device, host, faults=faults))
    eng = Engine(TinyLlama(SPEC), cache, EngineOptions(chunk_size=64))
    generate(eng, [Request("X", tuple(shared), 1)])
    push_to_host(cache)
    for layer in range(device.shape.num_layers):  # freed slots hold junk
        for buf in device.layer_buffers(layer):
            buf.fill_(3.0)
    faults.on[0] = True
    got = generate(eng, [a, b])
    assert_same(got, want)
    cache.close()
