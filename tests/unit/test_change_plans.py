"""`acl delete`'s plan reads a resource as the brokers read it, so the dry run and --execute agree."""

from __future__ import annotations

import pytest

from tidemark.broker.auth.acl import Resource
from tidemark.client.change_plans import canonical_resource


@pytest.mark.parametrize("typed", ["Topic:Orders", "topic:Orders", " TOPIC:Orders ", "Group:billing", "group:bill*",
                                   "Cluster", "cluster", "Cluster:*", "Topic:*"])
def test_a_typed_resource_reads_as_the_broker_stores_it(typed):
    assert canonical_resource(typed) == str(Resource.parse(typed))


def test_what_the_broker_refuses_is_left_for_it_to_refuse():
    assert canonical_resource(" Queue:x ") == "Queue:x"
