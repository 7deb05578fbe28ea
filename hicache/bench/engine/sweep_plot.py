"""The sweep's figure: TTFT of a storage hit vs the store's bandwidth, one line
per prefetch policy (recomputing: no storage tier), and each policy's TTFT
over the better of always loading and always recomputing, with the target."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

STYLES = {
    "best_effort": ("#ff7f0e", "v"),
    "timeout": ("#9467bd", "s"),
    "wait_complete": ("#1f77b4", "o"),
    "cost": ("#d62728", "D"),
    "recompute": ("#7f7f7f", "x"),
}


def plot(
    median: Mapping[tuple[str, float], float], breakeven_mb: float, path: Path, target: float = 1.1
) -> None:
    """Write a two-panel PNG to ``path`` (needs matplotlib, hicache[bench]);
    ``median``: TTFT p50 (ms) by (policy, MB/s)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ttft_ax, ratio_ax) = plt.subplots(1, 2, figsize=(14, 5.2))
    bws = sorted({mb for _, mb in median})
    best = {b: min(median[("wait_complete", b)], median[("recompute", b)]) for b in bws}
    for policy, (colour, marker) in STYLES.items():
        ys = [median[(policy, b)] for b in bws]
        label = "recompute (no storage)" if policy == "recompute" else policy
        ttft_ax.plot(bws, ys, color=colour, marker=marker, label=label)
        ratio_ax.plot(bws, [y / best[b] for y, b in zip(ys, bws, strict=True)], color=colour,
                      marker=marker, label=label)  # fmt: skip
    for ax in (ttft_ax, ratio_ax):
        ax.set_xscale("log")
        ax.axvline(breakeven_mb, color="#bbbbbb", linestyle="--", linewidth=1)
        ax.set_xlabel("store bandwidth (MB/s, log); dashed: break-even with prefill")
        ax.grid(True, which="both", alpha=0.3)
    ttft_ax.set_yscale("log")
    ttft_ax.set_ylabel("TTFT p50 (ms, log)")
    ttft_ax.set_title("TTFT of a request whose prefix only storage holds")
    ttft_ax.legend()
    ratio_ax.axhline(target, color="#d62728", linestyle=":", linewidth=1)
    ratio_ax.set_yscale("log")
    ratio_ax.set_ylabel("TTFT / min(always load, always recompute)")
    ratio_ax.set_title(f"each policy against the better fixed choice (target: cost <= {target})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
