"""A trace replay's figures per set-up, the verdict on the store, and the printed tables.

Hit rates are shares of every prompt token of the trace (what prefill would
compute without a cache); the bound is the trace's unbounded-capacity bound
at the same page size (``trace.bound``). Bytes and bandwidth are for the
chosen model (``trace.models``); bandwidth is the 10-second-window demand of
``trace.rates``. Everything here but the store's measured rates is the same on
every run of the same trace, flags and config.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np

from hicache.bench.tiering.serving import LINKS, TIERS
from hicache.bench.tiering.trace.models import ModelGeometry
from hicache.bench.tiering.trace.probe import StoreRate
from hicache.bench.tiering.trace.rates import Rate, link_rate, rate
from hicache.bench.tiering.trace.replay import ReplayResult

# The storage links and the direction of disk I/O each one is.
STORAGE_IO = {"h2s": "write", "s2h": "read"}
LINK_TEXT = {
    "d2h": "device→host",
    "h2d": "host→device",
    "h2s": "host→storage",
    "s2h": "storage→host",
}


@dataclass(frozen=True)
class SetupFigures:
    """One set-up's reproducible figures (see the module docstring)."""

    name: str
    tokens: dict[str, int]  # each tier's capacity (0: off)
    hit_rate: float
    hit_rate_by_tier: dict[str, float]
    bound_hit_rate: float
    share_of_bound: float | None
    prefill_tokens_saved: int
    tokens_moved: dict[str, int]
    bytes_moved: dict[str, int]
    link_gbps: dict[str, Rate]
    prefill_tokens_per_s: Rate
    stored_pages: int


class Context(NamedTuple):
    """What every set-up's figures are computed against."""

    input_lengths: np.ndarray
    bound_hits: np.ndarray
    windows: np.ndarray
    window_s: float
    model: ModelGeometry


def setup_figures(result: ReplayResult, ctx: Context) -> SetupFigures:
    total = int(ctx.input_lengths.sum())
    by_tier = {t: int(result.hits[t].sum()) for t in TIERS}
    saved = sum(by_tier.values())
    bound = int(ctx.bound_hits.sum())
    served = sum(result.hits[t] for t in TIERS)
    moved = {link: int(result.moved[link].sum()) for link in LINKS}
    bpt = ctx.model.bytes_per_token
    return SetupFigures(
        name=result.name,
        tokens={t: result.sizes.tokens(t) if getattr(result.sizes, t) else 0 for t in TIERS},
        hit_rate=saved / total,
        hit_rate_by_tier={t: v / total for t, v in by_tier.items()},
        bound_hit_rate=bound / total,
        share_of_bound=saved / bound if bound else None,
        prefill_tokens_saved=saved,
        tokens_moved=moved,
        bytes_moved={link: n * bpt for link, n in moved.items()},
        link_gbps={
            link: link_rate(result.moved[link], ctx.windows, ctx.window_s, bpt) for link in LINKS
        },
        prefill_tokens_per_s=rate(ctx.input_lengths - served, ctx.windows, ctx.window_s, 1.0),
        stored_pages=result.stored_pages,
    )


def figures_json(fig: SetupFigures) -> dict[str, object]:
    """``fig`` for the JSON report, each rate as ``{"mean", "p99", "peak"}``."""
    out = asdict(fig)
    out["link_gbps"] = {link: r._asdict() for link, r in fig.link_gbps.items()}
    out["prefill_tokens_per_s"] = fig.prefill_tokens_per_s._asdict()
    return out


class Verdict(NamedTuple):
    """Whether a store keeps up with one storage link of one set-up."""

    setup: str
    link: str
    need_mean_gbps: float
    need_p99_gbps: float
    source: str
    have_gbps: float | None
    verdict: str


def judge(need: Rate, have: float | None) -> str:
    """Keeps up: even the p99 window's demand fits; on average only: the mean fits and
    bursts queue; falls behind: not even the mean fits."""
    if have is None:
        return "not measured"
    if need.p99 <= have:
        return "keeps up"
    if need.mean <= have:
        return "keeps up on average only"
    return "falls behind"


def verdicts(figures: list[SetupFigures], stores: list[StoreRate]) -> list[Verdict]:
    """Each storage set-up's write and read demand against each measured store."""
    out = []
    for fig in figures:
        if not fig.tokens["storage"]:
            continue
        for link, direction in STORAGE_IO.items():
            need = fig.link_gbps[link]
            for store in stores:
                have = store.write_gbps if direction == "write" else store.read_gbps
                out.append(
                    Verdict(
                        fig.name, link, need.mean, need.p99, store.source, have, judge(need, have)
                    )
                )
    return out


def print_hits(figures: list[SetupFigures]) -> None:
    print(f"{'set-up':<36}{'hit':>7}{'device':>8}{'host':>8}{'storage':>9}{'bound':>8}"
          f"{'of bound':>10}{'saved tokens':>15}")  # fmt: skip
    for f in figures:
        t = f.hit_rate_by_tier
        share = "n/a" if f.share_of_bound is None else f"{f.share_of_bound:.1%}"
        print(
            f"{f.name:<36}{f.hit_rate:>7.1%}{t['device']:>8.1%}{t['host']:>8.1%}"
            f"{t['storage']:>9.1%}{f.bound_hit_rate:>8.1%}{share:>10}{f.prefill_tokens_saved:>15,}"
        )


def print_links(figures: list[SetupFigures], model: ModelGeometry, window_s: float) -> None:
    print(f"bandwidth each link must sustain for {model.name}, GB/s: mean / p99 of {window_s:g}-s "
          f"windows (TB moved in the whole trace)")  # fmt: skip
    print(f"{'set-up':<36}" + "".join(f"{LINK_TEXT[k]:>22}" for k in LINKS))
    for f in figures:
        cells = []
        for k in LINKS:
            r = f.link_gbps[k]
            cells.append(f"{r.mean:.2f} / {r.p99:.2f} ({f.bytes_moved[k] / 1e12:.1f})")
        print(f"{f.name:<36}" + "".join(f"{c:>22}" for c in cells))


def print_verdicts(verdicts_: list[Verdict], stores: list[StoreRate]) -> None:
    for st in stores:
        w = "n/a" if st.write_gbps is None else f"{st.write_gbps:.2f}"
        r = "n/a" if st.read_gbps is None else f"{st.read_gbps:.2f}"
        print(f"measured: {st.source}: write {w} GB/s, read {r} GB/s ({st.note})")
    if not verdicts_:
        return
    sources = list(dict.fromkeys(v.source for v in verdicts_))
    print("does it keep up? storage link demand in GB/s, mean / p99 window")
    print(f"{'set-up':<36}{'link':<24}{'need':>14}  " + "".join(f"{s[:30]:<32}" for s in sources))
    rows: dict[tuple[str, str], dict[str, Verdict]] = {}
    for v in verdicts_:
        rows.setdefault((v.setup, v.link), {})[v.source] = v
    for (setup, link), by_source in rows.items():
        first = next(iter(by_source.values()))
        need = f"{first.need_mean_gbps:.2f} / {first.need_p99_gbps:.2f}"
        what = f"{LINK_TEXT[link]} ({STORAGE_IO[link]}s)"
        cells = "".join(f"{by_source[s].verdict if s in by_source else '':<32}" for s in sources)
        print(f"{setup:<36}{what:<24}{need:>14}  {cells}")
