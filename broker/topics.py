"""TopicConfigManager: the topics a broker serves, persisted in config/topics.json.

Every change hands MetadataFile an undo: when topics.json cannot be written the
caller gets UNAVAILABLE and the table goes back to what the file holds, so a
topic the caller was told was not created does not take sends anyway.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from tidemark.broker.disk.metadata_file import MetadataFile, load_json
from tidemark.broker.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    TopicNotFoundError,
)
from tidemark.common.logs import get_logger
from tidemark.common.protocol import (
    InvalidNameError,
    check_topic_name,
    is_broker_topic,
    is_system_topic,
)

log = get_logger("tidemark.broker.topics")

MAX_QUEUE_NUMS = 1024
PERM_READ = 4
PERM_WRITE = 2


@dataclass(frozen=True, slots=True)
class TopicConfig:
    name: str
    read_queue_nums: int
    write_queue_nums: int
    readable: bool = True
    writable: bool = True

    @property
    def system(self) -> bool:
        return is_system_topic(self.name)

    @property
    def queue_nums(self) -> int:
        """Queues that exist for reading (RocketMQ reads up to readQueueNums)."""
        return max(self.read_queue_nums, self.write_queue_nums)

    @property
    def perm(self) -> int:
        return (PERM_READ if self.readable else 0) | (PERM_WRITE if self.writable else 0)


def check_topic(name: str) -> None:
    """Raise InvalidArgumentError saying what is wrong with a topic name (groups.check_group's twin)."""
    try:
        check_topic_name(name)
    except InvalidNameError as e:
        raise InvalidArgumentError(str(e)) from None


def _name_problem(name: str) -> str:
    """What is wrong with a topic name ("" when nothing)."""
    try:
        check_topic_name(name)
    except InvalidNameError as e:
        return str(e)
    return ""


def _check_queue_nums(label: str, n: int) -> None:
    if not isinstance(n, int) or not 1 <= n <= MAX_QUEUE_NUMS:
        raise InvalidArgumentError(f"{label} must be between 1 and {MAX_QUEUE_NUMS}, got {n}")


class TopicConfigManager:
    def __init__(self, config_dir: Path) -> None:
        self._path = Path(config_dir) / "topics.json"
        self._topics: dict[str, TopicConfig] = {}
        self.file = MetadataFile(self._path, self._document)
        self.version = 0  # counts changes (the name server registration is sent again when it moves)
        self._mirror_skipped: frozenset[str] = frozenset()  # the master's topics with bad names

    def load(self) -> int:
        self._topics = self._parse(load_json(self._path, log) or {})
        return len(self._topics)

    def _parse(self, doc: dict) -> dict[str, TopicConfig]:
        topics = {}
        table = doc.get("topicConfigTable", {})
        for name, raw in table.items():
            try:
                perm = int(raw.get("perm", PERM_READ | PERM_WRITE))
                topics[name] = TopicConfig(
                    name=name,
                    read_queue_nums=int(raw["readQueueNums"]),
                    write_queue_nums=int(raw["writeQueueNums"]),
                    readable=bool(perm & PERM_READ),
                    writable=bool(perm & PERM_WRITE),
                )
            except (KeyError, TypeError, ValueError, AttributeError):
                log.warning("skipping malformed topic entry", event="topic_skip", topic=name)
        return topics

    def document(self) -> dict:
        """topics.json's content (what a replica mirrors)."""
        return self._document()

    def mirror(self, doc: dict) -> bool:
        """A replica's copy of its master's topics (`document()`), replaced whole; True when it changed.
        Topics whose names no RPC accepts are left out: they come from another process."""
        before, after = self._topics, self._parse(doc)
        bad = {name: why for name in after if (why := _name_problem(name))}
        if bad.keys() != self._mirror_skipped:
            self._mirror_skipped = frozenset(bad)  # said once per change, not at every mirror
            for name, why in list(bad.items())[:5]:
                log.warning("mirrored topic skipped: %s", why, event="topic_mirror_skipped", topic=repr(name),
                            total=len(bad))
        after = {name: topic for name, topic in after.items() if name not in bad}
        if after == before:
            return False
        self._topics = after
        self.version += 1

        def undo() -> None:
            if self._topics is after:
                self._topics = before
                self.version += 1

        self.file.changed(undo)
        return True

    def _save(self, name: str, before: TopicConfig | None) -> None:
        after = self._topics.get(name)
        self.version += 1

        def undo() -> None:
            if self._topics.get(name) is after:  # nobody changed it since
                if before is None:
                    self._topics.pop(name, None)
                else:
                    self._topics[name] = before
                self.version += 1

        self.file.changed(undo)

    def _document(self) -> dict:
        return {"topicConfigTable": {
            t.name: {"topicName": t.name, "readQueueNums": t.read_queue_nums,
                     "writeQueueNums": t.write_queue_nums, "perm": t.perm}
            for t in self._topics.values()
        }}

    def get(self, name: str) -> TopicConfig | None:
        return self._topics.get(name)

    def require(self, name: str) -> TopicConfig:
        """The topic's config; InvalidArgumentError for a name no topic can have, TopicNotFoundError for
        one this broker does not have."""
        check_topic(name)
        topic = self._topics.get(name)
        if topic is None:
            raise TopicNotFoundError(f"topic {name!r} does not exist on this broker")
        return topic

    def list(self, *, include_system: bool = False) -> list[TopicConfig]:
        return sorted((t for t in self._topics.values() if include_system or not t.system), key=lambda t: t.name)

    def plan(self, name: str, queue_nums: int, *, system: bool = False) -> TopicConfig:
        """The config `create` would give the topic, checked, without creating it: a request that creates
        a topic on its way (a send) checks everything else against it first, so a refused one leaves no
        topic behind."""
        try:
            check_topic_name(name, allow_system=system)
        except InvalidNameError as e:
            raise InvalidArgumentError(str(e)) from None
        _check_queue_nums("queue_nums", queue_nums)
        if name in self._topics:
            raise AlreadyExistsError(f"topic {name!r} already exists")
        return TopicConfig(name=name, read_queue_nums=queue_nums, write_queue_nums=queue_nums)

    def create(self, name: str, queue_nums: int, *, system: bool = False) -> TopicConfig:
        topic = self.plan(name, queue_nums, system=system)
        self._topics[name] = topic
        self._save(name, None)
        log.info("topic created", event="topic_create", topic=name, queues=queue_nums)
        return topic

    def ensure_system_topic(self, name: str, queue_nums: int) -> TopicConfig:
        """Create a %RETRY%/%DLQ%/schedule topic on first use."""
        topic = self._topics.get(name)
        return topic if topic is not None else self.create(name, queue_nums, system=True)

    def update(self, name: str, *, read_queue_nums: int | None = None, write_queue_nums: int | None = None,
               readable: bool | None = None, writable: bool | None = None) -> TopicConfig:
        topic = self.require(name)
        changes = {}
        if read_queue_nums is not None:
            _check_queue_nums("read_queue_nums", read_queue_nums)
            changes["read_queue_nums"] = read_queue_nums
        if write_queue_nums is not None:
            _check_queue_nums("write_queue_nums", write_queue_nums)
            changes["write_queue_nums"] = write_queue_nums
        if readable is not None:
            changes["readable"] = readable
        if writable is not None:
            changes["writable"] = writable
        before, topic = topic, replace(topic, **changes)
        self._topics[name] = topic
        self._save(name, before)
        log.info("topic updated",
                 event="topic_update", topic=name, read=topic.read_queue_nums, write=topic.write_queue_nums,
                 perm=topic.perm)
        return topic

    def delete(self, name: str) -> TopicConfig:
        topic = self.require(name)
        if is_broker_topic(name):
            raise InvalidArgumentError(f"topic {name!r} is one of the broker's own topics (schedule, transactions) "
                                       f"and cannot be deleted")
        del self._topics[name]
        self._save(name, topic)
        log.info("topic deleted", event="topic_delete", topic=name)
        return topic
