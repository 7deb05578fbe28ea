"""Request traces in the Mooncake format: one JSON object a line, gzip or plain.

Each line is ``{"timestamp": ms, "input_length": tokens, "output_length":
tokens, "hash_ids": [...]}``: one hash id per ``block_tokens``-token block of
the prompt (512 in Mooncake's release), equal ids meaning the same prefix
block, the last block cut to ``input_length``. Every line is checked where it
is read; a bad one raises ``TraceFormatError`` naming the file and the line.

Hash ids may be any non-negative integers (a user's own trace may carry 64-bit
hashes): they are renumbered densely in order of first appearance, which is
what the prompt synthesis needs (``TraceRecord.blocks``).
"""

from __future__ import annotations

import gzip
import io
import itertools
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

MOONCAKE_BLOCK_TOKENS = 512
GZIP_MAGIC = b"\x1f\x8b"
# Traces that ship inside the package (hicache/bench/tiering/trace/traces/, with their
# source and licence in the README there), by the name ``--trace`` takes.
SHIPPED_TRACES = {"mooncake-conversation": "mooncake_conversation.jsonl.gz"}
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
# Token ids are int32 and each block gets its own run of them.
MAX_TOKEN_ID = 2**31 - 1


class TraceFormatError(ValueError):
    """A trace file that cannot be read: names the file and, for a bad line, the line."""


class TraceRecord(NamedTuple):
    """One request. ``blocks``: its hash ids renumbered densely (int64)."""

    line: int
    timestamp_ms: int
    input_length: int
    output_length: int
    blocks: np.ndarray


@dataclass(frozen=True)
class Trace:
    """A whole trace, in arrival order (stable sort by timestamp)."""

    source: str
    records: tuple[TraceRecord, ...]
    block_tokens: int
    distinct_blocks: int
    reordered: int  # lines that arrived before an earlier line's timestamp

    @property
    def input_tokens(self) -> int:
        return sum(r.input_length for r in self.records)

    @property
    def duration_s(self) -> float:
        if not self.records:
            return 0.0
        return (self.records[-1].timestamp_ms - self.records[0].timestamp_ms) / 1e3


def traces_folder() -> Path:
    """Where the shipped traces are (inside the installed package)."""
    return Path(__file__).resolve().parent / "traces"


def resolve_trace(spec: str) -> Path:
    """``spec`` is a shipped trace's name or a path; TraceFormatError when neither."""
    if spec in SHIPPED_TRACES:
        path = traces_folder() / SHIPPED_TRACES[spec]
        if not path.is_file():
            raise TraceFormatError(f"the shipped trace {spec!r} is missing from {path.parent}")
        return path
    path = Path(spec).expanduser()
    if not path.is_file():
        known = ", ".join(sorted(SHIPPED_TRACES))
        raise TraceFormatError(f"--trace {spec}: no such file, and not a shipped trace ({known})")
    return path


def read_trace(path: Path, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> Trace:
    """Every request of the trace at ``path`` (gzip when it starts with gzip's magic).

    Raises TraceFormatError for an unreadable file, a bad line (the message
    names the line), or a trace with no request. Changes nothing."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    renumber: dict[int, int] = {}
    records: list[TraceRecord] = []
    number = 0
    try:
        with _open(path) as lines:
            for number, raw in enumerate(lines, start=1):
                if raw.strip():
                    records.append(_parse_line(path, number, raw, block_tokens, renumber))
    except (OSError, EOFError, zlib.error) as exc:
        where = f" after line {number}" if number else ""
        raise TraceFormatError(f"{path}: cannot read the trace{where}: {exc}") from None
    if not records:
        raise TraceFormatError(f"{path}: no requests in the trace")
    if len(renumber) * block_tokens > MAX_TOKEN_ID:
        raise TraceFormatError(
            f"{path}: {len(renumber):,} distinct blocks of {block_tokens} tokens do not fit "
            f"int32 token ids ({MAX_TOKEN_ID // block_tokens:,} at most)"
        )
    ordered = sorted(records, key=lambda r: r.timestamp_ms)  # stable: ties keep file order
    late = sum(1 for a, b in itertools.pairwise(records) if b.timestamp_ms < a.timestamp_ms)
    return Trace(str(path), tuple(ordered), block_tokens, len(renumber), late)


def _open(path: Path) -> io.BufferedIOBase:
    """Lines as bytes: each is decoded on its own, so a bad byte names its line."""
    with path.open("rb") as probe:
        head = probe.read(2)
    if head == GZIP_MAGIC:
        return gzip.open(path, "rb")
    return path.open("rb")


def _bad(path: Path, number: int, why: str) -> TraceFormatError:
    return TraceFormatError(f"{path}, line {number}: {why}")


def _parse_line(
    path: Path, number: int, raw: bytes, block_tokens: int, renumber: dict[int, int]
) -> TraceRecord:
    try:
        obj = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise _bad(path, number, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise _bad(path, number, f"not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise _bad(path, number, f"expected a JSON object, got {type(obj).__name__}")
    missing = [f for f in FIELDS if f not in obj]
    if missing:
        raise _bad(path, number, f"missing {', '.join(missing)} (a line needs {', '.join(FIELDS)})")
    stamp = _count(path, number, obj, "timestamp", 0)
    length = _count(path, number, obj, "input_length", 1)
    output = _count(path, number, obj, "output_length", 0)
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or not all(_is_count(i, 0) for i in ids):
        raise _bad(path, number, "hash_ids must be a list of non-negative integers")
    want = -(-length // block_tokens)
    if len(ids) != want:
        raise _bad(
            path,
            number,
            f"{len(ids)} hash_ids for input_length {length}: expected {want} "
            f"(one per {block_tokens}-token block, the last one partial)",
        )
    blocks = np.fromiter((renumber.setdefault(i, len(renumber)) for i in ids), np.int64, len(ids))
    return TraceRecord(number, stamp, length, output, blocks)


def _is_count(value: object, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _count(path: Path, number: int, obj: dict[str, object], field: str, low: int) -> int:
    value = obj[field]
    if not _is_count(value, low):
        raise _bad(path, number, f"{field} must be an integer >= {low}, got {value!r}")
    assert isinstance(value, int)
    return value


def iter_prompts(trace: Trace) -> Iterator[np.ndarray]:
    """Each request's synthesized prompt (see ``prompt_tokens``), in arrival order."""
    for record in trace.records:
        yield prompt_tokens(record, trace.block_tokens)


def prompt_tokens(record: TraceRecord, block_tokens: int) -> np.ndarray:
    """The prompt of ``record`` as int32 token ids: block ``b`` (dense number) is
    the ``block_tokens`` ids from ``b * block_tokens`` on, so blocks never share a
    token, equal blocks are equal tokens, and the last block is cut to
    ``input_length``."""
    offsets = np.arange(block_tokens, dtype=np.int64)
    tokens = (record.blocks[:, None] * block_tokens + offsets).ravel()[: record.input_length]
    return tokens.astype(np.int32)
