"""Block planning, and a property test of late, out-of-order delivery."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.transfer.transfer_helpers import make_pools, make_shape, randomize
from transfer import CpuTransferEngine, FaultInjection, TransferOp
from transfer.plan import make_plan


def plan_for(dev_slots: list[int], host_slots: list[int], dev_page: int, host_page: int):
    op = TransferOp("d2h", torch.tensor(dev_slots), torch.tensor(host_slots))
    return make_plan(op, 64, dev_page, 64, host_page)


def test_whole_pages_move_as_page_blocks():
    plan = plan_for([*range(32, 48), *range(0, 16)], [*range(16, 32), *range(48, 64)], 16, 16)
    assert plan.block_tokens == 16 and plan.num_tokens == 32
    assert plan.device_blocks.tolist() == [2, 0]
    assert plan.host_pages.tolist() == [1, 3] and plan.host_offsets.tolist() == [0, 0]


def test_smaller_device_pages_use_their_size_inside_host_pages():
    plan = plan_for([*range(8, 12), *range(40, 44)], [*range(16, 20), *range(20, 24)], 4, 16)
    assert plan.block_tokens == 4
    assert plan.device_blocks.tolist() == [2, 10]
    assert plan.host_pages.tolist() == [1, 1] and plan.host_offsets.tolist() == [0, 1]


def test_unaligned_slots_fall_back_to_tokens():
    plan = plan_for([1, 2, 3, 4], [0, 1, 2, 3], 4, 4)
    assert plan.block_tokens == 1
    assert plan.host_pages.tolist() == [0, 0, 0, 0] and plan.host_offsets.tolist() == [0, 1, 2, 3]


ops = st.lists(
    st.tuples(st.sampled_from(["d2h", "h2d"]), st.integers(0, 7), st.integers(0, 7)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, releases=st.lists(st.integers(0, 5), max_size=6), seed=st.integers(0, 2**16))
def test_every_completion_is_delivered_exactly_once(
    ops: list[tuple[str, int, int]], releases: list[int], seed: int
):
    dev, host = make_pools(make_shape(layers=2), 4, "page_first", pages=8)
    randomize(dev, seed)
    faults = FaultInjection(hold=True, reorder=True, jitter_s=0.001, fail_every=5, seed=seed)
    with CpuTransferEngine(dev, host, num_workers=2, faults=faults) as engine:
        submitted = []
        for i, (kind, dev_page, host_page) in enumerate(ops):
            d = torch.arange(dev_page * 4, dev_page * 4 + 4)
            h = torch.arange(host_page * 4, host_page * 4 + 4)
            submitted.append(engine.submit(TransferOp(kind, d, h)))  # type: ignore[arg-type]
            if i % 3 == 2:
                engine.start_loading()
        engine.start_loading()
        delivered = []
        for n in releases:
            engine.release(n)
            delivered += engine.poll()
        engine.release(len(submitted) - len(delivered), timeout=30.0)
        delivered += engine.poll()
        delivered += [engine.wait(i, 30.0) for i in engine_undelivered(submitted, delivered)]
        assert sorted(c.op_id for c in delivered) == submitted
        assert all(c.ok == (c.op_id % 5 != 0) for c in delivered)
        assert all(c.nbytes == (4 * dev.shape.bytes_per_token if c.ok else 0) for c in delivered)
        assert engine.pending() == 0 and engine.poll() == []


def engine_undelivered(submitted: list[int], delivered: list) -> list[int]:
    seen = {c.op_id for c in delivered}
    return [i for i in submitted if i not in seen]
