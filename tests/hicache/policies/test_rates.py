"""Measured rates: moving bandwidth and prefill estimates, on a fake clock."""

from __future__ import annotations

import math

import pytest

from hicache.policies.rates import BandwidthMeter, PrefillMeter, Rates, bucket_of, format_rates
from tests.hicache.fake_clock import FakeClock

MB = 1_000_000


def test_nothing_measured_is_none() -> None:
    rates = Rates(FakeClock())
    snap = rates.snapshot()
    assert snap.h2d is None and snap.s2h is None and snap.prefill == ()
    assert snap.prefill_tokens_per_s(1000) is None and snap.recompute_s(0, 100) is None
    assert "not measured yet" in "\n".join(format_rates(snap))


def test_one_transfer_is_its_own_rate() -> None:
    meter = BandwidthMeter()
    meter.record(4 * MB, 0.5, at=3.0)
    est = meter.estimate()
    assert est is not None
    assert est.bytes_per_s == pytest.approx(8 * MB) and est.spread == 0
    assert est.samples == 1 and est.last_at == 3.0
    assert est.seconds_for(16 * MB) == pytest.approx(2.0)


@pytest.mark.parametrize(("before", "after"), [(100 * MB, 5 * MB), (5 * MB, 100 * MB)])
def test_the_estimate_follows_a_store_that_slows_down_or_speeds_up(
    before: float, after: float
) -> None:
    meter = BandwidthMeter()
    for _ in range(10):
        meter.record(MB, MB / before, at=0.0)
    for i in range(1, 13):
        meter.record(MB, MB / after, at=float(i))
        est = meter.estimate()
        assert est is not None
        if i >= 10:  # within a few requests it says what the store does now
            assert est.bytes_per_s == pytest.approx(after, rel=0.1)
    assert est.spread < abs(before - after)  # the change has passed


def test_a_steady_link_has_no_spread_and_an_erratic_one_has() -> None:
    steady, erratic = BandwidthMeter(), BandwidthMeter()
    for i in range(20):
        steady.record(MB, 0.01, at=i)
        erratic.record(MB, 0.005 if i % 2 else 0.02, at=i)
    s, e = steady.estimate(), erratic.estimate()
    assert s is not None and e is not None
    assert s.spread == pytest.approx(0, abs=1e-6) and e.variation > 0.3


def test_an_old_estimate_gives_way_to_a_new_transfer() -> None:
    """After a quiet spell the next transfer says most of what the link does now."""
    fresh, stale = BandwidthMeter(), BandwidthMeter()
    for meter, gap in ((fresh, 0.0), (stale, 30.0)):
        for _ in range(10):
            meter.record(MB, 1.0, at=0.0)  # 1 MB/s
        meter.record(MB, 0.01, at=gap)  # 100 MB/s
    f, s = fresh.estimate(), stale.estimate()
    assert f is not None and s is not None
    assert f.bytes_per_s < 5 * MB  # one transfer among recent ones moves it 30% (in log)
    assert s.bytes_per_s > 50 * MB  # three half-lives old: the new one weighs 7/8


def test_a_stalled_transfer_lowers_the_estimate() -> None:
    meter = BandwidthMeter()
    meter.record(MB, 0.01, at=0)
    meter.record(0, 1.0, at=1)  # cut after a second with nothing arrived
    est = meter.estimate()
    assert est is not None and est.bytes_per_s < 3 * MB


@pytest.mark.parametrize(("nbytes", "seconds"), [(-1, 0.1), (10, -0.1), (10, math.inf)])
def test_bad_transfers_are_refused(nbytes: int, seconds: float) -> None:
    with pytest.raises(ValueError):
        BandwidthMeter().record(nbytes, seconds, at=0)


def test_prefill_speed_is_kept_per_pass_size() -> None:
    meter = PrefillMeter()
    meter.record(1000, 0.01, at=0)  # 100k tokens/s computing ~1k
    meter.record(8000, 0.4, at=0)  # 20k tokens/s computing ~8k
    points = meter.points()
    assert [p.length for p in points] == [1024, 8192]
    rates = Rates(FakeClock())
    rates.prefill = meter
    snap = rates.snapshot()
    assert snap.prefill_tokens_per_s(900) == pytest.approx(100_000)
    assert snap.prefill_tokens_per_s(7000) == pytest.approx(20_000)
    assert snap.prefill_tokens_per_s(3000) == pytest.approx(20_000)  # nearest; the longer on a tie
    assert snap.prefill_tokens_per_s(10**7) == pytest.approx(20_000)
    assert snap.recompute_s(0, 1000) == pytest.approx(0.01)
    assert snap.recompute_s(500, 500) == 0.0


def test_the_config_prefill_speed_stands_in_until_one_is_measured() -> None:
    rates = Rates(FakeClock(), prefill_fallback=5000.0)
    assert rates.snapshot().recompute_s(0, 500) == pytest.approx(0.1)
    rates.record_prefill(500, 0.005)
    assert rates.snapshot().recompute_s(0, 500) == pytest.approx(0.005)


def test_buckets_cover_every_length() -> None:
    assert bucket_of(0) == bucket_of(1) == bucket_of(16) == 0
    assert bucket_of(17) == 1 and bucket_of(10**12) == bucket_of(1 << 24)


def test_the_snapshot_carries_the_clock_and_prints() -> None:
    clock = FakeClock(50.0)
    rates = Rates(clock, backend="disk")
    rates.record_s2h(10 * MB, 0.1)
    rates.record_h2d(10 * MB, 0.001)
    rates.record_prefill(256, 0.01)
    clock.advance(7.0)
    snap = rates.snapshot()
    assert snap.at == 57.0 and snap.s2h is not None and snap.at - snap.s2h.last_at == 7.0
    text = "\n".join(format_rates(snap))
    assert "s2h disk" in text and "100.0 MB/s" in text and "7.0 s ago" in text
    assert "prefill <=256" in text and "25600 tokens/s" in text
