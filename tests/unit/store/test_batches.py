"""The bulk check and stamping of producers' record batches (broker/store/batches.py) against the per-record
rules (records.check_batch): the same batches accepted, the same records located, the same errors."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import struct
import tracemalloc
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.broker.errors import InvalidArgumentError
from tidemark.broker.store import MessageStore, batches
from tidemark.common import records
from tidemark.common.records import RecordBatchBuilder, RecordError

LIMITS = dict(max_message_size=600, max_record_size=900)
N = batches.BULK_MIN  # the fewest records the bulk check takes

_KEY = st.sampled_from(["UNIQ_KEY", "TAGS", "TAGS", "KEYS", "k", "UNIQ_KEYS", "TAG", "é"])
_VALUE = st.text(alphabet="aé\u4e2d\U0001f600 |", max_size=6)
_PAIRS = st.lists(st.tuples(_KEY, _VALUE), max_size=5)


def _properties(pairs: list[tuple[str, str]]) -> bytes:
    """Pairs as stored, a key given twice included (encode_properties takes a dict)."""
    return "".join(f"{k}\x01{v}\x02" for k, v in pairs).encode()


def _tags_code(props: bytes) -> int:
    tag = records.property_value(props, b"TAGS\x01")
    return zlib.crc32(tag) if tag else 0


@st.composite
def batch(draw, *, well_formed: bool = True) -> tuple[bytes, int]:
    """A batch of at least N records, made of a few drawn kinds of record (drawing each of them would
    be slow); well formed: each with a UNIQ_KEY and its tags code."""
    kinds = draw(st.lists(st.tuples(_PAIRS, st.integers(0, 5), st.binary(max_size=40), st.integers(0, 2**40)),
                          min_size=1, max_size=4))
    order = draw(st.lists(st.integers(0, len(kinds) - 1), min_size=N, max_size=N + 8))
    builder = RecordBatchBuilder("T", draw(st.sampled_from(["", "10.0.0.1", "hôte"])))
    for i, kind in enumerate(order):
        pairs, at, body, born = kinds[kind]
        if well_formed:  # (a UNIQ_KEY before the one inserted here counts: not an empty one)
            pairs = [(k, v or "u") if k == "UNIQ_KEY" else (k, v) for k, v in pairs]
            pairs.insert(min(at, len(pairs)), ("UNIQ_KEY", f"ID{i}"))
        props = _properties(pairs)
        body = body or b"\x01\x02\xda\xa3 \xa7"  # separators, the magic
        builder.append(body, props, tags_code=_tags_code(props), born_timestamp=born)
    return bytes(builder.buffer), len(order)


def _per_record(data: bytes, count: int, **limits):
    try:
        return records.check_batch(data, count, topic="T", **(limits or LIMITS))._replace(properties=())
    except RecordError as e:
        return str(e)


def _bulk(data: bytes, count: int, **limits):
    try:
        checked = batches.check_batch(data, count, topic="T", **(limits or LIMITS))
    except RecordError as e:
        return str(e)
    return records.CheckedBatch([int(s) for s in checked.starts], [int(s) for s in checked.sizes],
                                [int(t) for t in checked.tags_codes], list(checked.msg_ids))


@settings(max_examples=100, deadline=None)
@given(batch())
def test_well_formed_batches_are_checked_in_bulk_with_the_rules_results(drawn):
    data, n = drawn
    assert isinstance(_per_record(data, n), records.CheckedBatch)
    checked = batches._check_bulk(data, n, b"T", **LIMITS)  # no fallback: the bulk check took it
    assert checked.header is not None
    assert _bulk(data, n) == _per_record(data, n)


def _corrupt(data, raw: bytearray) -> tuple[bytes, int]:
    kind = data.draw(st.sampled_from(["flip", "set", "cut", "extend", "length", "count"]))
    count = len(records.record_spans(bytes(raw)))
    if kind == "flip":
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] ^= data.draw(st.integers(1, 255))
    elif kind == "set":  # a separator, a high byte or a lying number where a field is
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.sampled_from([0, 1, 2, 0x80, 0xC3, 0xFF]))
    elif kind == "cut":
        raw = raw[:data.draw(st.integers(0, len(raw) - 1))]
    elif kind == "extend":
        raw += data.draw(st.binary(min_size=1, max_size=90))
    elif kind == "length":  # a size or length field of some record off by a little
        start, _ = data.draw(st.sampled_from(records.record_spans(bytes(raw))))
        fields = records.variable_fields(raw, start)
        at, fmt = data.draw(st.sampled_from([(start, ">i"), (start + records.HEADER_SIZE, ">H"),
                                             (fields[2] - 2, ">H"), (fields[4] - 4, ">I"), (fields[6] - 4, ">I")]))
        (value,) = struct.unpack_from(fmt, raw, at)
        struct.pack_into(fmt, raw, at, max(0, value + data.draw(st.integers(-3, 3))))
    else:
        count += data.draw(st.sampled_from([-1, 1, 1000]))
    return bytes(raw), count


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_any_batch_gets_the_rules_verdict_and_message(data):
    """Corrupted or not (a record without UNIQ_KEY, a lying tags code, mixed hosts, a flipped, cut or
    extended byte, a size field off by a little, a wrong count): the bulk check accepts what the rules
    accept, with the same records, and refuses the rest with the rules' message."""
    raw, n = data.draw(batch(well_formed=data.draw(st.booleans())))
    if data.draw(st.booleans()):
        raw, n = _corrupt(data, bytearray(raw))
    if data.draw(st.booleans()) and n >= N:  # another born host in one record
        other = RecordBatchBuilder("T", "elsewhere")
        other.append(b"x", b"UNIQ_KEY\x01X\x02")
        raw, n = raw + bytes(other.buffer), n + 1
    assert _bulk(raw, n) == _per_record(raw, n)


def _builder(n: int, first: int, tag: str = "t") -> RecordBatchBuilder:
    b = RecordBatchBuilder("T", "10.0.0.1")
    for i in range(first, first + n):
        props = records.encode_properties({"UNIQ_KEY": f"ID{i}", "TAGS": tag, "KEYS": f"k{i}"})
        b.append(b"body-%d" % i * (1 + i % 5), props, tags_code=zlib.crc32(tag.encode()), born_timestamp=i)
    return b


def test_a_bad_record_is_named_by_the_rules():
    raw, n = bytes(_builder(N + 2, 0).buffer), N + 2
    spans = records.record_spans(raw)
    start, _ = spans[N - 1]
    bad = bytearray(raw)
    struct.pack_into(">q", bad, start + records.TAGS_OFFSET, 7)
    with pytest.raises(RecordError, match=rf"record {N - 1} of the batch: tags code 7 is not the hash"):
        batches.check_batch(bytes(bad), n, topic="T", **LIMITS)


def test_long_tags_are_hashed_one_by_one_and_a_wrong_code_is_named():
    """Tags of more than batches._MAX_TABLE_TAG bytes (hashed one by one, not in the padded table), mixed
    with short, empty and absent ones: the rules' codes; a long tag's wrong code is the rules' refusal."""
    long_tags = ["x" * (batches._MAX_TABLE_TAG + 1), "y" * 300, "é" * 150]

    def tagged(tags: list[str | None]) -> bytes:
        b = RecordBatchBuilder("T", "h")
        for i in range(N + 3):
            tag = tags[i % len(tags)]
            props = records.encode_properties({"UNIQ_KEY": f"ID{i}"} | ({} if tag is None else {"TAGS": tag}))
            b.append(b"body", props, tags_code=_tags_code(props))
        return bytes(b.buffer)

    # (and one of a table's longest tags among many short ones: the table would outgrow the properties)
    for raw in (tagged([*long_tags, "s", "", None, long_tags[0]]), tagged(["z" * 250] + ["s", "t"] * (N + 3))):
        checked = batches._check_bulk(raw, N + 3, b"T", **LIMITS)  # no fallback: the bulk check took it
        assert [int(t) for t in checked.tags_codes] == records.check_batch(raw, N + 3, topic="T", **LIMITS).tags_codes
    raw = tagged([*long_tags, "s", "", None, long_tags[0]])
    checked = batches._check_bulk(raw, N + 3, b"T", **LIMITS)
    assert {int(t) for t in checked.tags_codes} >= {zlib.crc32(t.encode()) for t in long_tags}
    bad = bytearray(raw)
    start, _ = records.record_spans(raw)[1]  # "y" * 300
    struct.pack_into(">q", bad, start + records.TAGS_OFFSET, zlib.crc32(long_tags[0].encode()))
    with pytest.raises(RecordError, match=r"record 1 of the batch: tags code \d+ is not the hash"):
        batches.check_batch(bytes(bad), N + 3, topic="T", **LIMITS)
    assert _bulk(bytes(bad), N + 3) == _per_record(bytes(bad), N + 3)


def test_a_batch_of_large_properties_is_checked_in_bulk_in_about_its_own_size_of_memory():
    """32 records of 32 KB properties (partly not ASCII): checked in bulk, the check's allocations peak at
    less than three times the batch (numpy's gather by an index of 8 bytes a byte took 15 times it)."""
    b = RecordBatchBuilder("T", "h")
    for i in range(N):
        props = records.encode_properties({"UNIQ_KEY": f"ID{i}", "TAGS": "t" * (i % 3), "big": "v" * 32000 + "é"})
        b.append(b"body", props, tags_code=_tags_code(props))
    raw = bytes(b.buffer)
    limits = dict(max_message_size=1 << 20, max_record_size=1 << 20)
    tracemalloc.start()
    try:
        checked = batches._check_bulk(raw, N, b"T", **limits)  # no fallback: the bulk check took it
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * len(raw)
    assert _bulk(raw, N, **limits) == _per_record(raw, N, **limits) and checked.msg_ids[-1] == f"ID{N - 1}"
    bad = bytearray(raw)
    bad[raw.rindex("é".encode()) + 1] = ord("(")  # not UTF-8, in the last of the pieces decoded
    assert _bulk(bytes(bad), N, **limits) == _per_record(bytes(bad), N, **limits) == (
        f"record {N - 1} of the batch: born host or properties are not valid UTF-8")


def test_a_small_batch_gets_the_per_record_checks_answer_as_it_is():
    raw = bytes(_builder(N - 1, 0).buffer)
    checked = batches.check_batch(raw, N - 1, topic="T", **LIMITS)
    assert type(checked) is records.CheckedBatch and checked == records.check_batch(raw, N - 1, topic="T", **LIMITS)
    assert type(batches.check_batch(raw + bytes(_builder(1, N).buffer), N, topic="T", **LIMITS)) is batches.Checked


def test_the_walk_by_magic_finds_the_size_walks_starts_or_leaves_the_walk_to_it():
    """The records' starts found by their magic are taken only when they are exactly the size fields' chain:
    a body holding a record's first bytes (a size, the magic) is not a start, and the walk goes record by
    record; so is a batch in which as many bodies hold the magic as records have lost theirs."""
    n = batches._MAGIC_WALK_MIN  # (fewer records are walked one by one)
    builder = _builder(n, 0)
    clean = bytes(builder.buffer)
    assert batches._walk_by_magic(clean, n).tolist() == _walked(clean)
    builder.append(struct.pack(">ii", 40, records.MESSAGE_MAGIC), records.encode_properties(
        {"UNIQ_KEY": "IDX", "TAGS": "t"}), tags_code=zlib.crc32(b"t"), born_timestamp=1)
    decoy = bytes(builder.buffer)
    assert batches._walk_by_magic(decoy, n + 1) is None
    assert batches._walk(decoy, n + 1).tolist() == _walked(decoy)
    assert _bulk(decoy, n + 1) == _per_record(decoy, n + 1)
    lost = bytearray(decoy)
    struct.pack_into(">i", lost, _walked(decoy)[5] + 4, 7)  # one magic less, one in a body: as many as records
    assert batches._walk_by_magic(bytes(lost), n + 1) is None
    assert batches._walk(bytes(lost), n + 1).tolist() == _walked(decoy)
    assert _bulk(bytes(lost), n + 1) == _per_record(bytes(lost), n + 1) == "record 5 of the batch: bad magic 0x7"


@settings(max_examples=50, deadline=None)
@given(batch())
def test_the_walk_by_magic_over_many_records_is_the_size_walk_or_nothing(drawn):
    """Batches of drawn records (bodies holding the magic's bytes among them), repeated to the walk by
    magic's size: it finds the size walk's starts or leaves the walk to it, and the check's verdict stands."""
    data, n = drawn
    copies = -(-batches._MAGIC_WALK_MIN // n)
    data, n = data * copies, n * copies
    found = batches._walk_by_magic(data, n)
    assert found is None or found.tolist() == _walked(data)
    assert _bulk(data, n) == _per_record(data, n)


def _walked(data: bytes) -> list[int]:
    return [start for start, _ in records.record_spans(data)] + [len(data)]


def test_msg_ids_decode_on_demand():
    raw, n = bytes(_builder(N + 2, 0).buffer), N + 2
    checked = batches.check_batch(raw, n, topic="T", **LIMITS)
    assert len(checked.msg_ids) == n and checked.msg_ids[-1] == f"ID{n - 1}"
    assert list(checked.msg_ids) == [f"ID{i}" for i in range(n)] == checked.msg_ids[:]
    assert checked.msg_ids == [f"ID{i}" for i in range(n)] == checked.msg_ids  # equal as a list of them is
    assert checked.msg_ids == tuple(checked.msg_ids) and checked.msg_ids != [f"ID{i}" for i in range(1, n + 1)]
    assert checked.msg_ids != [f"ID{i}" for i in range(n - 1)] and checked.msg_ids != "ID0"


def _counting_seals(monkeypatch) -> list[int]:
    """batches.seal_all made to count its calls (how many batches were sealed in bulk)."""
    calls = []
    seal_all = batches.seal_all

    def counted(*args):
        calls.append(len(args[1]))
        seal_all(*args)

    monkeypatch.setattr(batches, "seal_all", counted)
    return calls


def test_batches_stamped_in_bulk_survive_recovery_across_segment_ends(open_store, clock, monkeypatch):
    """Batches of N + 5 records (about 5.3 KB) into 16 KiB segments: most fit their segment (stamped and
    sealed in bulk), some cross an end (sealed record by record). After a crash, recovery checks every
    CRC and stated offset, and every record reads back with its queue offset, store time and consume-queue
    entry."""
    sizes = []
    sealed = _counting_seals(monkeypatch)

    async def write():
        store, _ = open_store(commitlog_segment_size=16384)
        await store.start()
        for b in range(8):
            data = bytes(_builder(N + 5, b * (N + 5), tag="t" if b % 2 else "u").buffer)
            put = store.append_records("T", 1, data, N + 5)
            first = b * (N + 5)
            assert put.first_offset == first and put.msg_ids == [f"ID{i}" for i in range(first, first + N + 5)]
            assert type(put.end) is int and put.end == store.commit_log_max_offset
            sizes.append(len(data))
        other_topic = RecordBatchBuilder("U")
        other_topic.append(b"x", b"UNIQ_KEY\x01X\x02")
        with pytest.raises(InvalidArgumentError, match=f"record {N} of the batch: topic b'U' is not the request's"):
            store.append_records("T", 1, bytes(_builder(N, 0).buffer) + bytes(other_topic.buffer), N + 1)
        # abandoned without shutdown: a crash

    asyncio.run(write())
    assert 4 <= len(sealed) < 8 and set(sealed) == {N + 5}  # in bulk, but not every batch
    store, report = open_store(commitlog_segment_size=16384)
    assert report.truncated_bytes == 0 and report.commit_log_end == store.commit_log_max_offset
    total = 8 * (N + 5)
    assert store.max_offset("T", 1) == total
    seen_store_ts = set()
    for offset in range(total):
        message = store.message_at("T", 1, offset)
        assert message.queue_offset == offset and message.queue_id == 1
        assert message.body == b"body-%d" % offset * (1 + offset % 5)
        assert message.properties["UNIQ_KEY"] == f"ID{offset}"
        assert message.tags_code == zlib.crc32(b"t" if offset // (N + 5) % 2 else b"u")
        seen_store_ts.add(message.store_timestamp)
    assert len(seen_store_ts) == 8  # one store time per batch
    entries = store._queues.get("T", 1).read_entries(0, total)
    assert [e[0] for e in entries] == sorted({e[0] for e in entries})
    assert all(store.read_message(phys).queue_offset == i for i, (phys, _, _) in enumerate(entries))


def _store_bytes(directory) -> dict[str, bytes]:
    """Every commit-log and consume-queue file under a store's directory, by its relative path."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.parent != directory}


def test_a_batch_sealed_in_bulk_is_stored_byte_for_byte_as_one_sealed_record_by_record(
        config, tmp_path, monkeypatch):
    """The same batches through the bulk path and the per-record path, with the same store times: the same
    commit-log and consume-queue bytes, the same answers, and every record's CRC holds."""
    plan = [(0, _builder(N, 0)), (1, _builder(N + 3, 100, tag="v")), (0, _builder(2 * N, N, tag=""))]
    stored = {}
    for path, bulk_min in (("bulk", N), ("each", 10**9)):
        monkeypatch.setattr(batches, "BULK_MIN", bulk_min)
        sealed = _counting_seals(monkeypatch)
        store = MessageStore(dataclasses.replace(config, data_dir=tmp_path / path, commitlog_segment_size=1 << 16),
                             clock=itertools.count(1_700_000_000_000, 7).__next__)
        store.load()
        asyncio.run(store.start())
        puts = [store.append_records("T", queue_id, bytes(b.buffer), b.count) for queue_id, b in plan]
        answers = [(p.first_offset, list(p.msg_ids), p.store_timestamp, p.end) for p in puts]
        stored[path] = answers, _store_bytes(tmp_path / path), len(sealed)
    (bulk_answers, bulk_files, bulk_seals), (each_answers, each_files, each_seals) = stored["bulk"], stored["each"]
    assert (bulk_seals, each_seals) == (len(plan), 0)
    assert bulk_answers == each_answers
    assert bulk_files.keys() == each_files.keys() and any("consumequeue" in name for name in bulk_files)
    assert bulk_files == each_files
    [log] = [data for name, data in bulk_files.items() if name.startswith("commitlog")]
    spans = records.record_spans(log[:bulk_answers[-1][3]])
    assert len(spans) == sum(b.count for _, b in plan)
    assert all(records.crc_ok(log, start, size) for start, size in spans)
