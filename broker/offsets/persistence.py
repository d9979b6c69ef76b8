"""consumerOffset.json: encoding, decoding and crash-safe loading.

The file has exactly RocketMQ's shape, so operators can read it with the tools
and habits they already have:

    {
        "offsetTable": {
            "test-topic@test-group": {
                "0": 88526,
                "1": 88528
            }
        }
    }

A broker with the offset journal adds one top-level key after the table,
`"offsetJournalFrom": <n>` (journal.py), and entries an admin reset add
`"resetGenerations"`; RocketMQ's readers ignore keys they do not know, and a
file without them loads as before.

This is what `json.dumps(obj, indent=4, separators=(", ", ": "))` produces,
with no trailing newline. Each line ending in a comma carries one trailing
space after it (not shown above), as RocketMQ's fastjson pretty printer
writes it. Keys are sorted by (topic, group), queue ids numerically, so the
same table always gives the same bytes.

`encode_offset_table` writes that text by hand instead of calling json.dumps:
with `indent` set, json falls back to its pure-Python encoder, which is several
times slower (about 80 ms against 35 ms for 100k entries), and the encoding
runs in a worker thread that still competes with the event loop for the GIL. A test pins the two byte-for-byte.

Pure functions, except `load_offset_file` / `write_offset_file`, which do file
I/O but hold no state.
"""

from __future__ import annotations

import enum
import json
import logging
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tidemark.broker.errors import ConfigFileError
from tidemark.common.fsutil import atomic_write, backup_path
from tidemark.common.logs import EventLogger, get_logger
from tidemark.common.protocol import InvalidNameError, check_group_name, check_topic_name

OFFSET_FILE_NAME = "consumerOffset.json"
TOPIC_GROUP_SEPARATOR = "@"
OFFSET_TABLE_KEY = "offsetTable"
# Extra top-level key (allowed by the file contract): reset generations of entries an admin reset,
# so a reset still wins over a stale consumer's commit after a broker restart. Absent when empty.
RESET_GENERATIONS_KEY = "resetGenerations"
# Extra top-level key written by a broker with the offset journal: the first journal segment this
# snapshot does not contain; loading replays only segments from it on (journal.py says why). Absent
# (an older file, or no journal): every segment is replayed.
JOURNAL_FROM_KEY = "offsetJournalFrom"
# Offsets are Java longs in RocketMQ; a bigger number in the file is damage.
MAX_OFFSET = 2**63 - 1
# A damaged file can hold thousands of bad entries; the log gets this many,
# LoadReport.skipped gets them all.
_MAX_SKIP_LOG_LINES = 20

TableKey = tuple[str, str]  # (topic, group)
OffsetTable = dict[TableKey, dict[int, int]]


class LoadSource(enum.Enum):
    """Where load() took the offsets from."""

    MAIN = "json"
    BACKUP = "bak"
    NONE = "none"  # neither file exists: a new broker
    FORCED_EMPTY = "forced-empty"  # files damaged, started empty because the operator allowed it


@dataclass(frozen=True)
class LoadReport:
    source: LoadSource
    path: Path | None
    entries: int
    skipped: list[str] = field(default_factory=list)  # one human-readable reason per skipped entry
    # Reset generations stored beside the table (entries that were ever reset).
    reset_generations: dict = field(default_factory=dict)
    journal_from: int = 0  # the first offset-journal segment the file does not contain


class OffsetFileError(ValueError):
    """The file as a whole cannot be used (empty, torn, not JSON, wrong shape)."""


@dataclass(frozen=True, slots=True)
class DecodeResult:
    table: OffsetTable
    skipped: list[str]
    reset_generations: OffsetTable = field(default_factory=dict)
    journal_from: int = 0


def table_key(topic: str, group: str) -> str:
    return f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"


def invalid_names(keys: Iterable[TableKey]) -> dict[TableKey, str]:
    """The entries whose topic or group name no RPC accepts (tidemark.common.protocol's rules), with why.

    The file format only needs one '@' per key; a table from another process (a replica handing its
    commits back, a master mirrored by its replica) must also keep out names such as 'g\\n' or 'f:G', which
    would make groups no other RPC can inspect or delete."""
    bad = {}
    for topic, group in keys:
        try:
            check_topic_name(topic)
            check_group_name(group)
        except InvalidNameError as e:
            bad[(topic, group)] = str(e)
    return bad


# -- encode / decode -------------------------------------------------------


def encode_offset_table(table: Mapping[TableKey, Mapping[int, int]],
                        reset_generations: Mapping[TableKey, Mapping[int, int]] | None = None,
                        journal_from: int | None = None) -> bytes:
    """Encode a table as consumerOffset.json bytes (RocketMQ's layout, no trailing newline).

    Reset generations, when there are any, follow as the extra key "resetGenerations" in the
    same shape, then `journal_from` as "offsetJournalFrom"; a table without either encodes exactly
    as RocketMQ writes it.
    """
    sections = [f'    "{OFFSET_TABLE_KEY}": {_encode_section(table)}']
    if reset_generations:
        sections.append(f'    "{RESET_GENERATIONS_KEY}": {_encode_section(reset_generations)}')
    if journal_from is not None:
        sections.append(f'    "{JOURNAL_FROM_KEY}": {int(journal_from)}')
    return ("{\n" + ", \n".join(sections) + "\n}").encode("ascii")


def _encode_section(table: Mapping[TableKey, Mapping[int, int]]) -> str:
    if not table:
        return "{}"
    dumps = json.dumps  # the C string escaper; keys must be escaped exactly as json.dumps would
    parts = []
    for topic, group in sorted(table):
        queues = table[(topic, group)]
        key = dumps(table_key(topic, group))
        if queues:
            body = ", \n".join(f'            "{q}": {queues[q]}' for q in sorted(queues))
            parts.append(f"        {key}: {{\n{body}\n        }}")
        else:
            parts.append(f"        {key}: {{}}")
    return "{\n" + ", \n".join(parts) + "\n    }"


def decode_offset_table(data: bytes | str) -> DecodeResult:
    """Decode consumerOffset.json content.

    Raises OffsetFileError when the content as a whole is unusable: empty,
    truncated or otherwise invalid JSON, or not an object with an "offsetTable"
    object (a torn write must never pass as a valid, smaller table). Single bad
    entries are skipped and described in `skipped`. Extra top-level keys, such
    as RocketMQ's dataVersion, are ignored.
    """
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise OffsetFileError(f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    else:
        text = data
    if not text.strip():
        raise OffsetFileError("the file is empty")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise OffsetFileError(f"not valid JSON, truncated or corrupt ({e})") from None
    if not isinstance(doc, dict):
        raise OffsetFileError(f"top level is a JSON {type(doc).__name__}, expected an object")
    if OFFSET_TABLE_KEY not in doc:
        raise OffsetFileError(f'no "{OFFSET_TABLE_KEY}" key at top level')
    raw = doc[OFFSET_TABLE_KEY]
    if not isinstance(raw, dict):
        raise OffsetFileError(
            f'"{OFFSET_TABLE_KEY}" is a JSON {type(raw).__name__}, expected an object'
        )

    table: OffsetTable = {}
    skipped: list[str] = []
    for raw_key, raw_queues in raw.items():
        parts = raw_key.split(TOPIC_GROUP_SEPARATOR)
        if len(parts) != 2 or not parts[0] or not parts[1]:
            skipped.append(f"key {raw_key!r}: not '<topic>@<group>'")
            continue
        if not isinstance(raw_queues, dict):
            skipped.append(
                f"key {raw_key!r}: value is {_json_type(raw_queues)}, expected an object of queue offsets"
            )
            continue
        queues: dict[int, int] = {}
        for raw_qid, raw_offset in raw_queues.items():
            where = f"key {raw_key!r} queue {raw_qid!r}"
            if not (raw_qid.isascii() and raw_qid.isdigit()):
                skipped.append(f"{where}: queue id is not a non-negative integer")
                continue
            if not isinstance(raw_offset, int) or isinstance(raw_offset, bool):
                skipped.append(f"{where}: offset {raw_offset!r} is not an integer")
                continue
            if raw_offset < 0:
                skipped.append(f"{where}: offset {raw_offset} is negative")
                continue
            if raw_offset > MAX_OFFSET:
                skipped.append(f"{where}: offset {raw_offset} exceeds the 64-bit range")
                continue
            queues[int(raw_qid)] = raw_offset
        if queues:
            table[(parts[0], parts[1])] = queues
    return DecodeResult(table, skipped, _decode_generations(doc.get(RESET_GENERATIONS_KEY), table, skipped),
                        _decode_journal_from(doc.get(JOURNAL_FROM_KEY), skipped))


def _decode_journal_from(raw: object, skipped: list[str]) -> int:
    """The journal mark; 0 (replay every segment, as for a file without it) when absent or malformed."""
    if raw is None:
        return 0
    if not isinstance(raw, int) or isinstance(raw, bool) or not 0 <= raw <= MAX_OFFSET:
        skipped.append(f'"{JOURNAL_FROM_KEY}" {raw!r} is not a segment number; every journal segment is replayed')
        return 0
    return raw


def _decode_generations(raw: object, table: OffsetTable, skipped: list[str]) -> OffsetTable:
    """Reset generations of entries present in the table; anything malformed is skipped (a lost
    generation only weakens reset-wins for that entry)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        skipped.append(f'"{RESET_GENERATIONS_KEY}" is {_json_type(raw)}, expected an object')
        return {}
    out: OffsetTable = {}
    for raw_key, raw_queues in raw.items():
        key = tuple(raw_key.split(TOPIC_GROUP_SEPARATOR))
        if key not in table or not isinstance(raw_queues, dict):
            continue
        for raw_qid, gen in raw_queues.items():
            if raw_qid.isascii() and raw_qid.isdigit() and isinstance(gen, int) and not isinstance(gen, bool) and 0 < gen <= MAX_OFFSET:
                out.setdefault(key, {})[int(raw_qid)] = gen  # type: ignore[index]
    return out


def _json_type(value: object) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), f"a {type(value).__name__}"
    )


def count_entries(table: Mapping[TableKey, Mapping[int, int]]) -> int:
    return sum(len(q) for q in table.values())


# -- files -----------------------------------------------------------------


def write_offset_file(path: Path, data: bytes) -> None:
    """Replace the file atomically, keeping the previous one as `<name>.bak`."""
    atomic_write(path, data, keep_backup=True)


def _read(path: Path) -> DecodeResult | None:
    """Decode one file; None when it does not exist. Raises OffsetFileError."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise OffsetFileError(f"cannot be read ({e.strerror or e})") from None
    return decode_offset_table(data)


def load_offset_file(
    path: Path, *, allow_empty_on_corruption: bool, logger: logging.Logger | EventLogger
) -> tuple[OffsetTable, LoadReport]:
    """Load the table from `path`, falling back to its `.bak`.

    - main good: use it.
    - main missing, empty, torn, not JSON or wrong shape: use a good .bak and
      say so (WARNING). Both missing: empty table (a new broker).
    - no usable file but something damaged is present: raise ConfigFileError,
      because starting empty would silently rewind every consumer group; unless
      `allow_empty_on_corruption`, then start empty with an ERROR log.
    A damaged main file is kept as `<name>.corrupt` (moved when the .bak was
    used, copied when starting empty), because persisting rotates the main file
    into .bak and would soon delete the evidence.
    """
    logger = get_logger(logger)
    bak = backup_path(path)
    remove_leftover_temp_files(path, logger)
    main_problem: str | None = None
    try:
        result = _read(path)
    except OffsetFileError as e:
        result, main_problem = None, str(e)
    if result is not None:
        _log_skipped(logger, path, result.skipped)
        return result.table, LoadReport(
            LoadSource.MAIN, path, count_entries(result.table), result.skipped, result.reset_generations,
            result.journal_from,
        )

    main_state = "is missing" if main_problem is None else f"is unusable: {main_problem}"
    bak_problem: str | None = None
    try:
        bak_result = _read(bak)
    except OffsetFileError as e:
        bak_result, bak_problem = None, str(e)
    if bak_result is not None:
        # Move the damaged main file aside: otherwise the next persist would
        # rotate it into .bak over the good backup we just loaded.
        kept = _set_aside(path, logger, move=True) if main_problem is not None else None
        logger.warning("%s %s; loaded consumer offsets from the backup %s instead%s", path, main_state, bak, f" (damaged file moved to {kept})" if kept else "", event="offsets_load", source="bak")
        _log_skipped(logger, bak, bak_result.skipped)
        table = bak_result.table
        return table, LoadReport(LoadSource.BACKUP, bak, count_entries(table), bak_result.skipped,
                                 bak_result.reset_generations, bak_result.journal_from)

    if main_problem is None and bak_problem is None:
        logger.info("no %s or %s yet; starting with no consumer offsets", path, bak.name,
                    event="offsets_load", source="none")
        return {}, LoadReport(LoadSource.NONE, None, 0, [])

    bak_state = "is missing" if bak_problem is None else f"is unusable too: {bak_problem}"
    reason = f"consumer offset file {path} {main_state}, and the backup {bak} {bak_state}"
    if not allow_empty_on_corruption:
        raise ConfigFileError(
            f"{reason}. Refusing to start with no offsets, which would rewind every consumer group; "
            f"repair or remove the files, or start once with --force-empty-offsets to accept an empty table"
        )
    # Copied, not moved: with the main file gone, the next start would find
    # "no files" and no longer refuse, and the operator allowed empty once only.
    kept = _set_aside(path, logger, move=False) if main_problem is not None else None
    logger.error("%s; starting with NO consumer offsets because empty-on-corruption is allowed%s", reason, f" (damaged file kept as {kept})" if kept else "", event="offsets_load", source="forced-empty")
    return {}, LoadReport(LoadSource.FORCED_EMPTY, None, 0, [])


def temp_paths(path: Path) -> list[Path]:
    """The temp files atomic_write uses beside `path` and its backup."""
    return [path.with_name(f".{path.name}.tmp"), path.with_name(f".{backup_path(path).name}.tmp")]


def remove_leftover_temp_files(path: Path, logger: logging.Logger | EventLogger) -> list[Path]:
    """Delete temp files a crash inside a write left behind; return the ones removed.

    A temp file is renamed into place only once it is complete and fsynced, so one still present
    was never the file: the main file or its .bak holds the last good table. Left alone, a stale
    temp file would only confuse an operator looking at the directory.
    """
    logger = get_logger(logger)
    removed = []
    for tmp in temp_paths(path):
        try:
            tmp.unlink()
        except FileNotFoundError:
            continue
        except OSError as e:
            logger.warning("cannot remove leftover %s: %s", tmp, e, event="offsets_tmp_left")
            continue
        removed.append(tmp)
        logger.info("removed %s left by a write interrupted by a crash", tmp, event="offsets_tmp_removed")
    return removed


def _set_aside(path: Path, logger: EventLogger, *, move: bool) -> Path | None:
    """Keep a damaged file as `<name>.corrupt` for the operator to inspect."""
    target = path.with_name(path.name + ".corrupt")
    try:
        if move:
            path.replace(target)
        else:
            shutil.copyfile(path, target)
    except OSError as e:
        logger.warning("could not keep damaged %s as %s: %s", path, target, e)
        return None
    return target


def _log_skipped(logger: EventLogger, path: Path, skipped: list[str]) -> None:
    for reason in skipped[:_MAX_SKIP_LOG_LINES]:
        logger.warning("%s: skipped malformed offset entry, %s", path, reason, event="offsets_entry_skipped")
    if len(skipped) > _MAX_SKIP_LOG_LINES:
        logger.warning(
            "%s: %d more malformed offset entries skipped", path, len(skipped) - _MAX_SKIP_LOG_LINES
        )
