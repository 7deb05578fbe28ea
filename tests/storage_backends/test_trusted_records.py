"""put_records / get_records of the disk and lmdb backends (the daemon's PUT and GET paths):
a verified record is stored once, under the store key, without a second checksum pass;
it reads back whole, verified; bad records are refused before anything is stored."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import xxhash

from storage_backends import StorageConfig
from storage_backends.disk import DiskBackend
from storage_backends.lmdb.backend import LmdbBackend
from storage_backends.page_format import HEADER_BYTES, Verdict, encode_page, validate
from storage_backends.trusted_records import rekey

BACKENDS = {"disk": DiskBackend, "lmdb": LmdbBackend}


def _key(i: int, salt: str = "") -> bytes:
    return xxhash.xxh3_128_digest(f"{salt}key-{i}".encode()) * 2


def _record(client_key: bytes, i: int, size: int = 5000) -> bytes:
    payload = (client_key + i.to_bytes(4, "little")) * (size // 36 + 1)
    return encode_page(client_key, payload[:size])


@pytest.fixture(params=sorted(BACKENDS))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DiskBackend | LmdbBackend]:
    config = StorageConfig(backend=request.param, path=str(tmp_path / "store"), max_bytes=16 << 20)
    opened = BACKENDS[request.param](config)
    yield opened
    opened.close()


def test_a_record_is_stored_once_under_the_store_key_and_reads_back_whole(store) -> None:
    client = [_key(i, "client") for i in range(3)]
    stored = [_key(i, "store") for i in range(3)]
    records = [_record(key, i, size=4000 + i) for i, key in enumerate(client)]
    assert store.put_records(stored, [memoryview(r) for r in records]) == [True] * 3
    # One header: the plain read gives the client's payload, checked under the store key.
    plain = [memoryview(bytearray(len(r) - HEADER_BYTES)) for r in records]
    assert store.get(stored, plain) == [True] * 3
    assert [bytes(p) for p in plain] == [r[HEADER_BYTES:] for r in records]
    assert store.sizes(stored) == [len(r) - HEADER_BYTES for r in records]
    # Whole: the stored header names the store key; the client's key written back gives
    # the client's record byte for byte (the checksum covers the payload only).
    whole = [memoryview(bytearray(len(r))) for r in records]
    assert store.get_records(stored[::-1], whole[::-1]) == [True] * 3
    for key, buffer, record in zip(client, whole, records, strict=True):
        assert validate(buffer, key, None) is Verdict.WRONG_KEY
        rekey(buffer, key)
        assert bytes(buffer) == record


def test_put_records_hashes_nothing(store, monkeypatch) -> None:
    keys = [_key(i) for i in range(4)]
    records = [memoryview(_record(key, i, size=70_000)) for i, key in enumerate(keys)]
    calls: list[int] = []
    one_shot = xxhash.xxh3_64_intdigest

    def counted(data: object, *args: object) -> int:
        calls.append(1)
        return one_shot(data, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(xxhash, "xxh3_64_intdigest", counted)
    monkeypatch.setattr(xxhash, "xxh3_64", None)  # any streaming hash would fail loudly
    assert store.put_records(keys, records) == [True] * 4
    assert calls == []
    monkeypatch.undo()
    whole = [memoryview(bytearray(len(r))) for r in records]
    assert store.get_records(keys, whole) == [True] * 4


def _bad_records(key: bytes) -> dict[str, bytes]:
    good = _record(key, 1, size=100)
    wrong_magic = b"XKVP" + good[4:]
    wrong_version = good[:4] + b"\x09\x00" + good[6:]
    return {
        "short": good[: HEADER_BYTES - 1],
        "magic": wrong_magic,
        "version": wrong_version,
        "longer": good + b"x",  # the header's length disagrees with the bytes
        "shorter": good[:-1],
    }


@pytest.mark.parametrize("bad", ["short", "magic", "version", "longer", "shorter"])
def test_a_bad_record_is_refused_and_nothing_of_its_batch_is_stored(store, bad: str) -> None:
    keys = [_key(i) for i in range(2)]
    batch = [memoryview(_record(keys[0], 0)), memoryview(_bad_records(keys[1])[bad])]
    with pytest.raises(ValueError, match="record 1"):
        store.put_records(keys, batch)
    assert store.contains(keys) == [False, False]
    with pytest.raises(ValueError):
        store.put_records(keys, batch[:1])  # a key without its record
    with pytest.raises(ValueError):
        store.put_records([b"short"], batch[:1])


def test_get_records_misses_a_buffer_of_another_size_and_refuses_one_without_room(
    store,
) -> None:
    key, record = _key(0), _record(_key(0), 0)
    assert store.put_records([key], [memoryview(record)]) == [True]
    for size in (len(record) - 1, len(record) + 1):
        assert store.get_records([key], [memoryview(bytearray(size))]) == [False]
    assert store.get_records([_key(9)], [memoryview(bytearray(len(record)))]) == [False]
    with pytest.raises(ValueError):
        store.get_records([key], [memoryview(bytearray(HEADER_BYTES - 1))])
    assert store.contains([key]) == [True]  # a size that differs is no damage


def test_a_record_whose_checksum_lied_is_a_miss_and_dropped(store) -> None:
    """put_records trusts the caller's checksum; every read still checks it."""
    keys = [_key(i) for i in range(2)]
    records = [bytearray(_record(key, i)) for i, key in enumerate(keys)]
    records[1][-1] ^= 0x01  # the header's checksum no longer covers the payload
    assert store.put_records(keys, [memoryview(r) for r in records]) == [True, True]
    whole = [memoryview(bytearray(len(r))) for r in records]
    assert store.get_records(keys, whole) == [True, False]
    assert store.contains(keys) == [True, False]
    assert store.stats().corrupt == 1


def test_a_key_already_stored_keeps_its_first_record(store) -> None:
    key = _key(0)
    first, second = _record(key, 1), _record(key, 2)
    assert store.put_records([key], [memoryview(first)]) == [True]
    assert store.put_records([key, key], [memoryview(second), memoryview(second)]) == [
        True,
        True,
    ]
    whole = memoryview(bytearray(len(first)))
    assert store.get_records([key], [whole]) == [True]
    assert bytes(whole) == first


@pytest.mark.parametrize("batch", [1, 4])
def test_disk_store_records_says_which_keys_hold_this_call_s_record(
    tmp_path: Path, batch: int
) -> None:
    config = StorageConfig(
        backend="disk", path=str(tmp_path / "store"), max_bytes=16 << 20, max_page_bytes=8192
    )
    store = DiskBackend(config)
    try:
        held = [_key(i, "held") for i in range(batch)]
        first = [memoryview(_record(key, 1)) for key in held]
        assert store.store_records(held, first) == ([True] * batch, [True] * batch)
        # Held keys keep their first page: stored, not written (one page a call too).
        second = [memoryview(_record(key, 2)) for key in held]
        assert store.store_records(held, second) == ([True] * batch, [False] * batch)
        new = [_key(i, "new") for i in range(batch)]
        big = _key(0, "big")
        too_big = memoryview(_record(big, 3, size=9000))  # over max_page_bytes: fails
        mixed = [*held[:1], big, *new]  # a held key, a failure, then new keys
        records = [second[0], too_big, *(memoryview(_record(k, 4)) for k in new)]
        put = store.store_records(mixed, records)
        assert put.stored[:2] == [True, False] and put.written[:2] == [False, False]
        assert put.written[2:] == put.stored[2:] == [True] * batch  # the new ones
        dup = _key(0, "dup")  # twice in one batch: the first record is the one kept
        twice = [memoryview(_record(dup, 5)), memoryview(_record(dup, 6))]
        assert store.store_records([dup, dup], twice) == ([True, True], [True, False])
        whole = memoryview(bytearray(len(twice[0])))
        assert store.get_records([dup], [whole]) == [True]
        assert bytes(whole[HEADER_BYTES:]) == bytes(twice[0][HEADER_BYTES:])
    finally:
        store.close()
