"""Request signatures as RocketMQ 5's gRPC clients send them, shared by broker and client.

Every call carries two metadata entries:

    x-mq-date-time: 20261123T190000Z                     (UTC, second precision)
    authorization:  MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time, Signature=<hex>

where the signature is HMAC-SHA1 of the date-time text keyed with the secret
key, so the secret never travels. Official clients differ in details the
parser tolerates: some write the credential as `<access key>//Rocketmq`, some
the hex digest in upper case. The broker checks the signature in constant
time and the date-time against a bounded clock skew, so an old header cannot
be replayed for long. Pure functions: no I/O, no grpc.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import re
import time
from dataclasses import dataclass, field

ALGORITHM = "MQv2-HMAC-SHA1"
AUTHORIZATION_KEY = "authorization"
DATE_TIME_KEY = "x-mq-date-time"
DATE_TIME_FORMAT = "%Y%m%dT%H%M%SZ"
DEFAULT_MAX_SKEW_S = 300.0  # how far a request's x-mq-date-time may be from the broker's clock
_MAX_HEADER = 1024
_HEADER_RE = re.compile(
    r"MQv2-HMAC-SHA1\s+Credential=(?P<credential>[^,\s]+)\s*,\s*SignedHeaders=(?P<signed>[^,\s]+)\s*,"
    r"\s*Signature=(?P<signature>[0-9A-Fa-f]{40})\s*")
_DATE_TIME_RE = re.compile(r"\d{8}T\d{6}Z")


class SignatureError(ValueError):
    """A request's credentials are missing, malformed, stale or wrong; the message says which."""


@dataclass(frozen=True)
class Credentials:
    """An access key and its secret. The secret stays out of repr, logs and query plans."""

    access_key: str
    secret_key: str = field(repr=False)

    def __post_init__(self) -> None:
        if not self.access_key or not self.secret_key:
            raise ValueError("credentials need both an access key and a secret key")


@dataclass(frozen=True)
class SignedRequest:
    """What a request's metadata claims: who, when, and the signature over `date_time`."""

    access_key: str
    date_time: str
    signature: str  # lower-case hex


def format_date_time(now: float) -> str:
    return time.strftime(DATE_TIME_FORMAT, time.gmtime(now))


def sign(secret_key: str, date_time: str) -> str:
    """HMAC-SHA1(secret, date-time) as lower-case hex, as RocketMQ's clients compute it."""
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


def signed_metadata(credentials: Credentials, now: float | None = None) -> tuple[tuple[str, str], ...]:
    """The two metadata entries a call carries."""
    date_time = format_date_time(time.time() if now is None else now)
    signature = sign(credentials.secret_key, date_time)
    return ((DATE_TIME_KEY, date_time),
            (AUTHORIZATION_KEY, f"{ALGORITHM} Credential={credentials.access_key}, "
                                f"SignedHeaders={DATE_TIME_KEY}, Signature={signature}"))


def parse(metadata: dict[str, str]) -> SignedRequest:
    """The signed claim of a request's metadata (keys lower-case), or SignatureError saying what is wrong."""
    header = metadata.get(AUTHORIZATION_KEY)
    if not header:
        raise SignatureError("no credentials: the request carries no authorization header")
    if len(header) > _MAX_HEADER:
        raise SignatureError("authorization header is too long")
    m = _HEADER_RE.fullmatch(header)
    if m is None:
        raise SignatureError(f"authorization header is not '{ALGORITHM} Credential=<access key>, "
                             f"SignedHeaders={DATE_TIME_KEY}, Signature=<hex>'")
    if m["signed"].lower() != DATE_TIME_KEY:
        raise SignatureError(f"SignedHeaders must be {DATE_TIME_KEY}")
    date_time = metadata.get(DATE_TIME_KEY, "")
    if not _DATE_TIME_RE.fullmatch(date_time):
        raise SignatureError(f"{DATE_TIME_KEY} must be a UTC time like 20260101T000000Z")
    access_key = m["credential"].split("//", 1)[0]  # some clients append "//Rocketmq"
    if not access_key:
        raise SignatureError("authorization header names no access key")
    return SignedRequest(access_key, date_time, m["signature"].lower())


def date_time_seconds(date_time: str) -> float:
    try:
        return float(calendar.timegm(time.strptime(date_time, DATE_TIME_FORMAT)))
    except ValueError:
        raise SignatureError(f"{DATE_TIME_KEY} {date_time!r} is not a valid time") from None


def check_time(request: SignedRequest, *, now: float, max_skew_s: float = DEFAULT_MAX_SKEW_S) -> None:
    """SignatureError when the signed time is more than max_skew_s from now (a replay, or a bad clock)."""
    skew = abs(now - date_time_seconds(request.date_time))
    if skew > max_skew_s:
        raise SignatureError(f"{DATE_TIME_KEY} is {skew:.0f} s away from the broker's clock "
                             f"(at most {max_skew_s:.0f} s): replayed, or a clock out of sync")


def matches(request: SignedRequest, secret_key: str) -> bool:
    """Whether the signature is the secret's, compared in constant time."""
    return hmac.compare_digest(sign(secret_key, request.date_time), request.signature)


def verify(request: SignedRequest, secret_key: str, *, now: float, max_skew_s: float = DEFAULT_MAX_SKEW_S) -> None:
    """SignatureError unless the time is within the skew and the signature matches."""
    check_time(request, now=now, max_skew_s=max_skew_s)
    if not matches(request, secret_key):
        raise SignatureError(f"signature does not match for access key {request.access_key!r}")
