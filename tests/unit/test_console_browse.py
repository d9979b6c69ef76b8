"""Which copy of a message each one is, and the bodies a page shows: the console's message rules without a
broker."""

from __future__ import annotations

from tidemark.client.console.browse import copy_kinds, message
from tidemark.client.message import MessageExt


def _m(topic: str, msg_id: str = "A" * 32, body: bytes = b"x") -> MessageExt:
    return MessageExt(topic, "broker-a", 0, 0, msg_id, body)


def test_each_copy_of_a_message_is_named_for_what_it_is():
    story = [_m("Orders"), _m("%RETRY%billing"), _m("%DLQ%billing"), _m("Orders"), _m("Orders", "B" * 32)]
    assert copy_kinds(story) == ["original", "retry copy", "dead-letter copy", "requeued copy", "original"]


def test_a_body_is_text_when_it_decodes_and_base64_when_not():
    assert message(_m("T", body="héllo".encode()))["body"] == "héllo"
    cut = message(_m("T", body="é".encode() * 3), preview_bytes=5)  # the cut splits the third character
    assert (cut["body"], cut["body_encoding"], cut["body_cut"]) == ("éé", "text", 1)
    binary = message(_m("T", body=b"\xff\x00"))
    assert (binary["body"], binary["body_encoding"]) == ("/wA=", "base64")
