"""tiering.png: a colour means one set-up or one tier, in every panel, and
nothing drawn is hidden (zero rows marked, coinciding lines offset)."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

from hicache.bench.tiering.bench import TierReport
from hicache.bench.tiering.plot import TIER_COLOURS, plot, styles

TIERS = ("device", "host", "storage")
LINKS = ("d2h", "h2d", "h2s", "s2h")


def report(name: str, rate: float) -> TierReport:
    return TierReport(
        name=name,
        hit_rate=rate,
        hit_rate_by_tier={"device": rate, "host": 0.0, "storage": 0.0},
        prefill_tokens_saved=0,
        bytes_moved=dict.fromkeys(LINKS, 1 << 20 if rate else 0),
        cache_ms_per_request=0.0,
        peak_bytes=dict.fromkeys(TIERS, 0),
        hit_rate_by_round=[rate, rate],
        hit_rate_by_round_by_tier={t: [0.0, 0.0] for t in TIERS},
    )


NAMES = ["no cache", "device", "device+host", "device+host+storage", "2 a", "2 b"]


def test_each_set_up_has_its_own_colour_and_marker_apart_from_the_tiers() -> None:
    look = styles([report(n, 0.5) for n in NAMES])
    colours = [s.colour for s in look.values()]
    assert len(set(colours)) == len(NAMES)
    assert not set(colours) & set(TIER_COLOURS.values())
    assert len({s.marker for s in look.values()}) == len(NAMES)


def test_every_panel_draws_a_set_up_in_its_colour(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    reports = [report("no cache", 0.0), report("device", 0.4), report("device+host", 0.4)]
    look = styles(reports)
    with mock.patch.object(plt, "close"):  # keep the figure to inspect it
        plot(reports, tmp_path / "t.png", "multiturn", "turn r")
        fig = plt.gcf()
    rounds, split, links = fig.axes
    lines = {line.get_label(): line for line in rounds.get_lines()}
    for r in reports:
        assert lines[r.name].get_color() == look[r.name].colour
    xs = {name: tuple(lines[name].get_xdata()) for name in ("device", "device+host")}
    assert xs["device"] != xs["device+host"], "coinciding lines must not overlap exactly"
    ticks = {t.get_text().replace("\n", ""): t.get_color() for t in split.get_xticklabels()}
    assert ticks == {r.name: look[r.name].colour for r in reports}
    assert {t.get_text() for t in split.texts} >= {"0%", "40%"}  # the empty row is labelled
    zero_marks = [line for line in links.get_lines() if line.get_color() == look["no cache"].colour]
    assert len(zero_marks) == len(LINKS)  # "no cache" moved nothing, and says so on every link
    plt.close(fig)
    assert (tmp_path / "t.png").stat().st_size > 0
