"""Receipt handles: what a pop consumer holds to ack or re-hide one delivery.

A handle names one delivery of one message: (group, topic, queue id, offset,
pop id, attempt). The broker keeps no table of handles; it signs them, so a
handle is checked in two steps by two owners:

- here, the *form*: `v1.<payload>.<mac>`, both parts base64url without
  padding, the MAC being HMAC-SHA256(secret, payload) cut to 16 bytes and
  compared in constant time. Bad syntax or a bad MAC means the text was never
  issued by this broker (or its secret changed): the handle is **forged**.
- in the ledger (ledger.py), the *freshness*: a well-formed handle whose pop
  id is no longer the current one of its in-flight entry (acked, revived,
  re-hidden by ChangeInvisibleDuration, redelivered, reset) is **stale**.

Both errors derive from InvalidReceiptHandleError, which the adapter maps to
INVALID_RECEIPT_HANDLE; the message says which of the two it was.

The payload is small and binary (a varint per number, length-prefixed UTF-8
names) because clients echo the handle on every ack: a typical handle is under
80 characters. The MAC is computed over the payload bytes only; the "v1."
prefix selects how those bytes are read, and a later format gets a new prefix.

The secret is 32 random bytes in a file (`config/popSecret`, mode 0600),
created once and read at every start, so handles survive a restart. Losing it
only makes the handles in flight forged: their messages are redelivered.
`load_or_create_secret` is the only file I/O here.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from tidemark.broker.errors import ConfigFileError, InvalidReceiptHandleError
from tidemark.common.fsutil import fsync_dir

__all__ = [
    "HandleFields",
    "QueueKey",
    "ReceiptHandleCodec",
    "InvalidReceiptHandleError",
    "ForgedReceiptHandleError",
    "StaleReceiptHandleError",
    "SECRET_SIZE",
    "load_or_create_secret",
]

VERSION = "v1"
SECRET_SIZE = 32
MAC_SIZE = 16  # 128 bits: forging one handle takes 2**128 tries, far beyond any rate limit
# Group and topic names are at most a few hundred bytes; anything longer is not a handle of ours,
# and refusing it before base64 keeps a hostile 10 MB "handle" from costing more than a length check.
MAX_HANDLE_CHARS = 1024
_B64URL = re.compile(r"[A-Za-z0-9_-]*")
_MAX_VARINT_BYTES = 10  # 64-bit numbers


class QueueKey(NamedTuple):
    """One queue as a pop consumer group sees it."""

    group: str
    topic: str
    queue_id: int


@dataclass(frozen=True, slots=True)
class HandleFields:
    """The content of one receipt handle: one delivery of the message at `offset`."""

    group: str
    topic: str
    queue_id: int
    offset: int
    pop_id: int
    attempt: int

    @property
    def key(self) -> QueueKey:
        return QueueKey(self.group, self.topic, self.queue_id)


class ForgedReceiptHandleError(InvalidReceiptHandleError):
    """The text was not issued by this broker: bad syntax or a signature that does not match."""

    def __init__(self, why: str) -> None:
        super().__init__(f"receipt handle is forged or corrupt: {why}")


class StaleReceiptHandleError(InvalidReceiptHandleError):
    """A genuine handle of a delivery that is over (acked, redelivered, re-hidden or reset)."""

    def __init__(self, key: QueueKey, offset: int, why: str) -> None:
        super().__init__(f"receipt handle is stale: {why} (topic {key.topic!r}, group {key.group!r}, "
                         f"queue {key.queue_id}, offset {offset})")
        self.key = key
        self.offset = offset


class ReceiptHandleCodec:
    """Signs and checks receipt handles with one broker secret."""

    __slots__ = ("_secret",)

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError(f"the receipt handle secret must have at least 16 bytes, got {len(secret)}")
        self._secret = bytes(secret)

    def encode(self, h: HandleFields) -> str:
        payload = _pack(h)
        return f"{VERSION}.{_b64(payload)}.{_b64(self._mac(payload))}"

    def decode(self, text: str) -> HandleFields:
        """The fields of a handle this broker issued; ForgedReceiptHandleError for anything else.

        The MAC is checked before the payload is parsed: bytes nobody signed are never interpreted.
        """
        if not isinstance(text, str) or len(text) > MAX_HANDLE_CHARS:
            raise ForgedReceiptHandleError("not a receipt handle of this broker (too long)")
        parts = text.split(".")
        if len(parts) != 3 or parts[0] != VERSION:
            raise ForgedReceiptHandleError(f"not of the form {VERSION}.<payload>.<signature>")
        payload, mac = _unb64(parts[1]), _unb64(parts[2])
        if payload is None or mac is None or not payload:
            raise ForgedReceiptHandleError("not base64url")
        if not hmac.compare_digest(mac, self._mac(payload)):
            raise ForgedReceiptHandleError("bad signature")
        try:
            return _unpack(payload)
        except ValueError as e:
            # Signed by our secret yet unreadable: a broker bug, but to the client the handle is just unusable.
            raise ForgedReceiptHandleError(f"malformed payload ({e})") from None

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self._secret, payload, hashlib.sha256).digest()[:MAC_SIZE]


# -- payload: varint(len) group | varint(len) topic | varint queue id, offset, pop id, attempt --


def _pack(h: HandleFields) -> bytes:
    for name in ("queue_id", "offset", "pop_id", "attempt"):
        value = getattr(h, name)
        if not 0 <= value < 2**64:
            raise ValueError(f"handle {name} {value} is outside 0..2**64-1")
    group, topic = h.group.encode("utf-8"), h.topic.encode("utf-8")
    out = bytearray()
    _varint(out, len(group))
    out += group
    _varint(out, len(topic))
    out += topic
    for value in (h.queue_id, h.offset, h.pop_id, h.attempt):
        _varint(out, value)
    return bytes(out)


def _unpack(payload: bytes) -> HandleFields:
    pos = 0
    names = []
    for _ in range(2):
        length, pos = _read_varint(payload, pos)
        if pos + length > len(payload):
            raise ValueError("name runs past the end")
        names.append(payload[pos:pos + length].decode("utf-8"))
        pos += length
    numbers = []
    for _ in range(4):
        value, pos = _read_varint(payload, pos)
        numbers.append(value)
    if pos != len(payload):
        raise ValueError(f"{len(payload) - pos} bytes after the last field")
    return HandleFields(names[0], names[1], *numbers)


def _varint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    for i in range(_MAX_VARINT_BYTES):
        if pos + i >= len(data):
            raise ValueError("truncated number")
        byte = data[pos + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos + i + 1
        shift += 7
    raise ValueError("number longer than 64 bits")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes | None:
    if not _B64URL.fullmatch(text) or len(text) % 4 == 1:
        return None
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None


# -- the secret file ------------------------------------------------------------------------


def load_or_create_secret(path: Path) -> bytes:
    """The 32-byte secret in `path`, created (mode 0600) on first use.

    Creation is atomic and first-wins: the bytes go to a private temp file, are fsynced, and are
    linked to `path`, which fails if another process got there first (then its secret is used).
    A present file of the wrong size is refused (ConfigFileError) rather than replaced: replacing
    it would quietly turn every handle in flight into a forged one, and a truncated secret file
    says something else is wrong with the disk.
    """
    path = Path(path)
    try:
        return _read_secret(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)  # whatever the umask says
            os.write(fd, secrets.token_bytes(SECRET_SIZE))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process created it meanwhile: use theirs
        else:
            fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)
    return _read_secret(path)


def _read_secret(path: Path) -> bytes:
    data = path.read_bytes()
    if len(data) != SECRET_SIZE:
        raise ConfigFileError(
            f"{path} holds {len(data)} bytes, expected a {SECRET_SIZE}-byte receipt handle secret; "
            f"remove it to create a new one (receipt handles in flight then stop working)")
    return data
