"""broker/ingest/steering.py: which record of a batch carries a delay level or a transaction's half, read
the same whether the store checked the batch in bulk or record by record, and RocketMQ 4's DELAY property
as a send's delay level."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.broker.errors import InvalidArgumentError
from tidemark.broker.ingest.send import OutgoingMessage
from tidemark.broker.ingest.steering import delay_from_property, steering_record
from tidemark.broker.store import batches
from tidemark.common.records import RecordBatchBuilder, encode_properties

EXTRA = st.sampled_from([{}, {}, {"DELAY": "2"}, {"DELAY": "0"}, {"DELAY": ""}, {"TRAN_MSG": "true"},
                         {"TRAN_MSG": "TRUE"}, {"TRAN_MSG": "false"}, {"XDELAY": "3"}, {"TRAN_MSGX": "true"},
                         {"KEYS": "DELAY\x02"[:-1]},
                         {"DELIVER_TIMESTAMP": "900"}, {"DELIVER_TIMESTAMP": "1100"},
                         {"DELIVER_TIMESTAMP": "soon"}, {"DELAY": "00"}, {"DELAY": "-1"}, {"DELAY": " "},
                         {"DELAY": "x"}, {"DELAY": "99"}])
NOW_MS = 1000
LEVELS = 18  # the broker's delay levels (its default: 1s 5s ... 2h)


def expected(extras: list[dict[str, str]]) -> tuple[int, str] | None:
    for i, extra in enumerate(extras):
        delay = extra.get("DELAY", "0").strip() or "0"
        if not delay.lstrip("-").isdigit() or int(delay) > 0:  # (no integer: a send would refuse it)
            return i, "DELAY"
        if extra.get("TRAN_MSG", "").lower() == "true":
            return i, "TRAN_MSG"
        if extra.get("DELIVER_TIMESTAMP") in ("1100", "soon"):  # ahead of NOW_MS, or no time at all
            return i, "DELIVER_TIMESTAMP"
    return None


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.lists(EXTRA, min_size=1, max_size=31), st.lists(EXTRA, min_size=32, max_size=80)),
       st.binary(max_size=20))
def test_the_bulk_and_the_per_record_check_name_the_same_record(extras, body):
    b = RecordBatchBuilder("S", "h")
    for i, extra in enumerate(extras):  # (bodies that spell a key do not count: only properties)
        b.append(body + b"DELAY\x01TRAN_MSG\x01", encode_properties({"UNIQ_KEY": f"ID{i}", **extra}))
    data = bytes(b.buffer)
    checked = batches.check_batch(data, len(extras), topic="S", max_message_size=1 << 20, max_record_size=1 << 21)
    assert isinstance(checked, batches.Checked) == (len(extras) >= batches.BULK_MIN)
    assert steering_record(data, len(extras), checked, now_ms=NOW_MS) == expected(extras)
    assert steering_record(data, len(extras), now_ms=NOW_MS) == expected(extras)


def test_the_delay_property_is_a_delay_level_unless_the_field_gives_one():
    m = delay_from_property(OutgoingMessage(b"x", properties={"DELAY": "3", "a": "b"}), NOW_MS, LEVELS)
    assert m.delay_level == 3 and dict(m.properties) == {"a": "b"}
    m = delay_from_property(OutgoingMessage(b"x", properties={"DELAY": "3"}, delay_level=1), NOW_MS, LEVELS)
    assert m.delay_level == 1 and dict(m.properties) == {}
    plain = OutgoingMessage(b"x", properties={"a": "b"})
    assert delay_from_property(plain, NOW_MS, LEVELS) is plain
    with pytest.raises(InvalidArgumentError, match="DELAY='soon' must be a delay level"):
        delay_from_property(OutgoingMessage(b"x", properties={"DELAY": "soon"}), NOW_MS, LEVELS)


def test_the_deliver_timestamp_property_is_a_delivery_time_unless_a_field_gives_one():
    ahead = str(NOW_MS + 5_000)
    m = delay_from_property(OutgoingMessage(b"x", properties={"DELIVER_TIMESTAMP": ahead, "a": "b"}), NOW_MS, LEVELS)
    assert m.deliver_at_ms == NOW_MS + 5_000 and dict(m.properties) == {"a": "b"}
    m = delay_from_property(OutgoingMessage(b"x", properties={"DELIVER_TIMESTAMP": ahead}, deliver_at_ms=7), NOW_MS, LEVELS)
    assert m.deliver_at_ms == 7
    m = delay_from_property(OutgoingMessage(b"x", properties={"DELIVER_TIMESTAMP": ahead, "DELAY": "2"}), NOW_MS, LEVELS)
    assert (m.delay_level, m.deliver_at_ms) == (2, 0)  # a delay-level message keeps its due time there too
    with pytest.raises(InvalidArgumentError, match="DELIVER_TIMESTAMP='soon' must be a delivery time"):
        delay_from_property(OutgoingMessage(b"x", properties={"DELIVER_TIMESTAMP": "soon"}), NOW_MS, LEVELS)


def test_a_deliver_timestamp_already_past_leaves_the_message_plain():
    """A delivered timed message keeps its DELIVER_TIMESTAMP; copied into a send (forwarded, or several in
    one send_batch) it was turned into a delivery time, and a batch of them refused as delayed messages."""
    copied = OutgoingMessage(b"x", properties={"DELIVER_TIMESTAMP": str(NOW_MS - 1), "a": "b"})
    assert delay_from_property(copied, NOW_MS, LEVELS) is copied
    due_now = OutgoingMessage(b"x", properties={"DELIVER_TIMESTAMP": str(NOW_MS)})
    assert delay_from_property(due_now, NOW_MS, LEVELS) is due_now


def test_delay_values_read_as_rocketmq_reads_them():
    """A level above the broker's last is its last, 0 or below (or blank) no delay: a send refused DELAY=99
    and DELAY=-1, and read DELAY="" as an error while a record batch stored it."""
    levels = [delay_from_property(OutgoingMessage(b"x", properties={"DELAY": v}), NOW_MS, LEVELS).delay_level
              for v in ("3", "99", "0", "00", "-1", "", " ")]
    assert levels == [3, LEVELS, 0, 0, 0, 0, 0]


def test_a_key_given_twice_is_read_by_its_last_value_as_consumers_read_it():
    """The batch check read a repeated key's first value (DELAY=0, then DELAY=3): the batch was stored plain
    and consumers decoded DELAY=3 (and TRAN_MSG=true for false-then-true)."""
    for props, name in ((b"UNIQ_KEY\x01@\x02DELAY\x010\x02DELAY\x013\x02", "DELAY"),
                        (b"UNIQ_KEY\x01@\x02TRAN_MSG\x01false\x02TRAN_MSG\x01true\x02", "TRAN_MSG")):
        for n in (1, 40):  # checked record by record, and in bulk
            b = RecordBatchBuilder("S", "h")
            for i in range(n):
                b.append(b"x", props.replace(b"@", str(i).encode()))
            data = bytes(b.buffer)
            checked = batches.check_batch(data, n, topic="S", max_message_size=1 << 20, max_record_size=1 << 21)
            assert steering_record(data, n, checked, now_ms=NOW_MS) == (0, name), (name, n)
