"""The access decision (broker/auth/acl.py): properties over generated users, rules and requests."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.broker.auth import AclRule, Action, Decision, Resource, ResourceType, User, evaluate
from tidemark.broker.errors import InvalidArgumentError

USERS = ["alice", "bob"]
NAMES = ["orders", "orders-eu", "orders-us", "billing", "audit"]
PATTERNS = [*NAMES, "orders-*", "orders*", "*", "b*"]
CIDRS = ["10.0.0.0/8", "10.1.0.0/16", "192.168.1.7/32", "2001:db8::/32"]
IPS = ["10.1.2.3", "10.200.0.1", "192.168.1.7", "172.16.0.1", "2001:db8::1", "::ffff:10.1.2.3", "", "unix:/x"]
CONCRETE = [Action.PUB, Action.SUB, Action.CREATE, Action.UPDATE, Action.DELETE, Action.GET, Action.LIST]

resource_types = st.sampled_from([ResourceType.TOPIC, ResourceType.GROUP])
patterns = st.one_of(
    st.builds(Resource, resource_types, st.sampled_from(PATTERNS)),
    st.just(Resource.cluster()))
requests = st.one_of(st.builds(Resource, resource_types, st.sampled_from(NAMES)), st.just(Resource.cluster()))
rules = st.builds(
    AclRule,
    user=st.sampled_from(USERS),
    resource=patterns,
    actions=st.frozensets(st.sampled_from(list(Action)), min_size=1),
    decision=st.sampled_from(list(Decision)),
    source_ips=st.lists(st.sampled_from(CIDRS), max_size=2).map(tuple))
rule_lists = st.lists(rules, max_size=12)
users = st.builds(User, st.sampled_from(USERS), st.just("secret-key"), st.just(False))
actions = st.sampled_from(CONCRETE)
ips = st.sampled_from(IPS)


def applies(rule: AclRule, user: User, resource: Resource, action: Action, ip: str) -> bool:
    """The rule of applicability written out independently of acl.py."""
    import ipaddress

    if rule.user != user.name or rule.resource.type is not resource.type:
        return False
    pattern = rule.resource.name
    if pattern.endswith("*"):
        if not resource.name.startswith(pattern[:-1]):
            return False
    elif pattern != resource.name:
        return False
    if action not in rule.actions and Action.ALL not in rule.actions:
        return False
    if not rule.source_ips:
        return True
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return rule.decision is Decision.DENY
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return any(address.version == ipaddress.ip_network(c).version and address in ipaddress.ip_network(c)
               for c in rule.source_ips)


@settings(max_examples=400)
@given(users, rule_lists, requests, actions, ips)
def test_decision_is_deny_wins_else_any_allow_else_deny(user, rule_list, resource, action, ip):
    applicable = [r for r in rule_list if applies(r, user, resource, action, ip)]
    expected = (Decision.DENY if any(r.decision is Decision.DENY for r in applicable)
                else Decision.ALLOW if applicable else Decision.DENY)
    assert evaluate(user, rule_list, resource, action, ip) is expected


@given(users, rule_lists, requests, actions, ips, st.randoms())
def test_order_of_rules_does_not_matter(user, rule_list, resource, action, ip, rnd: random.Random):
    shuffled = list(rule_list)
    rnd.shuffle(shuffled)
    assert evaluate(user, shuffled, resource, action, ip) is evaluate(user, rule_list, resource, action, ip)


@given(users, rule_lists, requests, actions, ips)
def test_an_applicable_deny_wins_over_any_allow(user, rule_list, resource, action, ip):
    deny = AclRule(user.name, resource, frozenset({action}), Decision.DENY)
    allow = AclRule(user.name, resource, frozenset({Action.ALL}), Decision.ALLOW)
    assert evaluate(user, [allow, *rule_list, deny], resource, action, ip) is Decision.DENY


@given(rule_lists, requests, actions, ips)
def test_super_users_are_always_allowed(rule_list, resource, action, ip):
    denied_everything = [AclRule("alice", Resource(t, "*") if t is not ResourceType.CLUSTER else Resource.cluster(),
                                 frozenset({Action.ALL}), Decision.DENY) for t in ResourceType]
    root = User("alice", "secret-key", super_user=True)
    assert evaluate(root, [*rule_list, *denied_everything], resource, action, ip) is Decision.ALLOW


@given(users, requests, actions, ips)
def test_no_rule_means_deny(user, resource, action, ip):
    assert evaluate(user, [], resource, action, ip) is Decision.DENY


@given(users, rule_lists, requests, actions, ips)
def test_other_users_rules_never_decide(user, rule_list, resource, action, ip):
    other = "bob" if user.name == "alice" else "alice"
    theirs = [r for r in rule_list if r.user == other]
    assert evaluate(user, theirs, resource, action, ip) is Decision.DENY


def allow(pattern: str, *, ips: tuple[str, ...] = (), actions=frozenset({Action.PUB})) -> AclRule:
    return AclRule("alice", Resource.parse(pattern), actions, Decision.ALLOW, ips)


ALICE = User("alice", "secret-key")


@pytest.mark.parametrize("pattern, topic, expected", [
    ("Topic:orders", "orders", Decision.ALLOW),
    ("Topic:orders", "orders-eu", Decision.DENY),   # literal: not a prefix
    ("Topic:orders", "order", Decision.DENY),
    ("Topic:orders-*", "orders-eu", Decision.ALLOW),
    ("Topic:orders-*", "orders-", Decision.ALLOW),
    ("Topic:orders-*", "orders", Decision.DENY),
    ("Topic:*", "anything", Decision.ALLOW),
    ("Group:orders", "orders", Decision.DENY),      # a group rule says nothing about topics
    ("Cluster", "orders", Decision.DENY),
])
def test_literal_and_prefix_patterns(pattern, topic, expected):
    assert evaluate(ALICE, [allow(pattern)], Resource.topic(topic), Action.PUB, "10.0.0.1") is expected


def test_cluster_rules_match_the_cluster():
    rule = allow("Cluster", actions=frozenset({Action.UPDATE}))
    assert evaluate(ALICE, [rule], Resource.cluster(), Action.UPDATE, "10.0.0.1") is Decision.ALLOW
    assert evaluate(ALICE, [rule], Resource.cluster(), Action.DELETE, "10.0.0.1") is Decision.DENY


def test_all_grants_every_action_but_a_concrete_action_only_itself():
    everything = allow("Topic:orders", actions=frozenset({Action.ALL}))
    for action in CONCRETE:
        assert evaluate(ALICE, [everything], Resource.topic("orders"), action, "") is Decision.ALLOW
    pub = allow("Topic:orders")
    assert evaluate(ALICE, [pub], Resource.topic("orders"), Action.SUB, "") is Decision.DENY


@pytest.mark.parametrize("ip, expected", [
    ("10.1.2.3", Decision.ALLOW),
    ("10.255.255.255", Decision.ALLOW),
    ("11.0.0.1", Decision.DENY),
    ("::ffff:10.1.2.3", Decision.ALLOW),   # an IPv4 client on a dual-stack socket
    ("2001:db8::5", Decision.ALLOW),
    ("2001:db9::5", Decision.DENY),
    ("", Decision.DENY),                   # unknown source: outside every range
    ("not-an-ip", Decision.DENY),
])
def test_source_cidrs_limit_an_allow(ip, expected):
    rule = allow("Topic:orders", ips=("10.0.0.0/8", "2001:db8::/32"))
    assert evaluate(ALICE, [rule], Resource.topic("orders"), Action.PUB, ip) is expected


@pytest.mark.parametrize("ip, expected", [
    ("10.1.2.3", Decision.DENY),
    ("192.168.0.1", Decision.ALLOW),
    ("", Decision.DENY),  # a Deny limited to some sources still covers an unknown source
])
def test_a_deny_limited_to_sources(ip, expected):
    rules = [allow("Topic:orders"),
             AclRule("alice", Resource.topic("orders"), frozenset({Action.PUB}), Decision.DENY, ("10.0.0.0/8",))]
    assert evaluate(ALICE, rules, Resource.topic("orders"), Action.PUB, ip) is expected


@pytest.mark.parametrize("ips, message", [
    (("10.0.0.5/8",), "has host bits set; did you mean 10.0.0.0/8"),
    (("10.0.0.0/33",), "'10.0.0.0/33' is not an IP address"),
    (("everywhere",), "'everywhere' is not an IP address"),
])
def test_bad_cidrs_are_refused_naming_them(ips, message):
    with pytest.raises(InvalidArgumentError, match=message):
        allow("Topic:orders", ips=ips)


def test_a_rule_needs_an_action_and_keeps_cidrs_in_normal_form():
    with pytest.raises(InvalidArgumentError, match="names no action"):
        AclRule("alice", Resource.topic("orders"), frozenset(), Decision.ALLOW)
    rule = allow("Topic:orders", ips=("10.0.0.1", "10.0.0.1/32", "2001:DB8::/32"))
    assert rule.source_ips == ("10.0.0.1/32", "2001:db8::/32")
    assert rule == allow("Topic:orders", ips=("10.0.0.1/32", "2001:db8::/32"))


def test_a_rule_written_for_ipv4_mapped_addresses_matches_those_peers():
    from tidemark.broker.auth.acl import parse_network
    assert str(parse_network("::ffff:10.0.0.0/104")) == "10.0.0.0/8"
    assert str(parse_network("::ffff:10.1.2.3")) == "10.1.2.3/32"
