"""Users, ACL rules and the access decision, as RocketMQ 5's Access Control 2.0 defines them.

A rule grants or refuses one user some actions on a resource, optionally only
from some source addresses:

    user=alice  resource=Topic:orders-*  actions={Pub, Sub}  decision=Allow  source_ips=(10.0.0.0/8,)

`evaluate` decides a request: super users may do anything; otherwise the
rules that apply (same user, resource pattern matching, action listed or All,
source address inside one of the rule's CIDRs or the rule naming none) are
looked at together: any Deny wins, else any Allow allows, else the answer is
Deny. The decision so never depends on the order of the rules, and a request
nobody thought of is refused.

Resource patterns: `Topic:orders` is that topic only, `Topic:orders-*` every
topic whose name starts with `orders-`, `Topic:*` every topic; the same for
`Group:`. `Cluster` is the broker itself (broker settings, user management).

A source address that cannot be read (empty, a Unix socket peer) is outside
every CIDR, with one exception that keeps the decision on the safe side: a
Deny rule limited to some addresses still applies to it, since nobody can say
the request did not come from them.

Pure: no I/O, no grpc. Invalid values raise InvalidArgumentError naming them.
"""

from __future__ import annotations

import enum
import functools
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field

from tidemark.broker.errors import InvalidArgumentError
from tidemark.common.protocol import InvalidNameError, check_group_name, check_topic_name

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class ResourceType(enum.Enum):
    TOPIC = "Topic"
    GROUP = "Group"
    CLUSTER = "Cluster"


class Action(enum.Enum):
    PUB = "Pub"
    SUB = "Sub"
    CREATE = "Create"
    UPDATE = "Update"
    DELETE = "Delete"
    GET = "Get"
    LIST = "List"
    ALL = "All"  # in a rule: every action

    @classmethod
    def parse(cls, text: str) -> Action:
        """An action from its name, in any case ("pub", "Pub", "PUB")."""
        for action in cls:
            if action.value.lower() == text.strip().lower():
                return action
        raise InvalidArgumentError(f"unknown action {text!r}: use {', '.join(a.value for a in cls)}")


class Decision(enum.Enum):
    ALLOW = "Allow"
    DENY = "Deny"

    @classmethod
    def parse(cls, text: str) -> Decision:
        for decision in cls:
            if decision.value.lower() == text.strip().lower():
                return decision
        raise InvalidArgumentError(f"unknown decision {text!r}: use Allow or Deny")


WILDCARD = "*"


@dataclass(frozen=True)
class Resource:
    """A resource, or a pattern of resources in a rule (a name ending in `*` is a prefix)."""

    type: ResourceType
    name: str = ""

    def __post_init__(self) -> None:
        if self.type is ResourceType.CLUSTER:
            if self.name not in ("", WILDCARD):
                raise InvalidArgumentError(f"resource 'Cluster' takes no name, got {self.name!r}")
            object.__setattr__(self, "name", "")
            return
        literal = self.name[:-1] if self.is_prefix else self.name
        if WILDCARD in literal:
            raise InvalidArgumentError(f"resource {self.type.value}:{self.name}: '*' may only end a name")
        if not literal and not self.is_prefix:
            raise InvalidArgumentError(f"resource {self.type.value} needs a name: {self.type.value}:NAME, "
                                       f"{self.type.value}:PREFIX* or {self.type.value}:*")
        if literal:
            try:
                (check_topic_name if self.type is ResourceType.TOPIC else check_group_name)(literal)
            except InvalidNameError as e:
                raise InvalidArgumentError(f"resource {self.type.value}:{self.name}: {e}") from None

    @classmethod
    def parse(cls, text: str) -> Resource:
        """`Topic:orders`, `Topic:orders-*`, `Topic:*`, `Group:billing`, `Cluster` (type in any case)."""
        kind, _, name = text.strip().partition(":")
        for t in ResourceType:
            if t.value.lower() == kind.lower():
                return cls(t, name)
        raise InvalidArgumentError(f"resource {text!r} is not Topic:NAME, Group:NAME or Cluster "
                                   "(a name may end in '*' to match a prefix)")

    @classmethod
    def topic(cls, name: str) -> Resource:
        return cls(ResourceType.TOPIC, name)

    @classmethod
    def group(cls, name: str) -> Resource:
        return cls(ResourceType.GROUP, name)

    @classmethod
    def cluster(cls) -> Resource:
        return cls(ResourceType.CLUSTER)

    @property
    def is_prefix(self) -> bool:
        return self.name.endswith(WILDCARD)

    def matches(self, requested: Resource) -> bool:
        """Whether this rule pattern covers the requested resource."""
        if self.type is not requested.type:
            return False
        if self.is_prefix:
            return requested.name.startswith(self.name[:-1])
        return self.name == requested.name

    def __str__(self) -> str:
        return self.type.value if self.type is ResourceType.CLUSTER else f"{self.type.value}:{self.name}"


@dataclass(frozen=True)
class User:
    """A user (RocketMQ's access key) with its secret; the secret stays out of repr and logs."""

    name: str
    secret_key: str = field(repr=False)
    super_user: bool = False


def parse_network(text: str) -> Network:
    """A CIDR (`10.0.0.0/8`, `2001:db8::/32`) or one address; InvalidArgumentError naming a bad one."""
    try:
        network = ipaddress.ip_network(text.strip(), strict=True)
    except ValueError as e:
        if "has host bits set" in str(e):
            loose = ipaddress.ip_network(text.strip(), strict=False)
            raise InvalidArgumentError(f"source ip {text!r} has host bits set; did you mean {loose}?") from None
        raise InvalidArgumentError(f"source ip {text!r} is not an IP address or CIDR range") from None
    mapped = ipaddress.ip_network("::ffff:0:0/96")
    if isinstance(network, ipaddress.IPv6Network) and network.subnet_of(mapped):
        # Peers in ::ffff:a.b.c.d form are matched as IPv4 (parse_address), so the rule must be IPv4 too.
        ipv4 = network.network_address.ipv4_mapped
        return ipaddress.ip_network(f"{ipv4}/{network.prefixlen - 96}")
    return network


@functools.lru_cache(maxsize=4096)  # every check of a call parses the same peer address
def parse_address(text: str) -> Address | None:
    """A request's peer address, or None when it cannot be read. IPv4-mapped IPv6 counts as IPv4."""
    try:
        address = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


@dataclass(frozen=True)
class AclRule:
    """One rule. Built valid or not at all: actions non-empty, CIDRs parsed (kept in their normal form)."""

    user: str
    resource: Resource
    actions: frozenset[Action]
    decision: Decision
    source_ips: tuple[str, ...] = ()
    _networks: tuple[Network, ...] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        actions = frozenset(self.actions)
        if not actions:
            raise InvalidArgumentError(f"ACL rule for {self.user!r} on {self.resource} names no action")
        if not all(isinstance(a, Action) for a in actions):
            raise InvalidArgumentError(f"ACL rule actions must be Actions, got {sorted(map(str, actions))}")
        if not isinstance(self.decision, Decision):
            raise InvalidArgumentError(f"ACL rule decision must be Allow or Deny, got {self.decision!r}")
        networks = tuple(dict.fromkeys(parse_network(ip) for ip in self.source_ips))
        object.__setattr__(self, "actions", actions)
        object.__setattr__(self, "source_ips", tuple(str(n) for n in networks))
        object.__setattr__(self, "_networks", networks)

    def covers(self, resource: Resource, action: Action) -> bool:
        return self.resource.matches(resource) and (action in self.actions or Action.ALL in self.actions)

    def from_source(self, address: Address | None) -> bool:
        """Whether the rule's source restriction includes the address (see the module doc for None)."""
        if not self._networks:
            return True
        if address is None:
            return self.decision is Decision.DENY
        return any(address.version == n.version and address in n for n in self._networks)

    def sorted_actions(self) -> list[Action]:
        """The actions in the enum's order (stable output for files and listings)."""
        return [a for a in Action if a in self.actions]


def evaluate(user: User, rules: Iterable[AclRule], resource: Resource, action: Action, source_ip: str) -> Decision:
    """Allow or Deny `action` on `resource` for `user` calling from `source_ip` (see the module doc)."""
    if user.super_user:
        return Decision.ALLOW
    address = parse_address(source_ip)
    allowed = False
    for rule in rules:
        if rule.user != user.name or not rule.covers(resource, action) or not rule.from_source(address):
            continue
        if rule.decision is Decision.DENY:
            return Decision.DENY
        allowed = True
    return Decision.ALLOW if allowed else Decision.DENY
