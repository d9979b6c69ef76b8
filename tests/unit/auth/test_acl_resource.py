"""Resource patterns, actions and decisions as text (broker/auth/acl.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemark.broker.auth import Action, Decision, Resource, ResourceType, User
from tidemark.broker.errors import InvalidArgumentError


@pytest.mark.parametrize("text, resource, canonical", [
    ("Topic:orders", Resource(ResourceType.TOPIC, "orders"), "Topic:orders"),
    ("Topic:orders-*", Resource(ResourceType.TOPIC, "orders-*"), "Topic:orders-*"),
    ("Topic:*", Resource(ResourceType.TOPIC, "*"), "Topic:*"),
    ("Group:billing", Resource(ResourceType.GROUP, "billing"), "Group:billing"),
    ("Group:%RETRY%billing", Resource(ResourceType.GROUP, "%RETRY%billing"), "Group:%RETRY%billing"),
    ("Cluster", Resource(ResourceType.CLUSTER), "Cluster"),
    ("Cluster:*", Resource(ResourceType.CLUSTER), "Cluster"),
    ("topic:orders", Resource(ResourceType.TOPIC, "orders"), "Topic:orders"),
    (" GROUP:billing ", Resource(ResourceType.GROUP, "billing"), "Group:billing"),
])
def test_parse_and_str(text, resource, canonical):
    assert Resource.parse(text) == resource
    assert str(Resource.parse(text)) == canonical


@pytest.mark.parametrize("text, message", [
    ("Queue:orders", "is not Topic:NAME, Group:NAME or Cluster"),
    ("orders", "is not Topic:NAME"),
    ("", "is not Topic:NAME"),
    ("Topic:", "needs a name"),
    ("Topic", "needs a name"),
    ("Topic:ord*ers", "'\\*' may only end a name"),
    ("Topic:**", "'\\*' may only end a name"),
    ("Topic:bad name", "may only contain"),
    ("Group:a/b*", "may only contain"),
    ("Cluster:prod", "takes no name"),
])
def test_bad_resources_are_refused_naming_them(text, message):
    with pytest.raises(InvalidArgumentError, match=message):
        Resource.parse(text)


names = st.from_regex(r"[A-Za-z0-9_|%-]{1,40}", fullmatch=True)


@given(st.sampled_from([ResourceType.TOPIC, ResourceType.GROUP]), names, st.booleans())
def test_str_and_parse_round_trip(kind, name, prefix):
    resource = Resource(kind, name + ("*" if prefix else ""))
    assert Resource.parse(str(resource)) == resource


@given(names, names)
def test_a_prefix_matches_exactly_the_names_starting_with_it(prefix, name):
    pattern = Resource.topic(prefix + "*")
    assert pattern.matches(Resource.topic(name)) == name.startswith(prefix)
    assert pattern.matches(Resource.topic(prefix + name))
    assert not pattern.matches(Resource.group(prefix + name))
    assert Resource.topic(name).matches(Resource.topic(name))
    assert Resource.topic(prefix).matches(Resource.topic(name)) == (prefix == name)


def test_actions_and_decisions_parse_in_any_case():
    assert [Action.parse(t) for t in ("pub", "Sub", "ALL", " list ")] == [Action.PUB, Action.SUB, Action.ALL,
                                                                          Action.LIST]
    assert Decision.parse("deny") is Decision.DENY
    with pytest.raises(InvalidArgumentError, match="unknown action 'Publish'"):
        Action.parse("Publish")
    with pytest.raises(InvalidArgumentError, match="unknown decision 'Maybe'"):
        Decision.parse("Maybe")


def test_a_users_secret_stays_out_of_its_repr():
    assert "s3cret-value" not in repr(User("alice", "s3cret-value", super_user=True))
