"""The trace replay's figure: hit rates against the bound, the capacity curve, the links, the disk.

Four panels: where each set-up's hits came from with the trace's bound
marked; hit rate against storage capacity (the sweep), with the device-only,
device + host and bound levels as lines; each link's demand (mean bar, p99
tick); and the storage links' demand window by window for the largest
storage set-up, next to what the store measured. A set-up keeps its colour
in every panel, a tier its own (``tiering_plot``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from hicache.bench.tiering.plot import SETUP_STYLES, TIER_COLOURS
from hicache.bench.tiering.serving import LINKS, TIERS
from hicache.bench.tiering.trace.rates import gbps_series

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from hicache.bench.tiering.trace.probe import StoreRate
    from hicache.bench.tiering.trace.replay import ReplayResult
    from hicache.bench.tiering.trace.report import Context, SetupFigures

LINK_LABELS = {
    "d2h": "device→host",
    "h2d": "host→device",
    "h2s": "host→storage",
    "s2h": "storage→host",
}


class StorageSeries(NamedTuple):
    """GB/s per window of the storage links of one set-up."""

    name: str
    window_s: float
    write: np.ndarray
    read: np.ndarray


def storage_series(results: list[ReplayResult], ctx: Context) -> StorageSeries | None:
    """The windows of the set-up with the most storage (None without storage rows)."""
    stored = [r for r in results if r.sizes.storage]
    if not stored:
        return None
    top = max(stored, key=lambda r: r.sizes.storage)
    bpt = ctx.model.bytes_per_token
    write = gbps_series(top.moved["h2s"], ctx.windows, ctx.window_s, bpt)
    read = gbps_series(top.moved["s2h"], ctx.windows, ctx.window_s, bpt)
    return StorageSeries(top.name, ctx.window_s, write, read)


def _colour(i: int) -> str:
    return SETUP_STYLES[(i + 1) % len(SETUP_STYLES)][0]  # the first style is "no cache"'s grey


def plot(
    figures: list[SetupFigures],
    series: StorageSeries | None,
    stores: list[StoreRate],
    title: str,
    path: Path,
) -> None:
    """Write the four-panel PNG to ``path`` (needs matplotlib, hicache[bench])."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(16, 11))
    _split(axes[0][0], figures)
    _capacity(axes[0][1], figures)
    _links(axes[1][0], figures)
    _windows(axes[1][1], series, stores)
    fig.suptitle(f"hicache tiering on a trace: {title}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _split(ax: Axes, figures: list[SetupFigures]) -> None:
    xs = np.arange(len(figures))
    bottom = np.zeros(len(figures))
    for tier in TIERS:
        values = np.array([f.hit_rate_by_tier[tier] for f in figures])
        ax.bar(xs, values, 0.6, bottom=bottom, color=TIER_COLOURS[tier], label=f"from {tier}")
        bottom += values
    for x, f in zip(xs, figures, strict=True):
        ax.hlines(f.bound_hit_rate, x - 0.38, x + 0.38, colors="black", linestyles="--")
        ax.annotate(f"{f.hit_rate:.1%}", (x, f.hit_rate), ha="center", va="bottom", fontsize=8,
                    xytext=(0, 2), textcoords="offset points")  # fmt: skip
    ax.plot([], [], "k--", label="unbounded-capacity bound")
    names = [f.name.replace(" + ", "\n+ ") for f in figures]
    ax.set_xticks(xs, names, fontsize=7)
    for i, label in enumerate(ax.get_xticklabels()):
        label.set_color(_colour(i))
    ax.set_ylabel("share of all prompt tokens served from cache")
    ax.set_ylim(0, max(max(f.bound_hit_rate for f in figures) * 1.3, 0.05))
    ax.set_title("hit rate per set-up, by tier (colour = tier)")
    ax.legend(fontsize=8, loc="upper left")


def _capacity(ax: Axes, figures: list[SetupFigures]) -> None:
    stored = [(i, f) for i, f in enumerate(figures) if f.tokens["storage"]]
    groups: dict[tuple[int, int], list[tuple[int, SetupFigures]]] = {}
    for i, f in stored:
        groups.setdefault((f.tokens["device"], f.tokens["host"]), []).append((i, f))
    for members in groups.values():
        xs = [f.tokens["storage"] for _, f in members]
        ys = [f.hit_rate for _, f in members]
        label = members[0][1].name.rsplit(" + storage", 1)[0] + " + storage"
        ax.plot(xs, ys, "-", color="#444444", linewidth=1, label=label)
        for (i, _), x, y in zip(members, xs, ys, strict=True):
            ax.plot(x, y, "o", color=_colour(i), markersize=8)
            ax.annotate(f"{y:.1%}", (x, y), fontsize=8, xytext=(4, -12), textcoords="offset points")
    levels = [
        (f.hit_rate, f.name, _colour(i)) for i, f in enumerate(figures) if not f.tokens["storage"]
    ]
    for rate, name, colour in levels:
        ax.axhline(rate, color=colour, linestyle=":", linewidth=1.2, label=f"{name} (no storage)")
    ax.axhline(figures[0].bound_hit_rate, color="black", linestyle="--", label="unbounded bound")
    if stored:
        ax.set_xscale("log")
    ax.set_xlabel("storage capacity (tokens)")
    ax.set_ylabel("hit rate (all tiers)")
    ax.set_ylim(0, max(figures[0].bound_hit_rate * 1.3, 0.05))
    ax.set_title("hit rate against storage capacity")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")


def _links(ax: Axes, figures: list[SetupFigures]) -> None:
    width = 0.8 / len(figures)
    for i, f in enumerate(figures):
        xs = [j + (i - (len(figures) - 1) / 2) * width for j in range(len(LINKS))]
        means = [f.link_gbps[k].mean for k in LINKS]
        p99 = [f.link_gbps[k].p99 for k in LINKS]
        ax.bar(xs, means, width, color=_colour(i), label=f.name)
        ax.plot(xs, p99, "_", color="black", markersize=10, markeredgewidth=2)
        for x, v in zip(xs, means, strict=True):
            if v == 0:  # a zero bar is invisible: mark it
                ax.plot(x, 0, "o", color=_colour(i), markersize=4, clip_on=False)
    ax.plot([], [], "_", color="black", markeredgewidth=2, label="p99 window")
    ax.set_xticks(range(len(LINKS)), [LINK_LABELS[k] for k in LINKS])
    ax.set_ylabel("GB/s the link must sustain (bar: mean, tick: p99)")
    ax.set_title("link demand at the trace's arrival rate (colour = set-up)")
    ax.legend(fontsize=7, loc="upper right")


def _windows(ax: Axes, series: StorageSeries | None, stores: list[StoreRate]) -> None:
    if series is None:
        ax.text(0.5, 0.5, "no storage set-up", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    minutes = np.arange(len(series.write)) * series.window_s / 60
    ax.plot(
        minutes, series.write, color="#d62728", linewidth=0.8, label="host→storage (disk writes)"
    )
    ax.plot(minutes, series.read, color="#1f77b4", linewidth=0.8, label="storage→host (disk reads)")
    for k, store in enumerate(stores):  # a store's write and read differ in dash too
        styles = (("-", (0, (6, 3))), ((0, (1, 2)), (0, (4, 2, 1, 2))))[k % 2]
        if store.write_gbps is not None:
            ax.axhline(store.write_gbps, color="#d62728", linestyle=styles[0], linewidth=1.4,
                       label=f"{store.source}: write {store.write_gbps:.2f} GB/s")  # fmt: skip
        if store.read_gbps is not None:
            ax.axhline(store.read_gbps, color="#1f77b4", linestyle=styles[1], linewidth=1.4,
                       label=f"{store.source}: read {store.read_gbps:.2f} GB/s")  # fmt: skip
    ax.set_xlabel("minutes into the trace")
    ax.set_ylabel(f"GB/s over {series.window_s:g}-s windows")
    ax.set_yscale("symlog", linthresh=0.1)
    ax.set_ylim(bottom=0)
    ax.set_title(f"storage links window by window: {series.name}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
