"""RocketMQ 5 request signatures (common/auth.py): what official clients send is accepted, nothing else is."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.common import auth

NOW = 1_795_000_000.0  # 2026-11-18
SECRET = "s3cret-key"


def test_a_signed_request_verifies_and_the_secret_never_travels():
    creds = auth.Credentials("alice", SECRET)
    metadata = dict(auth.signed_metadata(creds, now=NOW))
    assert SECRET not in repr(creds) and all(SECRET not in v for v in metadata.values())
    claim = auth.parse(metadata)
    assert claim.access_key == "alice"
    auth.verify(claim, SECRET, now=NOW + 10)


@pytest.mark.parametrize("credential", ["alice", "alice//Rocketmq"])
@pytest.mark.parametrize("upper", [False, True])
def test_what_the_official_clients_send_is_accepted(credential, upper):
    """Java/Python write `Credential=<ak>`, Go/C++/C# `<ak>//Rocketmq`; some write upper-case hex."""
    date_time = auth.format_date_time(NOW)
    signature = auth.sign(SECRET, date_time)
    header = (f"MQv2-HMAC-SHA1 Credential={credential}, SignedHeaders=x-mq-date-time, "
              f"Signature={signature.upper() if upper else signature}")
    claim = auth.parse({"authorization": header, "x-mq-date-time": date_time})
    assert claim.access_key == "alice"
    auth.verify(claim, SECRET, now=NOW)


def test_the_signature_is_hmac_sha1_of_the_date_time_in_lower_case_hex():
    import hashlib
    import hmac
    assert auth.sign("k", "20231227T194619Z") == hmac.new(b"k", b"20231227T194619Z", hashlib.sha1).hexdigest()


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda m: m.pop("authorization"), "no credentials"),
    (lambda m: m.update({"authorization": "Basic YWxpY2U6eA=="}), "is not 'MQv2-HMAC-SHA1"),
    (lambda m: m.pop("x-mq-date-time"), "must be a UTC time"),
    (lambda m: m.update({"authorization": m["authorization"].replace("x-mq-date-time", "host")}),
     "SignedHeaders must be"),
])
def test_malformed_credentials_say_what_is_wrong(mutate, message):
    metadata = dict(auth.signed_metadata(auth.Credentials("alice", SECRET), now=NOW))
    mutate(metadata)
    with pytest.raises(auth.SignatureError, match=message):
        auth.parse(metadata)


def test_a_wrong_secret_and_a_replayed_header_are_refused():
    claim = auth.parse(dict(auth.signed_metadata(auth.Credentials("alice", SECRET), now=NOW)))
    with pytest.raises(auth.SignatureError, match="signature does not match"):
        auth.verify(claim, "another-secret", now=NOW)
    with pytest.raises(auth.SignatureError, match="away from the broker's clock"):
        auth.verify(claim, SECRET, now=NOW + 3600)


@settings(max_examples=400)
@given(header=st.text(max_size=200) | st.builds(
    lambda ak, sig, sh: f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders={sh}, Signature={sig}",
    st.text(min_size=1, max_size=20), st.text(alphabet="0123456789abcdefABCDEF", min_size=38, max_size=42),
    st.sampled_from(["x-mq-date-time", "X-MQ-DATE-TIME", "host", ""])),
    date_time=st.text(max_size=20) | st.just(auth.format_date_time(NOW)))
def test_generated_headers_never_crash_and_are_never_accepted(header, date_time):
    try:
        claim = auth.parse({"authorization": header, "x-mq-date-time": date_time})
    except auth.SignatureError:
        return
    with pytest.raises(auth.SignatureError):
        auth.verify(claim, SECRET, now=NOW)
