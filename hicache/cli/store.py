"""Look inside a store directory (disk, lmdb or file backend): inspect, verify, migrate.

hicache store inspect PATH   pages, bytes, page sizes, fingerprint, and
                             which model (of --config) the fingerprint is
hicache store verify PATH    a checksum pass over every page; exit 1 if any
                             page is damaged (nothing is modified)
  (both: --kind disk|lmdb|file picks the store of a directory holding several)
hicache store migrate PATH   convert an LMDB store into a disk store (in place,
                             keeping the LMDB store beside it, or --to DIR);
                             damaged pages are skipped and counted; exit 2,
                             with nothing changed, when it cannot
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hicache.config.flags import add_config_flags, add_lazy_commands

if TYPE_CHECKING:
    from hicache.config.cache import CacheConfig
    from storage_backends.tools.inspect import StoreSummary


def actions() -> dict[str, Callable[[argparse.Namespace], int]]:
    """Each ``hicache store`` action and its runner (``hicache --help`` lists them all)."""
    return {"inspect": run_inspect, "verify": run_verify, "migrate": run_migrate}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = add_lazy_commands(parser, "store_command", "ACTION")
    for name, run in actions().items():
        sub.add_lazy(name, run.__doc__ or "", _builder(name, run))


def _builder(
    name: str, run: Callable[[argparse.Namespace], int]
) -> Callable[[argparse.ArgumentParser], None]:
    def build(p: argparse.ArgumentParser) -> None:
        from storage_backends.store_kind import LOCAL_KINDS

        p.add_argument("path", type=Path, metavar="PATH", help="the store directory")
        p.add_argument("--json", action="store_true", help="print JSON instead of text")
        if name in ("inspect", "verify"):
            p.add_argument(
                "--kind",
                choices=LOCAL_KINDS,
                help="which store to read in a directory holding several kinds (default: "
                "the one it holds)",
            )
        if name == "inspect":  # verify reads no config
            add_config_flags(p)
        if name == "migrate":
            p.add_argument("--to", type=Path, help="a new or empty directory (default: in place)")
            p.add_argument(
                "--max-bytes",
                type=int,
                default=0,
                help="the disk store's size (default: its pages')",
            )
        p.set_defaults(run=run)

    return build


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def model_line(summary: StoreSummary, config: CacheConfig) -> str:
    """Which model the store's fingerprint names, as far as ``config`` tells."""
    from hicache.keys.hashing import model_fingerprint

    if not summary.fingerprint:
        return "model: unknown (the store records no fingerprint)"
    mine = model_fingerprint(config.model, config.device.page_size).hex()
    m = config.model
    described = (
        f"{m.model_id} ({m.attention}, {m.num_layers} layers, {m.kv_heads} kv heads × "
        f"{m.head_dim}, {m.dtype}, page {config.device.page_size}, tp {m.tp_rank}/{m.tp_size})"
    )
    if summary.fingerprint == mine:
        return f"model: {described}, as the config says"
    return f"model: not the config's {described}; written for another model or page size"


def run_inspect(args: argparse.Namespace) -> int:
    """What a store holds: pages, bytes, page sizes, fingerprint, model."""
    from storage_backends.tools.inspect import summarize

    s = summarize(args.path, args.kind)
    if args.json:
        print(json.dumps({**s._asdict(), "path": str(s.path)}, indent=2))
        return 0
    print(f"store:       {s.path} ({s.kind} backend, page format v{s.format_version})")
    print(f"pages:       {s.pages:,}")
    print(f"bytes:       {_mib(s.bytes)} stored, {_mib(s.payload_bytes)} of KV payload")
    sizes = ", ".join(f"{n:,} × {size:,} B" for size, n in sorted(s.page_sizes.items()))
    print(f"page sizes:  {sizes or '-'}")
    print(f"fingerprint: {s.fingerprint or '-'}")
    print(model_line(s, args.config))
    return 0


def run_verify(args: argparse.Namespace) -> int:
    """A checksum pass over every page of a store; exit 1 if any is damaged."""
    from storage_backends.tools.inspect import verify

    result = verify(args.path, args.kind)
    if args.json:
        print(json.dumps({**result._asdict(), "ok": result.ok}, indent=2))
    else:
        counts = ", ".join(f"{v} {k}" for k, v in sorted(result.verdicts.items()))
        print(f"checked {result.checked:,} pages: {counts or 'none stored'}")
        for key, verdict in result.damaged:
            print(f"  damaged: {key} ({verdict})")
        print("store is intact" if result.ok else "store has damaged pages (a read deletes them)")
    return 0 if result.ok else 1


def run_migrate(args: argparse.Namespace) -> int:
    """Convert an LMDB store into a disk store (damaged pages skipped and counted)."""
    from storage_backends.tools.migrate import MigrateError, migrate

    try:
        result = migrate(args.path, args.to, max(args.max_bytes, 0))
    except MigrateError as exc:
        print(f"hicache store migrate: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(
            json.dumps({**result._asdict(), "target": str(result.target), "kept": str(result.kept)})
        )
        return 0
    skipped = sum(result.damaged.values())
    print(f"disk store:  {result.target}")
    print(f"copied:      {result.copied:,} pages, {_mib(result.payload_bytes)}")
    kinds = ", ".join(f"{n} {v}" for v, n in sorted(result.damaged.items()))
    print(f"damaged:     {skipped:,} pages skipped{f' ({kinds})' if kinds else ''}")
    if result.not_stored:
        print(f"not stored:  {result.not_stored:,} pages (over --max-bytes)")
    print(f"LMDB store:  kept at {result.kept}; delete it once the disk store serves")
    return 0
