"""Namespaces: tenants sharing a cluster under the same topic and group names (RocketMQ's namespace).

A topic or group `name` in namespace `NS` is stored as `NS%name`, RocketMQ's
NamespaceUtil.wrapNamespace form, so that a cluster that RocketMQ clients and
tools also know holds the names they expect. A group's retry and dead-letter
topics keep their prefix in front: `%RETRY%NS%group`, `%DLQ%NS%group`; and the
RocketMQ 5 pop retry topic, built by the broker from the stored names, is
`%RETRY%NS%group_NS%topic`.

The broker knows nothing of namespaces: they are a rule for names, applied at
the edges. The RocketMQ 5 adapter wraps each `Resource{resource_namespace,
name}` it receives and answers with the namespace and the bare name;
Tidemark's client wraps the names an application gives it (`namespace=`) and
hands back bare ones. So offsets, retries, dead letters and transactions of
two namespaces never meet, and ACL rules, `tidemark` commands and the console
see the stored names (a user is granted a whole namespace with `Topic:NS%*`
and `Group:NS%*`).

Tidemark's rules are stricter than RocketMQ's, which leaves names alone, so
that a stored name means one thing only:

- a namespace is 1..64 letters, digits, '_' and '-': no '%', or namespace
  `a%b` with topic `t` and namespace `a` with topic `b%t` would share `a%b%t`;
- a name in a namespace holds no '%' either (but for a leading `%RETRY%` or
  `%DLQ%`): the first '%' after the prefix ends the namespace;
- a name already in the namespace (`NS%name`) stays as it is, as in RocketMQ:
  a stored name handed back (from Admin, or a retried send) is not wrapped twice;
- every other name is wrapped, the broker's own topics included (RocketMQ
  leaves those alone): a client in a namespace reaches nothing outside it;
- the empty namespace is no namespace: names pass unchanged, for the callers'
  usual checks.

Pure functions; errors are InvalidNameError (NamespaceError for the namespace
itself), which each protocol's edge turns into its own refusal.
"""

from __future__ import annotations

import re

from tidemark.common.protocol import (
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    InvalidNameError,
)

SEPARATOR = "%"
NAMESPACE_MAX_LENGTH = 64
_NAMESPACE_RE = re.compile(r"[A-Za-z0-9_-]+")  # always fullmatch: `$` would let a trailing newline through
# A group's own topics: their prefix stays in front of the namespace.
_GROUP_TOPIC_PREFIXES = (RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)


class NamespaceError(InvalidNameError):
    """A namespace breaks the naming rules (the protocols answer it as a bad request, not a bad name)."""


def check_namespace(namespace: str) -> None:
    """NamespaceError saying what is wrong with a namespace; the empty one (no namespace) is fine."""
    if not isinstance(namespace, str):
        raise NamespaceError(f"namespace must be a string, got {type(namespace).__name__}")
    if not namespace:
        return
    if len(namespace) > NAMESPACE_MAX_LENGTH:
        raise NamespaceError(f"namespace {namespace[:40]!r}... is {len(namespace)} characters; "
                             f"at most {NAMESPACE_MAX_LENGTH} allowed")
    if not _NAMESPACE_RE.fullmatch(namespace):
        raise NamespaceError(f"namespace {namespace!r} may only contain letters, digits, '_' and '-' "
                             f"('{SEPARATOR}' separates it from the names in it)")


def _split_prefix(name: str) -> tuple[str, str]:
    """(`%RETRY%` / `%DLQ%` / "", the rest)."""
    for prefix in _GROUP_TOPIC_PREFIXES:
        if name.startswith(prefix):
            return prefix, name[len(prefix):]
    return "", name


def wrap(namespace: str, name: str, *, kind: str = "name") -> str:
    """The stored name of `name` in `namespace` (`kind`, "topic" or "group", names it in errors).

    `NS%name`; `%RETRY%NS%group` and `%DLQ%NS%group` for a group's own topics; a name already in the
    namespace unchanged. NamespaceError for a bad namespace, InvalidNameError for an empty name or one
    holding '%'. The empty namespace returns `name` as it is."""
    check_namespace(namespace)
    if not namespace:
        return name
    if not isinstance(name, str) or not name:
        raise InvalidNameError(f"{kind} name must not be empty")
    prefix, rest = _split_prefix(name)
    if rest.startswith(namespace + SEPARATOR):
        rest = rest[len(namespace) + 1:]  # already wrapped: checked as the bare name it holds
    if not rest:
        raise InvalidNameError(f"{kind} name {name!r} has nothing after its prefix")
    if SEPARATOR in rest:
        raise InvalidNameError(f"{kind} name {name!r} in namespace {namespace!r} must not contain "
                               f"'{SEPARATOR}' (it separates the namespace from the name)")
    return f"{prefix}{namespace}{SEPARATOR}{rest}"


def in_namespace(namespace: str, stored: str) -> bool:
    """Whether a stored name belongs to `namespace` (every name belongs to the empty one)."""
    if not namespace:
        return True
    return _split_prefix(stored)[1].startswith(namespace + SEPARATOR)


def unwrap(namespace: str, stored: str) -> str:
    """The name an application of `namespace` knows a stored name by: `wrap`'s inverse (`NS%t` -> `t`,
    `%DLQ%NS%g` -> `%DLQ%g`). A name outside the namespace is returned as stored."""
    if not namespace or not in_namespace(namespace, stored):
        return stored
    prefix, rest = _split_prefix(stored)
    return prefix + rest[len(namespace) + 1:]


__all__ = ["NAMESPACE_MAX_LENGTH", "SEPARATOR", "NamespaceError", "check_namespace", "in_namespace", "unwrap",
           "wrap"]
