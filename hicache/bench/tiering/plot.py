"""The tiering bench's figure: hit rate per round, the per-tier split, bytes per link.

Colours carry one meaning each, the same in every panel: a set-up always has
its own colour (lines, bars and tick labels), a tier its own (the stacked
split). Lines that coincide stay visible: each set-up has its own marker and
a small sideways offset, and a row of zeros ("no cache") is drawn and
labelled rather than left as an invisible bar.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from hicache.bench.tiering.serving import TierReport

# Tiers: warm-to-cold, distinct from every set-up colour below.
TIER_COLOURS = {"device": "#2ca02c", "host": "#ff7f0e", "storage": "#9467bd"}
# Set-ups in the order the bench runs them (the --engines 2 rows last).
SETUP_STYLES = (
    ("#7f7f7f", "x"),  # no cache
    ("#1f77b4", "o"),
    ("#17becf", "s"),
    ("#d62728", "D"),
    ("#8c564b", "^"),
    ("#e377c2", "v"),
)
LINK_NAMES = {
    "d2h": "device→host\n(backups)",
    "h2d": "host→device\n(load-backs)",
    "h2s": "host→storage\n(writes)",
    "s2h": "storage→host\n(prefetches)",
}


class Style(NamedTuple):
    colour: str
    marker: str


def styles(reports: list[TierReport]) -> dict[str, Style]:
    """One colour and marker per set-up, by position (cycled past six)."""
    return {r.name: Style(*SETUP_STYLES[i % len(SETUP_STYLES)]) for i, r in enumerate(reports)}


def plot(reports: list[TierReport], path: Path, workload: str, round_meaning: str) -> None:
    """Write a three-panel PNG to ``path`` (needs matplotlib, hicache[bench])."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    look = styles(reports)
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.2))
    _per_round(axes[0], reports, look, round_meaning)
    _split(axes[1], reports, look)
    _links(axes[2], reports, look)
    fig.suptitle(f"hicache tiering: {workload} workload, same device capacity in every set-up")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _per_round(ax: Axes, reports: list[TierReport], look: dict[str, Style], meaning: str) -> None:
    n = len(reports)
    for i, r in enumerate(reports):
        shift = (i - (n - 1) / 2) * 0.06  # coinciding lines sit side by side
        rounds = [k + 1 + shift for k in range(len(r.hit_rate_by_round))]
        s = look[r.name]
        ax.plot(rounds, r.hit_rate_by_round, color=s.colour, marker=s.marker, markersize=6,
                linewidth=1.6, label=r.name, clip_on=False, zorder=3 + i)  # fmt: skip
    ax.set_xticks(range(1, max(len(r.hit_rate_by_round) for r in reports) + 1))
    ax.set_xlabel(f"round r = {meaning}")
    ax.set_ylabel("share of the round's prompt tokens served from cache")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("hit rate per round (colour, marker = set-up)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")


def _split(ax: Axes, reports: list[TierReport], look: dict[str, Style]) -> None:
    xs = range(len(reports))
    bottom = [0.0] * len(reports)
    for tier, colour in TIER_COLOURS.items():
        values = [r.hit_rate_by_tier[tier] for r in reports]
        ax.bar(xs, values, 0.6, bottom=bottom, color=colour, label=f"from {tier}")
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    for x, total in zip(xs, bottom, strict=True):
        ax.annotate(f"{total:.0%}", (x, total), ha="center", va="bottom", fontsize=8,
                    xytext=(0, 2), textcoords="offset points")  # fmt: skip
    _setup_ticks(ax, reports, look, xs)
    ax.set_ylabel("share of prompt tokens (whole run)")
    ax.set_ylim(0, 1.08)
    ax.set_title("where the hits came from (colour = tier)")
    ax.legend(fontsize=8, loc="upper left")


def _links(ax: Axes, reports: list[TierReport], look: dict[str, Style]) -> None:
    width = 0.8 / len(reports)
    top = max((v for r in reports for v in r.bytes_moved.values()), default=0) / 2**20
    for i, r in enumerate(reports):
        xs = [j + (i - (len(reports) - 1) / 2) * width for j in range(len(LINK_NAMES))]
        mib = [r.bytes_moved[link] / 2**20 for link in LINK_NAMES]
        s = look[r.name]
        ax.bar(xs, mib, width, color=s.colour, label=r.name)
        for x, v in zip(xs, mib, strict=True):
            if v == 0:  # a zero bar is invisible: mark it
                ax.plot(x, 0, marker=s.marker, color=s.colour, markersize=5, clip_on=False)
    ax.set_xticks(range(len(LINK_NAMES)), list(LINK_NAMES.values()), fontsize=8)
    ax.set_ylabel("MiB moved (whole run)")
    ax.set_ylim(0, max(top, 1.0) * 1.45)  # headroom: the legend never covers a bar
    ax.set_title("bytes moved per link (colour = set-up; marker: none moved)")
    ax.legend(fontsize=8, loc="upper left")


def _setup_ticks(ax: Axes, reports: list[TierReport], look: dict[str, Style], xs: range) -> None:
    names = [r.name.replace("+", "+\n") if len(r.name) > 12 else r.name for r in reports]
    ax.set_xticks(xs, names, fontsize=8)
    for label, r in zip(ax.get_xticklabels(), reports, strict=True):
        label.set_color(look[r.name].colour)
        label.set_fontweight("bold")
