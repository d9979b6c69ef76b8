"""A producer's record batch checked and stamped whole: numpy over the header fields, no Python step per record.

`records.check_batch` states the rules of a record batch one record at a time,
in Python (about 2 us a record). Here the same rules are applied to every
record of a batch at once: the records' starts found by their magic numbers
and checked against their size fields (in a batch of 256 records or more; in a
smaller one a walk over the size fields, a step per record of ~70 ns), then
magic, sizes, topic, timestamps and size limits compared
over the gathered headers; the property sections laid end to end and checked
as one string (UTF-8, the "key\\x01value\\x02" pairs, found by their separator
bytes); UNIQ_KEY and TAGS found among the pairs' keys, the tags code compared
with the hash of each distinct tag. A batch that breaks any rule is checked
again record by record by `records.check_batch`, whose RecordError names the
first record at fault and its fault: the messages are the rules' own, and the
two checks accept exactly the same batches (tests/unit/store/test_batches.py
holds them to it on random and corrupted batches).

Stamping is whole-batch too: queue id, queue offsets and store time go into
the gathered headers and back into the buffer with one scatter, and the commit
log's physical offsets and CRCs with two more (the CRCs themselves are one
ISA-L call per record, the one Python step per record left, ~90 ns: a record's
CRC covers fields the broker writes).

Batches of fewer than BULK_MIN records take the per-record path, which costs
less than numpy's fixed overhead there (a send at low load is a batch of one).
That overhead is larger in the broker than in a warm loop: between two batches
the broker runs gRPC's and its own code, and each of the check's ~50 numpy calls
then costs 2-3 times what timeit shows (the bulk check of 32 records of 1 KiB:
46 us in timeit, 104-120 us in a broker taking `send_batch(32)`; the per-record
check 68 and 76 us). The two paths cost the broker the same near 48 to 64 records.
"""

from __future__ import annotations

import array
import functools
import struct
import zlib
from collections.abc import Iterator, Sequence

import numpy as np

from tidemark.broker.store import codec
from tidemark.common import records
from tidemark.common.crc import crc32
from tidemark.common.protocol import PropertyKey

# Below this many records a batch is checked and stamped record by record (numpy's fixed cost is more there).
BULK_MIN = 48

assert array.array("I").itemsize == 4  # (seal_all hands numpy its CRCs as an array of them)
# A record's fixed header (records.HEADER) and its born host's length, big-endian as stored.
_HEAD_FIELDS = [("size", ">i4"), ("magic", ">i4"), ("crc", ">u4"), ("queue_id", ">i4"), ("flag", ">i4"),
                ("queue_offset", ">i8"), ("phys", ">i8"), ("sys_flag", ">i4"), ("born", ">i8"), ("stored", ">i8"),
                ("reconsume", ">i4"), ("tags_code", ">i8")]
_HEAD = np.dtype(_HEAD_FIELDS)
assert _HEAD.itemsize == records.HEADER_SIZE
assert _HEAD.fields["queue_offset"][1] == records.QUEUE_OFFSET_OFFSET
assert _HEAD.fields["stored"][1] == records.STORE_TS_OFFSET and _HEAD.fields["tags_code"][1] == records.TAGS_OFFSET
# The header bytes the broker stamps before the commit log: queue id .. store timestamp.
_STAMPED = slice(records.QUEUE_ID_OFFSET, records.STORE_TS_OFFSET + 8)

# The walk by magic costs about 10 us a batch and 0.02 ns a byte before its first record, plus a few ns for
# each byte of a body that looks like the magic's first; the walk record by record about 70 ns a record. So
# the first is taken for batches of this many records or more, of records of up to this many bytes on average.
_MAGIC_WALK_MIN = 256
_MAGIC_WALK_MAX_SIZE = 512
_MAGIC = np.frombuffer(records.I32.pack(records.MESSAGE_MAGIC), dtype=np.uint8)
_NAME_VALUE = ord(records.NAME_VALUE_SEPARATOR)
_PAIR_END = ord(records.PROPERTY_SEPARATOR)
_UNIQ = PropertyKey.UNIQ_KEY.encode()
_TAGS = PropertyKey.TAGS.encode()
# Tags longer than this are hashed one by one (a padded table of them would be mostly padding).
_MAX_TABLE_TAG = 256
_PADDING = bytes(_MAX_TABLE_TAG)
# Property sections of up to this many bytes on average are laid end to end by numpy (_joined).
_GATHER_MAX = 64
# The property sections are checked for UTF-8 this many bytes at a time (a str of them is up to 4 times their size).
_DECODE_CHUNK = 1 << 18


class _Unfit(Exception):
    """The batch breaks a rule: records.check_batch finds which record and says what is wrong."""


class Checked:
    """A batch that passed the bulk check: numpy arrays of where each record starts, its size and tags code;
    its message ids, decoded on demand; each record's gathered header, for stamping. (The per-record check
    answers with its records.CheckedBatch of lists.)"""

    __slots__ = ("starts", "sizes", "tags_codes", "msg_ids", "header", "_pairs")

    def __init__(self, starts: np.ndarray, sizes: np.ndarray, tags_codes: np.ndarray, msg_ids: MsgIds,
                 header: np.ndarray, pairs: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        self.starts, self.sizes, self.tags_codes, self.msg_ids, self.header = starts, sizes, tags_codes, msg_ids, header
        self._pairs = pairs  # (the property sections end to end, where each pair starts, its \x01)

    def has_key(self, *keys: bytes) -> bool:
        """Whether any record has a property named one of `keys`: a few vector operations over the pairs the
        check found (a substring search of the batch's bytes costs about 0.07 us a record of 200 bytes)."""
        joined, pair_at, seps = self._pairs
        lengths, firsts = seps - pair_at, joined[pair_at]
        for key in keys:
            # (keys of its length starting with its first letter: a UNIQ_KEY in every record has TRAN_MSG's length)
            candidates = np.flatnonzero((lengths == len(key)) & (firsts == key[0]))
            if len(candidates) and _has_key(joined, pair_at[candidates], seps[candidates], key).any():
                return True
        return False


class MsgIds(Sequence[str]):
    """The message ids of a checked batch, decoded one by one when asked for (only traces read them all).
    Equal to a list or tuple of the same ids, as a list of them would be."""

    __slots__ = ("_data", "_at", "_len")

    def __init__(self, data: np.ndarray, at: np.ndarray, length: np.ndarray) -> None:
        self._data, self._at, self._len = data, at, length

    def __len__(self) -> int:
        return len(self._at)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        at = int(self._at[index])
        return self._data[at:at + int(self._len[index])].tobytes().decode("utf-8")

    def __iter__(self) -> Iterator[str]:
        data = self._data.tobytes()
        for at, n in zip(self._at.tolist(), self._len.tolist(), strict=True):
            yield data[at:at + n].decode("utf-8")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, list | tuple | MsgIds):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # (as a list's)

    def __repr__(self) -> str:
        return f"MsgIds({list(self)!r})"


def check_batch(data: bytes | bytearray, count: int, *, topic: str, max_message_size: int,
                max_record_size: int) -> Checked | records.CheckedBatch:
    """Check a producer's batch before anything of it is stored, by records.check_batch's rules; raises
    its RecordError (naming the record and the fault) when one is broken. A batch of BULK_MIN records or
    more is checked in bulk (a Checked), a smaller one by records.check_batch (its CheckedBatch)."""
    if count >= BULK_MIN:
        topic_bytes = topic.encode("utf-8")
        if len(topic_bytes) <= records.MAX_SHORT_STRING:
            try:
                return _check_bulk(data, count, topic_bytes, max_message_size, max_record_size)
            except _Unfit:
                pass  # the per-record check below finds the fault and names it
    return records.check_batch(data, count, topic=topic, max_message_size=max_message_size,
                               max_record_size=max_record_size)


def _rows(buf: np.ndarray, width: int) -> np.ndarray:
    """Every run of `width` bytes of buf, one row per start position (a view: nothing is copied);
    rows[positions] gathers the runs at those positions in one call."""
    return np.ndarray((max(len(buf) - width + 1, 0), width), dtype=np.uint8, buffer=buf, strides=(1, 1))


def _runs(buf: np.ndarray, dtype: np.dtype | str) -> np.ndarray:
    """The item of `dtype` at every position of buf, one per start position (a view: nothing is copied);
    runs[positions] reads the items at those positions in one call, and runs[positions] = items writes
    them. (Three times as fast as _rows for the same bytes: one item per position, not `width` bytes.)"""
    dtype = np.dtype(dtype)  # (not a structured one: numpy copies those field by field)
    return np.ndarray((max(len(buf) - dtype.itemsize + 1, 0),), dtype=dtype, buffer=buf, strides=(1,))


_all = np.logical_and.reduce
_min = np.minimum.reduce
_max = np.maximum.reduce


def _require(ok: bool | np.bool_) -> None:
    if not ok:
        raise _Unfit


@functools.lru_cache(maxsize=64)
def _layout(prefix_len: int) -> np.dtype:
    """The first bytes of a record of the batch's born host and topic: the fixed header, then host length,
    host, topic length and topic (`prefix`: the same bytes in every record, compared whole), then the
    properties' length."""
    return np.dtype(_HEAD_FIELDS + [("prefix", f"V{prefix_len}"), ("props_len", ">u4")])


def _walk(data: bytes | bytearray, count: int) -> np.ndarray:
    """Where each of `count` records starts, by their size fields, and where the last one ends (count + 1
    positions)."""
    if count > len(data) // records.MIN_RECORD_SIZE:
        raise _Unfit  # (also bounds the walk below)
    bounds = _walk_by_magic(data, count)
    if bounds is not None:
        return bounds
    bounds = [0] * (count + 1)
    unpack = records.I32.unpack_from
    pos = 0
    try:
        for i in range(1, count + 1):
            pos += unpack(data, pos)[0]
            bounds[i] = pos
    except struct.error:
        raise _Unfit from None
    return np.array(bounds, dtype=np.int64)


def _walk_by_magic(data: bytes | bytearray, count: int) -> np.ndarray | None:
    """_walk's answer without a Python step per record, when it can be had: None when not (then the walk
    goes record by record).

    Every record has the magic number at byte 4, so every start is among the positions p with the magic
    at p + 4: found with one byte comparison over the batch (the 8-byte words that hold a hit are found
    first, so only they are looked into: numpy's nonzero over a byte each costs 5 times the comparison).
    If those positions are exactly a chain, the first at 0 and each the one before plus its size field,
    they are what the walk from 0 would find, and its last bound is the last one plus its size. A body
    that holds the magic's bytes adds a position out of the chain, and the walk goes record by record.
    (Over 2,048 sink records of 360 bytes: about 36 ns a record, the walk 70; but with a fixed cost of
    about 10 us, and of 1 KiB records of random bytes it has 4 hits a record to look into: see
    _MAGIC_WALK_MIN.)"""
    if count < _MAGIC_WALK_MIN or len(data) > _MAGIC_WALK_MAX_SIZE * count:
        return None
    buf = np.frombuffer(data, dtype=np.uint8)
    n = len(buf) - 4  # the magic's first byte for a start p is at p + 4
    hits = np.empty(-(-n // 8) * 8, dtype=np.bool_)
    np.equal(buf[4:], _MAGIC[0], out=hits[:n])
    hits[n:] = False
    words = hits.view(np.uint64)
    held = np.flatnonzero(words != 0)
    if len(held) > 2 * count:  # (bodies full of the magic's first byte: not worth following)
        return None
    within = np.flatnonzero(words[held].view(np.bool_))
    at = held[within >> 3] * 8 + (within & 7)
    at = at[at <= len(buf) - 8]  # (the whole magic, and the size before it, inside the batch)
    ints = _runs(buf, ">i4")
    at = at[ints[at + 4] == records.MESSAGE_MAGIC]
    if len(at) != count or at[0] != 0:
        return None
    ends = at + ints[at]
    if not _all(ends[:-1] == at[1:]):
        return None
    return np.append(at, ends[-1])


def _check_bulk(data: bytes | bytearray, count: int, topic: bytes, max_message_size: int,
                max_record_size: int) -> Checked:
    bounds = _walk(data, count)
    sizes = bounds[1:] - bounds[:-1]
    smallest = int(_min(sizes))
    # Every size at least a record's smallest: the walk only went forward.
    _require(int(bounds[-1]) == len(data) and smallest >= records.MIN_RECORD_SIZE
             and _max(sizes) <= max_record_size)
    # A producer's batch has one born host: every record is read as having the first one's (and the
    # request's topic); one that has not is refused here, and the per-record check says what it has.
    (host_len,) = records.U16.unpack_from(data, records.HEADER_SIZE)
    host_at = records.HEADER_SIZE + 2
    try:
        bytes(data[host_at:host_at + host_len]).decode("utf-8")
    except UnicodeDecodeError:
        raise _Unfit from None
    prefix = bytes(data[records.HEADER_SIZE:host_at + host_len]) + records.U16.pack(len(topic)) + topic
    layout = _layout(len(prefix))
    width = layout.itemsize
    _require(smallest >= width + 4)  # room for the prefix and every length field in each record
    starts, ends = bounds[:-1], bounds[1:]
    buf = np.frombuffer(data, dtype=np.uint8)
    head = _runs(buf, f"V{width}")[starts].view(layout)  # (gathered as raw bytes: 15 times as fast)
    props_len = head["props_len"].astype(np.int64)
    props_at = starts + width
    body_len_at = props_at + props_len
    # (read where it cannot be when the properties run past the record: the sum below is then too big)
    body_len = _runs(buf, ">u4")[np.minimum(body_len_at, len(buf) - 4)].astype(np.int64)
    ok = head["prefix"] == np.void(prefix)
    ok &= head["magic"] == records.MESSAGE_MAGIC
    ok &= head["born"] >= 0
    ok &= head["reconsume"] >= 0
    ok &= body_len_at + 4 + body_len == ends
    ok &= props_len + body_len <= max_message_size
    ok &= props_len > 0  # every record has a UNIQ_KEY property, so no property section is empty
    _require(_all(ok))
    joined, offsets = _joined(data, props_at, props_len)
    pair_at, seps, pair_ends = _pairs(joined, offsets)
    sections = offsets[:-1]
    first = pair_at.searchsorted(sections)  # each section's first pair (a section starts a pair)
    uniq = first if _all(_has_key(joined, sections, seps[first], _UNIQ)) else _first_with_key(
        joined, pair_at, seps, pair_ends, offsets, _UNIQ)
    _require(len(uniq) == count)  # (the first such pair of each record, in order: every record has one)
    uniq_at = seps[uniq] + 1
    uniq_len = pair_ends[uniq] - uniq_at
    _require(_min(uniq_len) > 0)
    tags_codes = head["tags_code"].astype(np.int64)
    tagged = _first_with_key(joined, pair_at, seps, pair_ends, offsets, _TAGS)
    if len(tagged):
        expected = np.zeros(count, dtype=np.int64)
        rows = offsets.searchsorted(pair_ends[tagged], side="right") - 1
        expected[rows] = _tag_codes(joined, seps[tagged] + 1, pair_ends[tagged] - seps[tagged] - 1)
        _require(_all(tags_codes == expected))
    else:
        _require(not tags_codes.any())
    return Checked(starts, sizes, tags_codes, MsgIds(joined, uniq_at, uniq_len), head, (joined, pair_at, seps))


def _joined(data: bytes | bytearray, at: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The byte ranges [at, at + length) of data laid end to end, then _MAX_TABLE_TAG zero bytes (so a run of
    up to that many bytes can be read from any position before them), and where each range starts in it
    (n + 1 offsets).

    Short ranges (a sink's property sections, about 50 bytes) are gathered by numpy through an index of
    their bytes (4 bytes of index a byte: about 45 ns a range of 50 bytes); longer ones are sliced and
    joined, a Python step per range (~75 ns) and nothing per byte but the copies (the index costs about
    1.7 ns a byte, so above _GATHER_MAX bytes a range it costs more than the step)."""
    offsets = np.zeros(len(at) + 1, dtype=np.int64)
    np.cumsum(length, out=offsets[1:])
    total = int(offsets[-1])
    if total <= _GATHER_MAX * len(at) and len(data) < 1 << 31:
        index = np.repeat((at - offsets[:-1]).astype(np.int32), length)
        index += np.arange(total, dtype=np.int32)
        joined = np.empty(total + _MAX_TABLE_TAG, dtype=np.uint8)
        np.take(np.frombuffer(data, dtype=np.uint8), index, out=joined[:total])
        joined[total:] = 0
        return joined, offsets
    parts = [data[a:b] for a, b in zip(at.tolist(), (at + length).tolist(), strict=True)]
    parts.append(_PADDING)
    return np.frombuffer(b"".join(parts), dtype=np.uint8), offsets


def _pairs(joined: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The non-empty property sections, laid end to end (_joined), as "key\\x01value\\x02" pairs: where each
    pair starts, its \\x01 and its \\x02. Raises _Unfit unless every section is such pairs with non-empty keys,
    in UTF-8 (records.check_batch's regular expression and decode, over all sections at once).

    Every section must end with \\x02: then the pairs found over the whole string never cross from one
    section into the next, and (\\x02 being ASCII) every section starts on a character of the string,
    so the string's being UTF-8 makes each section UTF-8. (It is decoded in pieces of whole sections:
    pieces in UTF-8 make a string in UTF-8.)"""
    _require(_all(joined[offsets[1:] - 1] == _PAIR_END))
    if _max(joined) >= 0x80:
        total = int(offsets[-1])
        cuts = offsets[offsets.searchsorted(np.arange(_DECODE_CHUNK, total, _DECODE_CHUNK))].tolist()
        view = memoryview(joined)
        try:
            for a, b in zip([0, *cuts], [*cuts, total], strict=True):
                str(view[a:b], "utf-8")
        except UnicodeDecodeError:
            raise _Unfit from None
    pair_ends = (joined == _PAIR_END).nonzero()[0]
    seps = (joined == _NAME_VALUE).nonzero()[0]
    _require(len(pair_ends) == len(seps))
    pair_at = np.zeros(len(pair_ends), dtype=np.int64)
    pair_at[1:] = pair_ends[:-1] + 1
    # One \x01 in each pair, after a non-empty key: with as many \x01 as \x02 and each between its
    # pair's start and end, no pair holds two.
    _require(_all((pair_at < seps) & (seps < pair_ends)))
    return pair_at, seps, pair_ends


def _has_key(joined: np.ndarray, pair_at: np.ndarray, seps: np.ndarray, key: bytes) -> np.ndarray:
    """Whether the key of each of these pairs is `key` (compared as one integer when it fits one)."""
    if len(joined) < len(key):
        return np.zeros(len(pair_at), dtype=bool)
    # (a pair too near the end to hold the key is read from further back: its length differs anyway)
    at = np.minimum(pair_at, len(joined) - len(key))
    if len(key) in (1, 2, 4, 8):
        same = _runs(joined, f"<u{len(key)}")[at] == int.from_bytes(key, "little")
    else:
        same = _runs(joined, f"V{len(key)}")[at] == np.void(key)
    return same & (seps - pair_at == len(key))


def _first_with_key(joined: np.ndarray, pair_at: np.ndarray, seps: np.ndarray, pair_ends: np.ndarray,
                    offsets: np.ndarray, key: bytes) -> np.ndarray:
    """The first pair of each record whose key is `key` (as records.property_value finds it), in order."""
    candidates = (seps - pair_at == len(key)).nonzero()[0]
    if not len(candidates):
        return candidates
    candidates = candidates[_has_key(joined, pair_at[candidates], seps[candidates], key)]
    rows = offsets.searchsorted(pair_ends[candidates], side="right")
    keep = np.ones(len(candidates), dtype=bool)
    keep[1:] = rows[1:] != rows[:-1]
    return candidates[keep]


def _tag_codes(joined: np.ndarray, at: np.ndarray, length: np.ndarray) -> np.ndarray | int:
    """tag_hash of each tag (0 for an empty one), computed once per distinct tag."""
    first = joined[at[0]:at[0] + length[0]].tobytes()
    if (length == len(first)).all() and (not first or (_rows(joined, len(first))[at] == joined[at[0]:at[0] + len(first)]).all()):
        return zlib.crc32(first) if first else 0  # one tag for all (a batch from one writer often has)
    codes = np.zeros(len(at), dtype=np.int64)
    present = np.nonzero(length > 0)[0]
    at, length = at[present], length[present]
    width = int(length.max())
    if width > _MAX_TABLE_TAG or len(at) * (4 + width) > len(joined):
        # (a table bigger than the property sections: a long tag among short ones)
        view = memoryview(joined)
        cache: dict[bytes, int] = {}
        codes[present] = [cache.setdefault(tag, zlib.crc32(tag)) for tag in
                          (bytes(view[a:a + n]) for a, n in zip(at.tolist(), length.tolist(), strict=True))]
        return codes
    # Each tag as a row of its length (4 bytes) and its bytes, zero-padded: equal rows, equal tags.
    tags = _rows(joined, width)[at]  # (every row in range: joined ends with _MAX_TABLE_TAG zero bytes)
    tags[np.arange(width) >= length[:, None]] = 0
    table = np.empty((len(at), 4 + width), dtype=np.uint8)
    table[:, :4] = length.astype("<u4").view(np.uint8).reshape(-1, 4)
    table[:, 4:] = tags
    distinct, inverse = np.unique(table.view(f"V{4 + width}").reshape(-1), return_inverse=True)
    hashes = [zlib.crc32(row[4:4 + int.from_bytes(row[:4], "little")]) for row in map(bytes, distinct)]
    codes[present] = np.array(hashes, dtype=np.int64)[inverse.reshape(-1)]
    return codes


# -- stamping --------------------------------------------------------------------------------------------


def stamp(buf: bytearray, checked: Checked | records.CheckedBatch, queue_id: int, first_offset: int,
          store_timestamp: int) -> codec.EncodedBatch:
    """Queue id, queue offsets (first_offset, first_offset + 1, ...) and store time, in place; the batch as
    the commit log takes it (with its records' starts when it was checked in bulk: it is sealed in bulk)."""
    if type(checked) is records.CheckedBatch:
        pack_i32, pack_i64 = records.I32.pack_into, records.I64.pack_into
        offset = first_offset
        for start in checked.starts:
            pack_i32(buf, start + records.QUEUE_ID_OFFSET, queue_id)
            pack_i64(buf, start + records.QUEUE_OFFSET_OFFSET, offset)
            pack_i64(buf, start + records.STORE_TS_OFFSET, store_timestamp)
            offset += 1
        return codec.EncodedBatch(buf, checked.sizes)
    head = checked.header
    head["queue_id"] = queue_id
    head["queue_offset"] = np.arange(first_offset, first_offset + len(head), dtype=np.int64)
    head["stored"] = store_timestamp
    raw = head.view(np.uint8).reshape(len(head), head.dtype.itemsize)
    target = np.frombuffer(buf, dtype=np.uint8)
    _runs(target, f"V{_STAMPED.stop - _STAMPED.start}")[checked.starts + _STAMPED.start] = (
        raw[:, _STAMPED].copy().view(f"V{_STAMPED.stop - _STAMPED.start}").reshape(-1))
    return codec.EncodedBatch(buf, checked.sizes, checked.starts)


def seal_all(buf: bytearray, starts: np.ndarray, sizes: np.ndarray, positions: np.ndarray) -> None:
    """records.seal for every record: its physical offset, then its CRC, in place."""
    target = np.frombuffer(buf, dtype=np.uint8)
    _runs(target, ">i8")[starts + records.PHYS_OFFSET_OFFSET] = positions
    view = memoryview(buf)
    crcs = [crc32(view[a:b]) for a, b in zip((starts + 12).tolist(), (starts + sizes).tolist(), strict=True)]
    # (through array.array: numpy takes a list of ints at about 15 ns an int, array.array at 3)
    _runs(target, ">u4")[starts + records.CRC_OFFSET] = np.frombuffer(array.array("I", crcs), dtype=np.uint32)
