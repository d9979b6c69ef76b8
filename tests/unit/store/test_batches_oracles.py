"""The bulk check's and stamping's numpy steps (broker/store/batches.py) against the steps they replaced, kept
here as oracles: the walk over the size fields one record at a time (the walk by magic must find exactly its
starts or leave the batch to it), the property sections joined by slices (the numpy gather must lay out the
same bytes), the key compared as rows of bytes, and the stamping and sealing scatters by an index of bytes."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.broker.store import batches
from tidemark.common import records
from tidemark.common.crc import crc32
from tidemark.common.records import RecordBatchBuilder

MAGIC = struct.pack(">i", records.MESSAGE_MAGIC)
LIMITS = dict(max_message_size=600, max_record_size=900)


def _walk_oracle(data: bytes, count: int) -> list[int] | None:
    """The size fields' walk before the walk by magic (None: _Unfit)."""
    if count > len(data) // records.MIN_RECORD_SIZE:
        return None
    bounds, pos = [0], 0
    try:
        for _ in range(count):
            pos += records.I32.unpack_from(data, pos)[0]
            bounds.append(pos)
    except struct.error:
        return None
    return bounds


def _walk(data: bytes, count: int) -> list[int] | None:
    try:
        return batches._walk(data, count).tolist()
    except batches._Unfit:
        return None


# Bodies that look like records: a size and the magic at the start, in the middle, or cut short; the magic's
# first byte alone; random bytes.
_BODY = st.one_of(
    st.binary(max_size=24),
    st.builds(lambda size, pad: pad + struct.pack(">i", size) + MAGIC, st.integers(-8, 600), st.binary(max_size=9)),
    st.builds(lambda pad: pad + MAGIC[:3], st.binary(max_size=5)),
    st.just(MAGIC[:1] * 8),
)


@st.composite
def _large_batch(draw) -> tuple[bytearray, int, list[int]]:
    """256 to 300 small records (the walk by magic's case), their bodies drawn from _BODY: the bytes, the count,
    and each record's start."""
    n = draw(st.integers(batches._MAGIC_WALK_MIN, batches._MAGIC_WALK_MIN + 44))
    bodies = draw(st.lists(_BODY, min_size=1, max_size=6))
    builder = RecordBatchBuilder("T", "h")
    starts = []
    for i in range(n):
        starts.append(len(builder.buffer))
        props = records.encode_properties({"UNIQ_KEY": f"ID{i}", "TAGS": "t"})
        builder.append(bodies[i % len(bodies)], props, tags_code=zlib.crc32(b"t"))
    return builder.buffer, n, starts


@settings(max_examples=200, deadline=None)
@given(_large_batch(), st.data())
def test_the_walk_is_the_size_fields_walk_on_any_large_batch(drawn, data):
    """Clean, or with a size field lying (into a body that looks like a record, by a few bytes, to the end),
    a magic lost, the batch cut or extended, or the count off: the walk's answer is the one-by-one walk's,
    and the bulk check's verdict (the records, or the error's message) the per-record check's."""
    raw, n, starts = drawn
    for _ in range(data.draw(st.integers(0, 3))):
        kind = data.draw(st.sampled_from(["size", "into_body", "magic", "zero"]))
        i = data.draw(st.integers(0, n - 1))
        if kind == "size":
            struct.pack_into(">i", raw, starts[i], data.draw(st.integers(-2**31, 2**31 - 1)))
        elif kind == "into_body":  # to a decoy's position: any magic found in the bytes after the record's start
            hits = [p - 4 for p in range(starts[i] + 5, len(raw) - 3) if raw[p:p + 4] == MAGIC]
            if hits:
                struct.pack_into(">i", raw, starts[i], data.draw(st.sampled_from(hits)) - starts[i])
        elif kind == "magic":
            raw[starts[i] + 4] ^= data.draw(st.integers(1, 255))
        else:
            struct.pack_into(">i", raw, starts[i], 0)
    end = data.draw(st.sampled_from(["as is", "cut", "extend"]))
    if end == "cut":
        del raw[data.draw(st.integers(0, len(raw) - 1)):]
    elif end == "extend":
        raw += data.draw(st.sampled_from([MAGIC, struct.pack(">i", 30) + MAGIC, bytes(40)]))
    n += data.draw(st.sampled_from([0, 0, -1, 1]))
    data_bytes = bytes(raw)
    assert _walk(data_bytes, n) == _walk_oracle(data_bytes, n)
    assert _walk(raw, n) == _walk_oracle(data_bytes, n)  # (a bytearray, as the broker's buffers are)
    assert _verdict(batches.check_batch, data_bytes, n) == _verdict(records.check_batch, data_bytes, n)


def _verdict(check, data: bytes, count: int):
    """The records located (starts, sizes, tags codes, ids), or the RecordError's message."""
    try:
        checked = check(data, count, topic="T", **LIMITS)
    except records.RecordError as e:
        return str(e)
    return ([int(s) for s in checked.starts], [int(s) for s in checked.sizes], [int(t) for t in checked.tags_codes],
            list(checked.msg_ids))


def test_a_batch_of_exactly_the_walk_by_magics_bounds_is_walked_by_magic():
    """256 records of exactly 512 bytes, and 255 (walked one by one), and 512 + 1 bytes a record (too): the
    same starts as the walk's."""
    def batch(n: int, size: int) -> bytes:
        b = RecordBatchBuilder("T", "h")
        for i in range(n):
            props = records.encode_properties({"UNIQ_KEY": f"ID{i:04}"})
            body_len = size - (records.HEADER_SIZE + 2 + 1 + 2 + 1 + 8 + len(props))
            b.append(MAGIC * (body_len // 4) + bytes(body_len % 4), props)
            assert len(b.buffer) == (i + 1) * size
        return bytes(b.buffer)

    n = batches._MAGIC_WALK_MIN
    exact = batch(n, batches._MAGIC_WALK_MAX_SIZE)
    # (bodies made of magics: every one a decoy, so not walked by magic; one without them is)
    assert batches._walk_by_magic(exact, n) is None and _walk(exact, n) == _walk_oracle(exact, n)
    plain = bytearray(exact)
    for start in range(0, len(plain), batches._MAGIC_WALK_MAX_SIZE):
        body_at = records.variable_fields(plain, start)[6]
        plain[body_at:start + batches._MAGIC_WALK_MAX_SIZE] = bytes(start + batches._MAGIC_WALK_MAX_SIZE - body_at)
    plain = bytes(plain)
    assert batches._walk_by_magic(plain, n).tolist() == _walk_oracle(plain, n)
    assert batches._walk_by_magic(plain[:-batches._MAGIC_WALK_MAX_SIZE], n - 1) is None
    assert batches._walk_by_magic(plain + bytes(1), n) is None  # (more than 512 bytes a record)
    assert _walk(plain + bytes(1), n) == _walk_oracle(plain + bytes(1), n)


def _joined_oracle(data: bytes, at: np.ndarray, length: np.ndarray) -> tuple[bytes, list[int]]:
    parts = [data[a:b] for a, b in zip(at.tolist(), (at + length).tolist(), strict=True)]
    return b"".join(parts) + bytes(batches._MAX_TABLE_TAG), [0, *np.cumsum(length).tolist()]


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=3000), st.data())
def test_the_gathered_sections_are_the_sliced_ones(data_bytes, data):
    """Ranges averaging up to _GATHER_MAX bytes (gathered by numpy: exactly 64 included) and longer ones
    (sliced): the same bytes, the same offsets."""
    ranges = data.draw(st.lists(st.tuples(st.integers(0, len(data_bytes) - 1), st.integers(1, 130)), min_size=1,
                                max_size=40))
    ranges = [(a, min(n, len(data_bytes) - a)) for a, n in ranges]
    if data.draw(st.booleans()):
        ranges = [(a, n) for a, n in ranges if n == batches._GATHER_MAX] or [(0, len(data_bytes))]
    at = np.array([a for a, _ in ranges], dtype=np.int64)
    length = np.array([n for _, n in ranges], dtype=np.int64)
    for source in (data_bytes, bytearray(data_bytes)):
        joined, offsets = batches._joined(source, at, length)
        assert (joined.tobytes(), offsets.tolist()) == _joined_oracle(data_bytes, at, length)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["UNIQ_KEY", "TAGS", "DELAY", "k", "KEYS", "ab", "abc", "TAGSX",
                                           "__STARTDELIVERTIME", "TRAN_MSG", "é"]),
                          st.text(alphabet="ab\u4e2d", max_size=3)), min_size=1, max_size=8),
       st.sampled_from(["UNIQ_KEY", "TAGS", "DELAY", "k", "ab", "abc", "__STARTDELIVERTIME", "TRAN_MSG", "é"]))
def test_a_key_is_found_as_the_rows_of_bytes_found_it(pairs, key):
    """_has_key (one item per position) against the rows of bytes it replaced, for keys of every width."""
    text = "".join(f"{k}\x01{v}\x02" for k, v in pairs).encode()
    joined = np.frombuffer(text + bytes(batches._MAX_TABLE_TAG), dtype=np.uint8)
    pair_at, seps, _ = batches._pairs(joined, np.array([0, len(text)], dtype=np.int64))
    k = key.encode()
    rows = batches._rows(joined, len(k))[np.minimum(pair_at, len(joined) - len(k))]
    oracle = (rows == np.frombuffer(k, np.uint8)).all(axis=1) & (seps - pair_at == len(k))
    assert batches._has_key(joined, pair_at, seps, k).tolist() == oracle.tolist()
    assert oracle.tolist() == [p == key for p, _ in pairs]


def _builder(n: int) -> RecordBatchBuilder:
    b = RecordBatchBuilder("T", "10.0.0.1")
    for i in range(n):
        props = records.encode_properties({"UNIQ_KEY": f"ID{i}", "TAGS": "t", "KEYS": "k" * (i % 70)})
        b.append(b"body" * (i % 9), props, tags_code=zlib.crc32(b"t"), born_timestamp=i)
    return b


@pytest.mark.parametrize("n", [batches.BULK_MIN, batches._MAGIC_WALK_MIN])
def test_stamping_and_sealing_write_what_the_byte_index_wrote(n):
    """The scatters of one item per record against the scatters by an index of bytes they replaced: the
    same buffer, byte for byte, with offsets and timestamps near the limits of their fields."""
    raw = bytes(_builder(n).buffer)
    checked = batches.check_batch(raw, n, topic="T", **LIMITS)
    assert type(checked) is batches.Checked
    queue_id, first, stored = 2**31 - 1, 2**63 - 1 - n, 2**63 - 1
    new = bytearray(raw)
    batches.stamp(new, checked, queue_id, first, stored)
    positions = checked.starts + (2**62 + 3)
    batches.seal_all(new, checked.starts, checked.sizes, positions)
    old = bytearray(raw)
    for i, start in enumerate(checked.starts.tolist()):
        struct.pack_into(">i", old, start + records.QUEUE_ID_OFFSET, queue_id)
        struct.pack_into(">q", old, start + records.QUEUE_OFFSET_OFFSET, first + i)
        struct.pack_into(">q", old, start + records.STORE_TS_OFFSET, stored)
        struct.pack_into(">q", old, start + records.PHYS_OFFSET_OFFSET, int(positions[i]))
    for start, size in zip(checked.starts.tolist(), checked.sizes.tolist(), strict=True):
        struct.pack_into(">I", old, start + records.CRC_OFFSET, crc32(memoryview(old)[start + 12:start + size]))
    assert new == old
    assert all(records.crc_ok(bytes(new), s, z) for s, z in zip(checked.starts.tolist(), checked.sizes.tolist(),
                                                                strict=True))
