"""spark_connector/encode.py: records encoded column by column are the bytes the per-row encoder makes."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.client import Message
from tidemark.client.errors import InvalidArgumentError
from tidemark.client.producer.encoding import encode_message
from tidemark.common.protocol import PropertyKey
from tidemark.common.records import (
    HEADER,
    RecordBatchBuilder,
    check_batch,
    decode_properties,
    record_spans,
    variable_fields,
)
from tidemark.spark_connector.encode import RecordEncoder, record_bytes

_TEXT = st.text(st.characters(blacklist_characters="\x01\x02|", blacklist_categories=("Cs",)), max_size=12)
ROWS = st.lists(st.tuples(st.binary(min_size=1, max_size=300), st.none() | _TEXT, st.none() | _TEXT),
                min_size=1, max_size=40)


class _Ids:
    def __init__(self, ids):
        self._ids = iter(ids)

    def next(self):
        return next(self._ids)


def batch_of(rows, *, string_body=False):
    bodies = [b.decode("latin-1") for b, _, _ in rows] if string_body else [b for b, _, _ in rows]
    return pa.RecordBatch.from_arrays(
        [pa.array(bodies, pa.string() if string_body else pa.binary()), pa.array([k for _, k, _ in rows], pa.string()),
         pa.array([t for _, _, t in rows], pa.string())], names=["body", "keys", "tags"])


@settings(max_examples=30, deadline=None)
@given(rows=ROWS, start=st.integers(0, 5))
def test_bulk_records_equal_the_per_row_encoders_and_pass_the_brokers_check(rows, start):
    encoder = RecordEncoder("Topic_1", "10.0.0.7", 4 * 1024 * 1024)
    batch = batch_of(rows).slice(0)
    records, offsets = encoder.encode(batch, first_row=100)
    start = min(start, len(rows) - 1)
    data = record_bytes(records, offsets, start, len(rows))
    check_batch(data, len(rows) - start, topic="Topic_1", max_message_size=4 * 1024 * 1024,
                max_record_size=8 * 1024 * 1024)
    spans = record_spans(data)
    ids = [decode_properties(data[a:a + n])[PropertyKey.UNIQ_KEY]
           for s, _ in spans for _, _, _, _, a, n, _, _ in [variable_fields(data, s)]]
    born = HEADER.unpack_from(data, 0)[8]
    builder = RecordBatchBuilder("Topic_1", "10.0.0.7")
    for body, keys, tags in rows[start:]:
        _, props, code = encode_message(Message("Topic_1", body, keys=keys or "", tags=tags or ""), _Ids(ids[:1]))
        ids = ids[1:]
        builder.append(body, props, tags_code=code, born_timestamp=born)
    assert data == bytes(builder.buffer)
    assert len(set(decode_properties(data[a:a + n])[PropertyKey.UNIQ_KEY]
                   for s, _ in spans for _, _, _, _, a, n, _, _ in [variable_fields(data, s)])) == len(spans)


def test_string_bodies_are_their_utf8_bytes_and_a_sliced_batch_encodes_its_own_rows():
    rows = [(b"a" * 5, "k", None), (b"bb", None, "t"), (b"ccc", "", "")]
    encoder = RecordEncoder("T", "", 1024)
    records, offsets = encoder.encode(batch_of(rows, string_body=True).slice(1), first_row=0)
    data = record_bytes(records, offsets, 0, 2)
    bodies = [bytes(data[a:a + n]) for s, _ in record_spans(data) for *_, a, n in [variable_fields(data, s)]]
    assert bodies == [b"bb", b"ccc"]


@pytest.mark.parametrize("body_type", [pa.large_binary(), pa.large_string()])
def test_bodies_of_arrow_s_large_types_encode_as_binary_ones(body_type):
    """spark.sql.execution.arrow.useLargeVarTypes hands the sink large_binary and large_string columns."""
    rows = [(b"a" * 5, "k", None), (b"bb", None, "t")]
    binary = batch_of(rows)
    large = pa.RecordBatch.from_arrays([binary.column(0).cast(body_type), binary.column(1), binary.column(2)],
                                       names=["body", "keys", "tags"])
    data = [record_bytes(*RecordEncoder("T", "", 1024).encode(b, first_row=0), 0, 2) for b in (binary, large)]
    bodies = [bytes(data[1][a:a + n]) for s, _ in record_spans(data[1]) for *_, a, n in [variable_fields(data[1], s)]]
    assert bodies == [b"a" * 5, b"bb"]


@pytest.mark.parametrize(("rows", "error"), [
    ([(b"x", None, None), (None, None, None)], "row 11 has a null body"),
    ([(b"x", None, None), (b"", None, None)], "row 11: message body must not be empty"),
    ([(b"x" * 2000, None, None)], "row 10: message body is 2000 bytes; max_message_size is 1024"),
    ([(b"x", "a\x01b", None)], "row 10: keys must not contain"),
    ([(b"x", None, "a||b")], "row 10: tags must not contain '||'"),
    ([(b"x", "k", "t"), (b"y", "k", "a\x02")], "row 11: tags must not contain '.x02'"),
    ([(b"x", "k\x02", None)], "row 10: keys must not contain '.x02'"),
])
def test_bad_rows_are_refused_with_their_row_number(rows, error):
    batch = pa.RecordBatch.from_arrays(
        [pa.array([b for b, _, _ in rows], pa.binary()), pa.array([k for _, k, _ in rows], pa.string()),
         pa.array([t for _, _, t in rows], pa.string())], names=["body", "keys", "tags"])
    with pytest.raises(InvalidArgumentError, match=error.replace("|", r"\|")):
        RecordEncoder("T", "", 1024).encode(batch, first_row=10)


@pytest.mark.parametrize("text_type", [pa.string(), pa.large_string()])
def test_a_separator_is_found_in_the_rows_of_a_slice_only(text_type):
    """The separator check reads the values' bytes of the batch's own rows, in either offset width: a
    slice's neighbours do not count, and its own rows are all read."""
    keys = pa.array(["a", "b", "c", "d", "e\x02"], text_type)
    batch = pa.RecordBatch.from_arrays([pa.array([b"x"] * 5, pa.binary()), keys], names=["body", "keys"])
    encoder = RecordEncoder("T", "", 1024)
    encoder.encode(batch.slice(0, 2), first_row=0)
    encoder.encode(batch.slice(2, 2), first_row=0)
    with pytest.raises(InvalidArgumentError, match="row 21: keys must not contain"):
        encoder.encode(batch.slice(3), first_row=20)
