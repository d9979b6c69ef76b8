"""The data dir's format stamp: which on-disk layout a data dir holds, so no broker opens one it cannot read.

`<data-dir>/format.json`, written once, atomically (tidemark.common.fsutil):

    {"format": 1, "written_by": "tidemark 0.1.0"}

`format` is the version of the on-disk layout (commit-log records,
consume-queue entries, the offset, pop and producer journals, the JSON files
in config/); `written_by` is the Tidemark that wrote the stamp, for the
operator reading a refusal. The formats so far:

- 1: the first layout;
- 2: the pop journal's Popped record and the pop state's in-flight rows end
  with the delivery's receive time. A build that reads format 1 only takes
  such a record for damage and cuts the journal there, losing the group's
  later acknowledgements, so it must not open a format-2 dir;
- 3: FIFO pops record message groups: the pop journal's Popped record may
  end with the message group of each delivery and the messages held back
  behind their group, and the pop state's in-flight and pending rows with a
  message group (broker/pop/fifo.py). A format-2 build would cut the journal
  at the first such record, as above.

A build reads every format up to its own and writes its own. A dir stamped
with an older format it reads is stamped again with the current one before
anything is written (`ensure`: UPGRADED), since the broker's next records are
in the current layout.

Why refuse instead of trying: the files are read by byte layout, and a broker
that misreads them does not stop, it repairs. Recovery cuts the commit log at
the first record it cannot validate (commitlog.py), so a build that met a
newer record layout would take the newer records for a torn tail and delete
them. A broker therefore reads the stamp before it touches anything, the
data dir's lock file included, and refuses a dir whose format it does not
read, or whose stamp it cannot parse, with DataFormatError: one line naming
the dir, the format found and the formats it reads, and the dir unchanged, so
the version that wrote it can still open it.

A dir without a stamp is a new one or one written before stamps existed
(format 1 either way): `ensure` stamps it, under the data dir's lock, so two
brokers never stamp the same dir. A stamp that cannot be written (a full
disk) does not stop the broker: the dir stays unstamped, which reads as
format 1, and the next start tries again.

The decisions are pure functions (decode_stamp, refusal); read_stamp, check
and ensure do the file work.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from tidemark.broker.errors import BrokerError
from tidemark.common.fsutil import atomic_write
from tidemark.common.logs import get_logger

log = get_logger("tidemark.broker")

FORMAT_FILE = "format.json"
# The layout this build writes, and every layout it reads.
CURRENT_FORMAT = 3
READABLE_FORMATS: frozenset[int] = frozenset({1, 2, 3})
# What a broker leaves in its data dir (besides the lock, which a start creates before stamping): one of
# them present without a stamp means a dir written before stamps existed, not a new one.
_BROKER_ENTRIES = frozenset({"commitlog", "consumequeue", "config", "checkpoint", "abort"})


class DataFormatError(BrokerError):
    """The data dir holds a format this build does not read, or a stamp it cannot parse; nothing was changed."""


class StampError(ValueError):
    """The bytes of a stamp file are not a stamp (the reason, for DataFormatError's message)."""


@dataclass(frozen=True, slots=True)
class FormatStamp:
    format: int
    written_by: str = ""


class Stamped(enum.Enum):
    """What `ensure` found and did."""

    FOUND = "found"  # stamped already, with a format this build reads: nothing written
    NEW = "new"  # an empty or new dir: stamped
    ADOPTED = "adopted"  # data from before stamps existed: stamped with the current format (it reads format 1)
    UPGRADED = "upgraded"  # stamped with an older format this build reads: stamped again with the current one
    NOT_WRITTEN = "not_written"  # a new dir's stamp could not be written (logged): it reads as format 1


@dataclass(frozen=True, slots=True)
class Stamping:
    outcome: Stamped
    stamp: FormatStamp


def encode_stamp(stamp: FormatStamp) -> bytes:
    return (json.dumps({"format": stamp.format, "written_by": stamp.written_by}, indent=4) + "\n").encode()


def decode_stamp(data: bytes) -> FormatStamp:
    """The stamp in a file's bytes; StampError saying what is wrong with them. Keys other than format and
    written_by are ignored: a later version may add some without changing the format."""
    if not data.strip():
        raise StampError("empty")
    try:
        doc = json.loads(data)
    except json.JSONDecodeError as e:
        raise StampError(f"not valid JSON: {e.msg} at line {e.lineno}") from None
    except UnicodeDecodeError:
        raise StampError("not text") from None
    if not isinstance(doc, dict):
        raise StampError("not a JSON object")
    if "format" not in doc:
        raise StampError('no "format"')
    number = doc["format"]
    if not isinstance(number, int) or isinstance(number, bool) or number < 1:
        raise StampError(f'"format" is {json.dumps(number)}, expected an integer >= 1')
    written_by = doc.get("written_by", "")
    if not isinstance(written_by, str):
        raise StampError(f'"written_by" is {json.dumps(written_by)}, expected a string')
    return FormatStamp(number, written_by)


def readable_text(readable: Collection[int]) -> str:
    """'format 1', 'formats 1 and 2', 'formats 1, 2 and 3'."""
    numbers = [str(n) for n in sorted(readable)]
    if len(numbers) == 1:
        return f"format {numbers[0]}"
    return f"formats {', '.join(numbers[:-1])} and {numbers[-1]}"


def refusal(data_dir: Path, stamp: FormatStamp, *, version: str,
            readable: Collection[int] = READABLE_FORMATS) -> DataFormatError | None:
    """Why a broker of `version` must not open a dir with this stamp; None when it may."""
    if stamp.format in readable:
        return None
    by = stamp.written_by or "an unknown version"
    return DataFormatError(f"data dir {data_dir} holds on-disk format {stamp.format} (stamped by {by}) and "
                           f"tidemark {version} reads {readable_text(readable)} only: start it with a Tidemark "
                           f"that reads format {stamp.format}; nothing was changed")


def unreadable(data_dir: Path, reason: str, *, version: str,
               readable: Collection[int] = READABLE_FORMATS) -> DataFormatError:
    return DataFormatError(f"data dir {data_dir} has an unusable format stamp ({FORMAT_FILE} is {reason}), so "
                           f"its on-disk format is unknown and tidemark {version} reads {readable_text(readable)}: "
                           f"repair or restore {FORMAT_FILE}; nothing was changed")


def holds_broker_data(names: Iterable[str]) -> bool:
    """Whether a dir with these entries was used by a broker (else it is new, or empty)."""
    return not _BROKER_ENTRIES.isdisjoint(names)


# -- files -----------------------------------------------------------------


def read_stamp(data_dir: Path, *, version: str, readable: Collection[int] = READABLE_FORMATS) -> FormatStamp | None:
    """The dir's stamp; None when it has none (or does not exist yet). DataFormatError when the stamp is
    there but cannot be read or parsed. Reads only."""
    data_dir = Path(data_dir)
    try:
        data = (data_dir / FORMAT_FILE).read_bytes()
    except (FileNotFoundError, NotADirectoryError):  # no stamp; a data dir that is a file is the lock's to report
        return None
    except OSError as e:
        raise unreadable(data_dir, f"unreadable: {e.strerror or e}", version=version, readable=readable) from None
    try:
        return decode_stamp(data)
    except StampError as e:
        raise unreadable(data_dir, str(e), version=version, readable=readable) from None


def check(data_dir: Path, *, version: str, readable: Collection[int] = READABLE_FORMATS) -> FormatStamp | None:
    """DataFormatError when this build must not open the dir; else its stamp (None: unstamped). Reads only,
    so it runs before anything else touches the dir."""
    stamp = read_stamp(data_dir, version=version, readable=readable)
    if stamp is not None:
        error = refusal(data_dir, stamp, version=version, readable=readable)
        if error is not None:
            raise error
    return stamp


def ensure(data_dir: Path, *, version: str, readable: Collection[int] = READABLE_FORMATS,
           current: int = CURRENT_FORMAT) -> Stamping:
    """Check the dir (DataFormatError as `check`), then stamp it with `current` when it has no stamp or an
    older one: what the broker writes from now on is in the current layout. Call with the data dir's lock
    held."""
    data_dir = Path(data_dir)
    found = check(data_dir, version=version, readable=readable)
    if found is not None and found.format >= current:
        return Stamping(Stamped.FOUND, found)
    stamp = FormatStamp(current, f"tidemark {version}")
    existing = data_dir.is_dir() and holds_broker_data(p.name for p in data_dir.iterdir())
    try:
        atomic_write(data_dir / FORMAT_FILE, encode_stamp(stamp))
    except OSError as e:
        if found is not None or existing:
            # Data in an older format stays stamped as it is (no stamp reads as format 1): writing records of
            # the current layout under that stamp is what the stamp exists to prevent, so do not start.
            was = found.format if found is not None else 1
            raise DataFormatError(
                f"data dir {data_dir} holds on-disk format {was} and tidemark {version} writes format {current}, "
                f"but cannot stamp it so ({FORMAT_FILE}: {e.strerror or e}); a build that reads format {was} "
                f"only would misread the new records: free space (or fix the dir's permissions) and start "
                f"again; nothing was changed") from None
        # A new dir: nothing in it yet for an older build to misread. It reads as format 1 until the next
        # start writes the stamp.
        log.warning("cannot write the data dir's format stamp %s (%s); it reads as format 1 until the next "
                    "start writes it", data_dir / FORMAT_FILE, e.strerror or e, event="data_format_stamp_failed")
        return Stamping(Stamped.NOT_WRITTEN, FormatStamp(1))
    if found is not None:
        log.info("data dir stamped with on-disk format %d, was %d (written by %s)", current, found.format,
                 found.written_by or "an unknown version", event="data_format_upgraded",
                 file=data_dir / FORMAT_FILE, format=current, previous=found.format)
        return Stamping(Stamped.UPGRADED, stamp)
    if existing:
        log.info("data dir written before format stamps: stamped as on-disk format %d", current,
                 event="data_format_stamped", file=data_dir / FORMAT_FILE, format=current, existing_data=True)
        return Stamping(Stamped.ADOPTED, stamp)
    log.info("new data dir stamped with on-disk format %d", current,
             event="data_format_stamped", file=data_dir / FORMAT_FILE, format=current, existing_data=False)
    return Stamping(Stamped.NEW, stamp)
