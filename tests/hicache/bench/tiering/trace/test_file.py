"""The trace parser: Mooncake's JSONL, gzip or plain; a bad line is an error naming it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from hicache.bench.tiering.trace.file import (
    SHIPPED_TRACES,
    TraceFormatError,
    prompt_tokens,
    read_trace,
    resolve_trace,
)

GOOD = [
    {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [7, 9]},
    {"timestamp": 1500, "input_length": 1200, "output_length": 0, "hash_ids": [7, 9, 11]},
    {"timestamp": 1500, "input_length": 512, "output_length": 3, "hash_ids": [2**40]},
]


def write(path: Path, lines: list[str], zipped: bool = False) -> Path:
    text = "".join(line + "\n" for line in lines)
    if zipped:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def lines_of(records: list[dict[str, object]]) -> list[str]:
    return [json.dumps(r) for r in records]


@pytest.mark.parametrize("zipped", [False, True])
def test_reads_plain_and_gzip_alike(tmp_path: Path, zipped: bool) -> None:
    path = write(tmp_path / "t.jsonl", [*lines_of(GOOD[:2]), "", *lines_of(GOOD[2:])], zipped)
    trace = read_trace(path)
    assert [r.line for r in trace.records] == [1, 2, 4]  # the blank line is skipped, not counted
    assert [r.input_length for r in trace.records] == [1000, 1200, 512]
    assert trace.input_tokens == 2712 and trace.distinct_blocks == 4
    assert trace.duration_s == 1.5 and trace.reordered == 0
    # ids renumbered in order of first appearance, so 2**40 becomes a small block number
    assert [r.blocks.tolist() for r in trace.records] == [[0, 1], [0, 1, 2], [3]]


def test_out_of_order_lines_are_replayed_in_arrival_order(tmp_path: Path) -> None:
    late = [GOOD[1], GOOD[0], GOOD[2]]
    trace = read_trace(write(tmp_path / "t.jsonl", lines_of(late)))
    assert [r.timestamp_ms for r in trace.records] == [0, 1500, 1500]
    assert [r.line for r in trace.records] == [2, 1, 3]  # ties keep the file's order
    assert trace.reordered == 1


BAD = [
    ("{not json", "not JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"timestamp": 0, "input_length": 5, "hash_ids": [1]}', "missing output_length"),
    ('{"timestamp": -1, "input_length": 5, "output_length": 0, "hash_ids": [1]}', "timestamp"),
    ('{"timestamp": 0, "input_length": 0, "output_length": 0, "hash_ids": []}', "input_length"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 0, "hash_ids": [1.5]}', "hash_ids"),
    ('{"timestamp": 0, "input_length": 5, "output_length": true, "hash_ids": [1]}', "output_len"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 0, "hash_ids": [1]}', "expected 2"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 0, "hash_ids": [1, 2]}', "expected 1"),
]


@pytest.mark.parametrize(("line", "why"), BAD)
@pytest.mark.parametrize("zipped", [False, True])
def test_a_bad_line_is_named(tmp_path: Path, line: str, why: str, zipped: bool) -> None:
    path = write(tmp_path / "t.jsonl", [*lines_of(GOOD[:2]), line, *lines_of(GOOD[2:])], zipped)
    with pytest.raises(TraceFormatError, match="line 3: ") as err:
        read_trace(path)
    assert why in str(err.value) and str(path) in str(err.value)


def test_unreadable_files_are_clear_errors(tmp_path: Path) -> None:
    empty = write(tmp_path / "empty.jsonl", ["", "  "])
    with pytest.raises(TraceFormatError, match="no requests"):
        read_trace(empty)
    whole = gzip.compress("\n".join(lines_of(GOOD)).encode())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[: len(whole) - 12])  # the gzip stream ends early
    with pytest.raises(TraceFormatError, match="cannot read the trace"):
        read_trace(cut)
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(json.dumps(GOOD[0]).encode() + b"\n\xff\xfe\n")
    with pytest.raises(TraceFormatError, match="line 2: not UTF-8"):
        read_trace(binary)
    with pytest.raises(TraceFormatError, match="no such file, and not a shipped trace"):
        resolve_trace(str(tmp_path / "missing.jsonl"))


def test_prompts_are_distinct_token_runs_per_block_cut_to_the_input_length(tmp_path: Path) -> None:
    trace = read_trace(write(tmp_path / "t.jsonl", lines_of(GOOD)), block_tokens=512)
    first, second, third = (prompt_tokens(r, 512) for r in trace.records)
    assert first.dtype == np.int32 and len(first) == 1000 and len(second) == 1200
    assert np.array_equal(second[:1000], first)  # the shared prefix is the same tokens
    assert np.array_equal(first[:512], np.arange(512))
    assert len(set(third.tolist()) & set(second.tolist())) == 0  # another block: no token shared
    assert len(np.unique(second)) == len(second)


def test_the_shipped_trace_is_there_and_reads() -> None:
    path = resolve_trace("mooncake-conversation")
    assert path.name == SHIPPED_TRACES["mooncake-conversation"]
    assert (path.parent / "README.md").read_text().count("Apache") >= 1
    assert (path.parent / "LICENSE-APACHE").is_file()
    trace = read_trace(path)
    assert len(trace.records) == 12_031 and trace.input_tokens == 144_793_823
    assert trace.distinct_blocks == 182_790
