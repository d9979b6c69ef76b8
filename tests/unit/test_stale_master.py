"""A master that may have been replaced (fenced, or its etcd lease uncertain) changes no offsets: every
commit path of the offset service asks the permission first, and a refused change leaves the table as
it was. A replica and a master sure of its lease commit as before."""

from __future__ import annotations

import pytest

from tidemark.broker.cluster.permission import BrokerPermission
from tidemark.broker.errors import NotCurrentError


def test_stale_says_why_and_check_current_refuses():
    p = BrokerPermission("broker-a")
    assert p.stale == "" and p.writable
    p.check_current()
    lease = [False]
    p.lease_valid = lambda: lease[0]
    assert "lease" in p.stale and not p.writable
    with pytest.raises(NotCurrentError, match="may no longer be the master"):
        p.check_current()
    lease[0] = True
    p.check_current()  # a renewal answered: the lease was still its own
    p.fence("a newer master has epoch 3")
    assert p.stale.startswith("fenced: a newer master")
    with pytest.raises(NotCurrentError, match="fenced"):
        p.check_current()


def test_a_replica_is_never_stale():
    p = BrokerPermission("broker-a", replica_of="127.0.0.1:1")
    assert p.stale == "" and not p.writable
    p.check_current()
