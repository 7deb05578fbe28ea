"""The load-or-recompute choice: pure functions of the prompt's parts and the rates."""

from __future__ import annotations

import math

import hypothesis.strategies as st
import pytest
from hypothesis import given

from hicache.policies.prefetch import PREFETCH_POLICIES, StoragePlan, create_prefetch_policy
from hicache.policies.prefetch_cost import (
    JITTER_S,
    STALL_SHARE,
    CostSettings,
    LoadChoice,
    PrefixParts,
    break_even_s,
    choose,
)
from hicache.policies.rates import Rates, RatesSnapshot
from tests.hicache.fake_clock import FakeClock

MB = 1_000_000
BPT = 1024  # bytes of KV a token
PREFILL = 20_000.0  # tokens/s: 1k tokens (1 MB of KV) recompute in 50 ms
SETTINGS = CostSettings(margin=1.25, probe_after_s=30.0)


def rates(
    s2h: float | None, h2d: float | None = 10_000 * MB, prefill: float | None = PREFILL
) -> RatesSnapshot:
    """Rates measured at the given speeds (None: not measured)."""
    r = Rates(FakeClock())
    for _ in range(3):
        if s2h is not None:
            r.record_s2h(MB, MB / s2h)
        if h2d is not None:
            r.record_h2d(MB, MB / h2d)
        if prefill is not None:
            r.record_prefill(1000, 1000 / prefill)
    return r.snapshot()


def parts(device: int = 0, host: int = 0, storage: int = 2048) -> PrefixParts:
    return PrefixParts(device, host, storage, 16, BPT)


def test_a_fast_store_is_read_in_full() -> None:
    c = choose(parts(host=512), rates(s2h=1000 * MB), SETTINGS)
    assert (c.host, c.storage) == (512, 2048) and c.measured and not c.probe
    assert c.expected_s == pytest.approx(2048 * BPT / (1000 * MB), rel=1e-6)
    assert c.deadline_s is not None and c.expected_s < c.deadline_s


def test_a_hopeless_store_is_not_read_at_all() -> None:
    c = choose(parts(host=512), rates(s2h=0.1 * MB), SETTINGS)
    assert (c.host, c.storage) == (512, 0) and c.measured and c.deadline_s is None


def test_in_between_the_host_part_is_loaded_and_the_storage_part_recomputed() -> None:
    """Storage at 15 MB/s delivers 1k tokens in ~68 ms, recomputing takes 50 ms:
    only the host part (a fast H2D copy) arrives first."""
    c = choose(parts(host=1024, storage=1024), rates(s2h=15 * MB), SETTINGS)
    assert (c.host, c.storage) == (1024, 0)


def test_the_margin_keeps_a_near_tie_recomputed() -> None:
    """30 MB/s reads 2k tokens in 70 ms against 102 ms to recompute: a win by
    1.46x, loaded at margin 1.25, recomputed at margin 2."""
    snap = rates(s2h=30 * MB)
    assert choose(parts(), snap, CostSettings(margin=1.25)).storage == 2048
    assert choose(parts(), snap, CostSettings(margin=2.0)).storage == 0


def test_a_slow_host_link_is_not_loaded_either() -> None:
    c = choose(parts(host=1024, storage=0), rates(s2h=None, h2d=1 * MB), SETTINGS)
    assert c.host == 0 and c.measured


@pytest.mark.parametrize(
    "snap",
    [
        pytest.param(rates(s2h=None), id="store never read"),
        pytest.param(rates(s2h=0.1 * MB, prefill=None), id="no prefill speed"),
    ],
)
def test_cold_start_loads_everything_with_no_deadline_of_its_own(snap: RatesSnapshot) -> None:
    c = choose(parts(host=256), snap, SETTINGS)
    assert c == LoadChoice(256, 2048)
    assert c.deadline_s is None and not c.measured


def test_an_unmeasured_host_link_counts_as_free() -> None:
    """Loading host hits is what the cache always did; only storage needs measuring."""
    c = choose(parts(host=256), rates(s2h=1000 * MB, h2d=None), SETTINGS)
    assert (c.host, c.storage) == (256, 2048) and c.measured


def erratic(low: float, high: float) -> RatesSnapshot:
    """A store alternating between two speeds (their geometric mean on average)."""
    r = Rates(FakeClock())
    for i in range(20):
        r.record_s2h(MB, MB / (low if i % 2 else high))
        r.record_prefill(1000, 1000 / PREFILL)
    return r.snapshot()


def test_the_deadline_grows_with_the_spread_and_stops_at_break_even() -> None:
    steady = choose(parts(), rates(s2h=100 * MB), SETTINGS)
    shaky = choose(parts(), erratic(50 * MB, 200 * MB), SETTINGS)  # the same mean rate
    assert steady.deadline_s is not None and shaky.deadline_s is not None
    e, b = steady.expected_s, break_even_s(parts(), rates(s2h=100 * MB), 2048)
    assert steady.deadline_s == pytest.approx(max(e * 1.25 + JITTER_S, e + STALL_SHARE * b))
    assert shaky.deadline_s / shaky.expected_s > steady.deadline_s / steady.expected_s
    slow = erratic(25 * MB, 100 * MB)  # worth it on average, with little room for its spread
    near = choose(parts(), slow, SETTINGS)
    assert near.storage == 2048
    assert near.deadline_s == pytest.approx(break_even_s(parts(), slow, 2048))


def test_a_fast_read_is_not_cut_by_a_busy_machine() -> None:
    """Expected in 0.2 ms, it may take a tenth of recomputing (10 ms) before it is cut."""
    snap = rates(s2h=10_000 * MB)
    c = choose(parts(), snap, SETTINGS)
    assert c.deadline_s == pytest.approx(
        c.expected_s + STALL_SHARE * break_even_s(parts(), snap, 2048)
    )


def test_a_store_judged_too_slow_is_probed_once_its_measure_is_old() -> None:
    clock = FakeClock()
    r = Rates(clock)
    r.record_s2h(MB, 1.0)  # 1 MB/s
    r.record_prefill(1000, 1000 / PREFILL)
    assert choose(parts(), r.snapshot(), SETTINGS).storage == 0
    clock.advance(31.0)
    probe = choose(parts(), r.snapshot(), SETTINGS)
    assert probe.probe and probe.storage == 2048 // 16
    assert probe.deadline_s == pytest.approx(
        max(break_even_s(parts(), r.snapshot(), 128), JITTER_S)
    )
    r.record_s2h(MB, 1.0)  # the probe measured it: no more probes for a while
    assert choose(parts(), r.snapshot(), SETTINGS).storage == 0


def test_fixed_policies_load_everything_and_cost_decides() -> None:
    slow = rates(s2h=0.1 * MB)
    for name in ("best_effort", "wait_complete", "timeout"):
        policy = create_prefetch_policy(name)
        assert policy.plan(parts(), slow, SETTINGS) == LoadChoice(0, 2048)
        assert not policy.cuts
    cost = create_prefetch_policy("cost")
    assert cost.cuts and cost.plan(parts(), slow, SETTINGS).storage == 0
    assert set(PREFETCH_POLICIES) == {"best_effort", "wait_complete", "timeout", "cost"}


def test_a_plan_decides_on_what_storage_found() -> None:
    plan = StoragePlan(
        create_prefetch_policy("cost"), parts(storage=2048), rates(1000 * MB), SETTINGS
    )
    assert plan.pages(128) == 128 and plan.pages(5) == 5 and plan.pages(0) == 0
    assert plan.pages(500) == 128  # never more than was looked up


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        CostSettings(margin=0.9)
    with pytest.raises(ValueError):
        CostSettings(probe_after_s=0)


def _saving(p: PrefixParts, r: RatesSnapshot, host: int, storage: int, margin: float) -> float:
    """What loading ``host`` + ``storage`` tokens saves, loads weighed by ``margin``."""
    start, end = p.device, p.device + host + storage
    recompute = r.recompute_s(start, end)
    assert recompute is not None and r.s2h is not None and r.h2d is not None
    load = r.h2d.seconds_for((host + storage) * BPT) + r.s2h.seconds_for(storage * BPT)
    return recompute - margin * load


@given(
    device=st.integers(0, 4096),
    host=st.integers(0, 4096),
    storage=st.integers(0, 8192),
    s2h=st.floats(0.01 * MB, 10_000 * MB),
    h2d=st.floats(1 * MB, 100_000 * MB),
    prefill=st.floats(100.0, 1e6),
    margin=st.floats(1.0, 4.0),
)
def test_the_choice_saves_at_least_as_much_as_any_other_candidate(
    device: int, host: int, storage: int, s2h: float, h2d: float, prefill: float, margin: float
) -> None:
    p, r = parts(device, host, storage), rates(s2h=s2h, h2d=h2d, prefill=prefill)
    c = choose(p, r, CostSettings(margin=margin))
    assert c.measured and not c.probe
    assert c.host in (0, host) and c.storage in (0, storage)
    assert not c.storage or c.host == host  # storage pages hang below the host part
    got = _saving(p, r, c.host, c.storage, margin)
    for other in ((0, 0), (host, 0), (host, storage)):
        assert got >= _saving(p, r, *other, margin) - 1e-9
    if c.storage:
        assert c.deadline_s is not None and c.deadline_s >= JITTER_S
        assert c.deadline_s <= max(break_even_s(p, r, c.storage), JITTER_S) + 1e-12
        assert not math.isnan(c.expected_s)
