"""Receipt handles: the signed format, forged text of every kind, the secret file."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import stat

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tidemark.broker.pop.handles as handles_module
from tidemark.broker.errors import ConfigFileError, InvalidArgumentError
from tidemark.broker.pop.handles import (
    MAX_HANDLE_CHARS,
    SECRET_SIZE,
    ForgedReceiptHandleError,
    HandleFields,
    InvalidReceiptHandleError,
    QueueKey,
    ReceiptHandleCodec,
    StaleReceiptHandleError,
    load_or_create_secret,
)

SECRET = bytes(range(32))
codec = ReceiptHandleCodec(SECRET)
names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)
u64 = st.integers(0, 2**64 - 1)
fields = st.builds(HandleFields, group=names, topic=names, queue_id=st.integers(0, 2**31 - 1), offset=u64,
                   pop_id=u64, attempt=st.integers(1, 2**32))


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


# -- the format -----------------------------------------------------------------------------------


@given(fields)
def test_a_handle_decodes_to_what_was_encoded(h):
    assert codec.decode(codec.encode(h)) == h


@given(fields)
def test_the_format_is_v1_payload_and_a_16_byte_hmac_sha256_of_the_payload(h):
    version, payload, mac = codec.encode(h).split(".")
    assert version == "v1"
    assert "=" not in payload + mac
    assert unb64(mac) == hmac.new(SECRET, unb64(payload), hashlib.sha256).digest()[:16]


def test_a_typical_handle_is_short():
    text = codec.encode(HandleFields("GroupA", "TopicA", 3, 1_234_567, 1_760_000_000_000_000, 1))
    assert len(text) < 80, text


def test_numbers_outside_64_bits_cannot_be_encoded():
    with pytest.raises(ValueError, match="offset"):
        codec.encode(HandleFields("g", "t", 0, -1, 1, 1))
    with pytest.raises(ValueError, match="pop_id"):
        codec.encode(HandleFields("g", "t", 0, 1, 2**64, 1))


def test_a_short_secret_is_refused():
    with pytest.raises(ValueError, match="16 bytes"):
        ReceiptHandleCodec(b"short")


def test_the_key_of_a_handle_names_its_queue():
    assert HandleFields("g", "t", 2, 9, 1, 1).key == QueueKey("g", "t", 2)


# -- forged ---------------------------------------------------------------------------------------


@given(fields, st.data())
def test_any_changed_character_is_forged_or_changes_nothing(h, data):
    text = codec.encode(h)
    at = data.draw(st.integers(0, len(text) - 1))
    replacement = data.draw(st.sampled_from("AQgw_-.9zZv1=+/ é"))
    tampered = text[:at] + replacement + text[at + 1:]
    try:
        decoded = codec.decode(tampered)
    except ForgedReceiptHandleError as e:
        assert "forged" in str(e)
    else:
        # Only a last base64 character whose spare bits changed decodes to the very same bytes.
        assert decoded == h


@given(st.text(max_size=200))
def test_garbage_is_forged_never_another_error(text):
    with pytest.raises(ForgedReceiptHandleError, match="forged"):
        codec.decode(text)


@given(fields)
def test_a_handle_of_another_secret_is_forged(h):
    other = ReceiptHandleCodec(bytes(32))
    with pytest.raises(ForgedReceiptHandleError, match="bad signature"):
        codec.decode(other.encode(h))


@given(fields, fields)
def test_a_payload_under_another_handles_signature_is_forged(a, b):
    va, pa, _ = codec.encode(a).split(".")
    _, pb, mb = codec.encode(b).split(".")
    if pa != pb:
        with pytest.raises(ForgedReceiptHandleError):
            codec.decode(f"{va}.{pa}.{mb}")


@pytest.mark.parametrize("text", ["", "v1", "v1..", "v2.AAAA.AAAA", "v1.AAAA.AAAA.AAAA", "v1.A.AAAA",
                                  "v1.AA==.AAAA", "v1.A+/A.AAAA", None, b"v1.AAAA.AAAA"])
def test_malformed_text_is_forged(text):
    with pytest.raises(ForgedReceiptHandleError):
        codec.decode(text)


def test_a_huge_handle_is_refused_before_any_decoding(monkeypatch):
    monkeypatch.setattr(handles_module, "_unb64", lambda text: pytest.fail("decoded a huge handle"))
    with pytest.raises(ForgedReceiptHandleError, match="too long"):
        codec.decode("v1." + "A" * MAX_HANDLE_CHARS + ".AAAA")


def test_signed_but_unreadable_payload_is_forged_not_a_crash():
    for payload in (b"\x05ab", b"\x01g\x01t" + b"\x80" * 11, b"\x01g\x01t\x00\x00\x00\x01trailing", b"\x01\xff"):
        text = f"v1.{handles_module._b64(payload)}.{handles_module._b64(codec._mac(payload))}"
        with pytest.raises(ForgedReceiptHandleError, match="malformed payload"):
            codec.decode(text)


def test_the_signature_is_compared_in_constant_time(monkeypatch):
    calls = []
    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    codec.decode(codec.encode(HandleFields("g", "t", 0, 1, 2, 1)))
    assert len(calls) == 1


def test_forged_and_stale_are_both_invalid_receipt_handles_and_say_which():
    forged = ForgedReceiptHandleError("bad signature")
    stale = StaleReceiptHandleError(QueueKey("g", "t", 1), 5, "already acked")
    for e in (forged, stale):
        assert isinstance(e, InvalidReceiptHandleError) and isinstance(e, InvalidArgumentError)
    assert "forged" in str(forged) and "stale" not in str(forged)
    assert "stale" in str(stale) and "forged" not in str(stale) and "offset 5" in str(stale)


# -- the secret file --------------------------------------------------------------------------------


def test_the_secret_is_created_once_private_and_kept(tmp_path):
    path = tmp_path / "config" / "popSecret"
    old_umask = os.umask(0)
    try:
        first = load_or_create_secret(path)
    finally:
        os.umask(old_umask)
    assert len(first) == SECRET_SIZE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_secret(path) == first
    assert sorted(p.name for p in path.parent.iterdir()) == ["popSecret"]  # no temp file left


def test_two_brokers_creating_the_secret_at_once_share_the_first(tmp_path, monkeypatch):
    path = tmp_path / "popSecret"
    theirs = os.urandom(SECRET_SIZE)
    real_link = os.link

    def racing_link(src, dst):
        path.write_bytes(theirs)  # the other process linked its file first
        return real_link(src, dst)

    monkeypatch.setattr(os, "link", racing_link)
    assert load_or_create_secret(path) == theirs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["popSecret"]


def test_a_secret_file_of_the_wrong_size_is_refused_not_replaced(tmp_path):
    path = tmp_path / "popSecret"
    path.write_bytes(b"x" * 31)
    with pytest.raises(ConfigFileError, match="31 bytes"):
        load_or_create_secret(path)
    assert path.read_bytes() == b"x" * 31
