"""The tiering bench's figure: hit rate per round, the per-tier split, bytes per link."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from hicache.bench.tiering import TierReport

TIER_COLOURS = {"device": "tab:green", "host": "tab:orange", "storage": "tab:purple"}
LINK_NAMES = {
    "d2h": "device→host (backups)",
    "h2d": "host→device (load-backs)",
    "h2s": "host→storage (writes)",
    "s2h": "storage→host (prefetches)",
}


def plot(reports: list[TierReport], path: Path, workload: str, round_meaning: str) -> None:
    """Write a three-panel PNG to ``path`` (needs matplotlib, hicache[bench])."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    _per_round(axes[0], reports, round_meaning)
    _split(axes[1], reports)
    _links(axes[2], reports)
    fig.suptitle(f"hicache tiering: {workload} workload, same device capacity in every set-up")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _per_round(ax: Axes, reports: list[TierReport], round_meaning: str) -> None:
    for r in reports:
        rounds = range(1, len(r.hit_rate_by_round) + 1)
        ax.plot(rounds, r.hit_rate_by_round, marker="o", label=r.name)
    ax.set_xlabel(f"round r = {round_meaning}")
    ax.set_ylabel("prompt tokens served from cache")
    ax.set_ylim(0, 1)
    ax.set_title("hit rate per round")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _split(ax: Axes, reports: list[TierReport]) -> None:
    names = [r.name for r in reports]
    bottom = [0.0] * len(reports)
    for tier, colour in TIER_COLOURS.items():
        values = [r.hit_rate_by_tier[tier] for r in reports]
        ax.bar(names, values, bottom=bottom, color=colour, label=f"from {tier}")
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("share of prompt tokens (whole run)")
    ax.set_ylim(0, 1)
    ax.set_title("where the hits came from")
    ax.tick_params(axis="x", labelrotation=15, labelsize=8)
    ax.legend(fontsize=8)


def _links(ax: Axes, reports: list[TierReport]) -> None:
    width = 0.8 / len(LINK_NAMES)
    for i, (link, label) in enumerate(LINK_NAMES.items()):
        xs = [j + (i - 1.5) * width for j in range(len(reports))]
        ax.bar(xs, [r.bytes_moved[link] / 2**20 for r in reports], width, label=label)
    ax.set_xticks(range(len(reports)), [r.name for r in reports])
    ax.tick_params(axis="x", labelrotation=15, labelsize=8)
    ax.set_ylabel("MiB moved (whole run)")
    ax.set_title("bytes moved per link")
    ax.legend(fontsize=8)
