"""SubscriptionGroupManager: per-group settings, persisted in config/subscriptionGroup.json.

As in RocketMQ, a group's config is created on first use (heartbeat, commit)
with the broker's defaults; admins may change retry settings afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from tidemark.broker.disk.metadata_file import MetadataFile, load_json
from tidemark.broker.errors import InvalidArgumentError, NotFoundError
from tidemark.common.logs import get_logger
from tidemark.common.protocol import InvalidNameError, check_group_name

log = get_logger("tidemark.broker.membership.groups")


@dataclass(frozen=True, slots=True)
class GroupConfig:
    group: str
    consume_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    consume_orderly: bool = False


def check_group(group: str) -> None:
    """Raise InvalidArgumentError saying what is wrong with a group name."""
    try:
        check_group_name(group)
    except InvalidNameError as e:
        raise InvalidArgumentError(str(e)) from None


def _name_problem(group: str) -> str:
    """What is wrong with a group name ("" when nothing)."""
    try:
        check_group_name(group)
    except InvalidNameError as e:
        return str(e)
    return ""


class SubscriptionGroupManager:
    def __init__(self, config_dir: Path, *, retry_queue_nums: int = 1, retry_max_times: int = 16) -> None:
        self._path = Path(config_dir) / "subscriptionGroup.json"
        self.file = MetadataFile(self._path, self._document)
        self._defaults = GroupConfig(group="", retry_queue_nums=retry_queue_nums, retry_max_times=retry_max_times)
        self._groups: dict[str, GroupConfig] = {}
        self._mirror_skipped: frozenset[str] = frozenset()  # the master's groups with bad names
        self.version = 0  # counts changes (a master sends the groups to its replicas when it moves)

    def load(self) -> int:
        self._groups = self._parse(load_json(self._path, log) or {})
        return len(self._groups)

    def _parse(self, doc: dict) -> dict[str, GroupConfig]:
        groups = {}
        for name, raw in doc.get("subscriptionGroupTable", {}).items():
            try:
                groups[name] = GroupConfig(
                    group=name,
                    consume_enable=bool(raw.get("consumeEnable", True)),
                    consume_broadcast_enable=bool(raw.get("consumeBroadcastEnable", True)),
                    retry_queue_nums=int(raw.get("retryQueueNums", self._defaults.retry_queue_nums)),
                    retry_max_times=int(raw.get("retryMaxTimes", self._defaults.retry_max_times)),
                    consume_orderly=bool(raw.get("consumeMessageOrderly", False)),
                )
            except (TypeError, ValueError, AttributeError):
                log.warning("skipping malformed group entry", event="group_skip", group=name)
        return groups

    def document(self) -> dict:
        """subscriptionGroup.json's content (what a replica mirrors)."""
        return self._document()

    def mirror(self, doc: dict) -> bool:
        """A replica's copy of its master's groups (`document()`), replaced whole; True when it changed.
        Groups whose names no RPC accepts are left out: they come from another process."""
        before, after = self._groups, self._parse(doc)
        bad = {name: why for name in after if (why := _name_problem(name))}
        if bad.keys() != self._mirror_skipped:
            self._mirror_skipped = frozenset(bad)  # said once per change, not at every mirror
            for name, why in list(bad.items())[:5]:
                log.warning("mirrored group skipped: %s", why, event="group_mirror_skipped", group=repr(name),
                            total=len(bad))
        after = {name: group for name, group in after.items() if name not in bad}
        if after == before:
            return False
        self._groups = after
        self.version += 1

        def undo() -> None:
            if self._groups is after:
                self._groups = before
                self.version += 1

        self.file.changed(undo)
        return True

    def _save(self, group: str, before: GroupConfig | None) -> None:
        """Persist; when subscriptionGroup.json cannot be written the change is undone (see MetadataFile)."""
        after = self._groups.get(group)
        self.version += 1

        def undo() -> None:
            if self._groups.get(group) is after:
                if before is None:
                    self._groups.pop(group, None)
                else:
                    self._groups[group] = before
                self.version += 1

        self.file.changed(undo)

    def _document(self) -> dict:
        return {"subscriptionGroupTable": {
            g.group: {"groupName": g.group, "consumeEnable": g.consume_enable,
                      "consumeBroadcastEnable": g.consume_broadcast_enable,
                      "retryQueueNums": g.retry_queue_nums, "retryMaxTimes": g.retry_max_times,
                      "consumeMessageOrderly": g.consume_orderly}
            for g in self._groups.values()
        }}

    def get(self, group: str) -> GroupConfig | None:
        return self._groups.get(group)

    def find_or_default(self, group: str) -> GroupConfig:
        """The group's config, or the defaults without creating it (read paths)."""
        return self._groups.get(group) or replace(self._defaults, group=group)

    def ensure(self, group: str) -> GroupConfig:
        """The group's config, created with defaults on first use."""
        found = self._groups.get(group)
        if found is not None:
            return found
        check_group(group)
        config = replace(self._defaults, group=group)
        self._groups[group] = config
        self._save(group, None)
        log.info("group config created", event="group_create", group=group)
        return config

    def preview(self, group: str, **changes: object) -> GroupConfig:
        """The config `update` would give the group, checked, without changing anything (a dry run)."""
        return replace(self.find_or_default(group), **self._checked(group, changes))

    @staticmethod
    def _checked(group: str, changes: dict[str, object]) -> dict[str, object]:
        check_group(group)
        clean = {k: v for k, v in changes.items() if v is not None}
        for key in ("retry_queue_nums",):
            if key in clean and not 1 <= int(clean[key]) <= 64:
                raise InvalidArgumentError(f"{key} must be between 1 and 64, got {clean[key]}")
        if "retry_max_times" in clean and int(clean["retry_max_times"]) < 0:
            raise InvalidArgumentError(f"retry_max_times must be >= 0, got {clean['retry_max_times']}")
        return clean

    def update(self, group: str, **changes: object) -> GroupConfig:
        """Change a group's settings (creating its config first); every value is checked before anything changes."""
        clean = self._checked(group, changes)
        before = self._groups.get(group)
        config = replace(self.ensure(group), **clean)
        self._groups[group] = config
        self._save(group, before)
        return config

    def delete(self, group: str) -> None:
        before = self._groups.pop(group, None)
        if before is None:
            raise NotFoundError(f"group {group!r} has no config on this broker")
        self._save(group, before)

    def groups(self) -> list[str]:
        return sorted(self._groups)
