"""Fuzzing a live daemon: random and mutated frames, huge counts, wrong types, oversized input.

Every request gets a reply that follows the protocol (an error reply unless the
fuzzer happened to build a valid request), the daemon stays up, and its
resident memory stays within its configured bounds.
"""

from __future__ import annotations

from pathlib import Path

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage_backends.remote.protocol import ErrorCode, Op, Request, encode_request

from .conftest import daemon_toml

MEMORY_BYTES = 4 << 20
STORE_BYTES = 16 << 20
LIMITS = """
[limits]
max_batch_keys = 64
max_key_bytes = 64
max_page_bytes = 65536
max_request_bytes = 2097152
"""


def _config(tmp_path: Path) -> str:
    text = daemon_toml(tmp_path / "store", LIMITS, memory_bytes=MEMORY_BYTES)
    return text.replace(f"max_bytes = {64 << 20}", f"max_bytes = {STORE_BYTES}")


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=10)
    | st.binary(max_size=80)
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=20,
)
_headers = st.fixed_dictionaries(
    {},
    optional={
        "v": st.sampled_from([1, 1, 1, 2, -1, "1", None]),
        "op": st.sampled_from([*(op.value for op in Op), "NOPE", "", b"GET", 7]),
        "id": st.integers(min_value=-1, max_value=2**64 - 1) | _values,
        "keys": st.lists(st.binary(min_size=0, max_size=70), max_size=70) | _values,
    },
)


@st.composite
def _valid_frames(draw: st.DrawFn) -> list[bytes]:
    op = draw(st.sampled_from(list(Op)))
    keys = tuple(draw(st.lists(st.binary(min_size=1, max_size=64), max_size=8)))
    keys = keys if op in (Op.EXISTS, Op.GET, Op.PUT, Op.DELETE) else ()
    pages = tuple(draw(st.binary(max_size=300)) for _ in keys) if op is Op.PUT else ()
    frames = encode_request(Request(op, draw(st.integers(0, 2**63 - 1)), keys, pages))
    return [bytes(frame) for frame in frames]


@st.composite
def _mutated(draw: st.DrawFn) -> list[bytes]:
    frames = draw(_valid_frames())
    choice = draw(st.integers(0, 3))
    if choice == 0:  # flip a byte of the header
        header = bytearray(frames[0])
        header[draw(st.integers(0, len(header) - 1))] = draw(st.integers(0, 255))
        frames[0] = bytes(header)
    elif choice == 1:  # truncate the header
        frames[0] = frames[0][: draw(st.integers(0, len(frames[0])))]
    elif choice == 2:  # add or drop payload frames
        frames = frames[:-1] if len(frames) > 1 else [*frames, b"extra"]
    else:  # a declared count far beyond the data (array32 / map32 / bin32)
        frames[0] = draw(st.sampled_from([b"\xdd", b"\xdf", b"\xc6"])) + b"\x7f\xff\xff\xff"
    return frames


_messages = (
    _valid_frames()
    | _mutated()
    | st.lists(st.binary(max_size=200), min_size=1, max_size=4)
    | st.tuples(_headers | _values, st.lists(st.binary(max_size=200), max_size=3)).map(
        lambda hp: [msgpack.packb(hp[0], use_bin_type=True), *hp[1]]
    )
)


def _check_reply(frames: list[bytes] | None) -> None:
    assert frames is not None, "no reply"
    header = msgpack.unpackb(frames[0])
    assert header["v"] == 1 and isinstance(header["ok"], bool)
    if not header["ok"]:
        assert header["code"] in ErrorCode.__members__, header
        assert len(frames) == 1


def test_fuzzed_frames_get_replies_and_the_daemon_stays_up(start_daemon, connect, tmp_path) -> None:
    daemon = start_daemon(_config(tmp_path))
    client = connect(daemon.endpoint)
    daemon.wait_ping(client)

    @settings(
        max_examples=400,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(frames=_messages)
    def fuzz(frames: list[bytes]) -> None:
        _check_reply(client.raw(frames))

    fuzz()
    assert daemon.alive()
    daemon.wait_ping(client)


def test_memory_stays_within_bounds_under_oversized_and_bulk_input(
    start_daemon, connect, tmp_path, pages
) -> None:
    daemon = start_daemon(_config(tmp_path))
    client = connect(daemon.endpoint)
    daemon.wait_ping(client)
    baseline = daemon.rss_bytes()
    # 96 MiB of valid pages through a 16 MiB store, the last 16 MiB read twice each through
    # a 4 MiB memory tier (it keeps a page read a second time).
    for batch in range(96):
        keys, records = pages(16, salt=f"bulk{batch}", size=65536 - 56)
        assert client.put(keys, records) == (True,) * 16
        for _ in range(2 if batch >= 80 else 0):
            assert client.get(keys) == records
    # Requests over the limits: answered TOO_LARGE (or, far beyond them, the peer is dropped).
    header = msgpack.packb({"v": 1, "op": "PUT", "id": 1, "keys": [b"k"] * 64})
    too_large = client.raw([header, *[b"x" * 65536] * 64])
    assert too_large is not None and msgpack.unpackb(too_large[0])["code"] == "TOO_LARGE"
    dropped = connect(daemon.endpoint)
    dropped.sock.send_multipart([header, b"x" * (8 << 20)])
    assert dropped.recv(timeout_s=0.5) is None
    stats = client.call(Op.STATS)
    assert stats is not None and stats.stats["hicache_daemon_memory_used_bytes"] <= MEMORY_BYTES
    assert stats.stats["hicache_daemon_store_used_bytes"] <= STORE_BYTES
    assert stats.stats['hicache_daemon_evictions_total{tier="memory"}'] > 0
    growth = daemon.rss_bytes() - baseline
    # Memory tier + store map (file pages count as resident) + allocator slack.
    print(f"rss growth {growth / 2**20:.1f} MiB")
    assert growth < MEMORY_BYTES + STORE_BYTES + (48 << 20), growth
    assert daemon.alive()
    daemon.wait_ping(client)
