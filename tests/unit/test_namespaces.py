"""common/namespaces.py: the one mapping of (namespace, name) to a stored name, shared by the RocketMQ 5
adapter and Tidemark's client."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemark.common.namespaces import (
    NAMESPACE_MAX_LENGTH,
    NamespaceError,
    check_namespace,
    in_namespace,
    unwrap,
    wrap,
)
from tidemark.common.protocol import (
    InvalidNameError,
    check_group_name,
    check_topic_name,
    dlq_topic,
    retry_topic,
)

namespaces = st.text(st.sampled_from("abcXYZ019_-"), min_size=1, max_size=NAMESPACE_MAX_LENGTH)
# A bare name: what RocketMQ allows in a name, but the separator.
names = st.text(st.sampled_from("abcXYZ019_-|"), min_size=1, max_size=40)


@given(namespaces, names)
def test_a_wrapped_name_unwraps_to_itself_and_belongs_to_its_namespace(ns, name):
    stored = wrap(ns, name)
    assert stored == f"{ns}%{name}"
    assert in_namespace(ns, stored)
    assert unwrap(ns, stored) == name


@given(namespaces, names)
def test_wrapping_is_idempotent(ns, name):
    once = wrap(ns, name)
    assert wrap(ns, once) == once


@given(namespaces, names)
def test_a_groups_retry_and_dead_letter_topics_keep_their_prefix_in_front(ns, group):
    assert wrap(ns, retry_topic(group)) == retry_topic(wrap(ns, group)) == f"%RETRY%{ns}%{group}"
    assert wrap(ns, dlq_topic(group)) == dlq_topic(wrap(ns, group)) == f"%DLQ%{ns}%{group}"
    assert unwrap(ns, dlq_topic(wrap(ns, group))) == dlq_topic(group)
    assert unwrap(ns, retry_topic(wrap(ns, group))) == retry_topic(group)


@given(namespaces, namespaces, names, names)
def test_two_namespaces_never_share_a_stored_name(ns1, ns2, a, b):
    if ns1 != ns2:
        assert wrap(ns1, a) != wrap(ns2, b)
        assert not in_namespace(ns2, wrap(ns1, a)) or wrap(ns1, a).startswith(f"{ns2}%")
    else:
        assert (wrap(ns1, a) == wrap(ns2, b)) == (a == b)


@given(namespaces, names)
def test_a_name_of_another_namespace_is_refused_not_rewrapped(ns, name):
    with pytest.raises(InvalidNameError, match="must not contain '%'"):
        wrap(ns, wrap(ns + "x", name))


@given(names)
def test_no_namespace_leaves_every_name_alone(name):
    assert wrap("", name) == name == unwrap("", name)
    assert in_namespace("", name)
    assert wrap("", "a%b") == "a%b"  # RocketMQ's rules for names without a namespace stay the callers'


@given(namespaces, names)
def test_a_stored_name_passes_the_usual_name_checks(ns, name):
    check_group_name(wrap(ns, name))
    check_topic_name(wrap(ns, name))  # 64 + 1 + 40 <= 127


def test_a_name_outside_the_namespace_unwraps_to_itself():
    assert unwrap("NS", "OTHER%t") == "OTHER%t"
    assert unwrap("NS", "NSX%t") == "NSX%t"
    assert not in_namespace("NS", "NSX%t")
    assert unwrap("NS", "%DLQ%OTHER%g") == "%DLQ%OTHER%g"


def test_the_brokers_own_topics_are_wrapped_too():
    assert wrap("NS", "SCHEDULE_TOPIC_XXXX") == "NS%SCHEDULE_TOPIC_XXXX"


@pytest.mark.parametrize("bad, why", [
    ("a%b", "may only contain letters, digits"),
    ("a b", "may only contain letters, digits"),
    ("tenant|x", "may only contain letters, digits"),
    ("ns\n", "may only contain letters, digits"),
    ("é", "may only contain letters, digits"),
    ("n" * (NAMESPACE_MAX_LENGTH + 1), f"at most {NAMESPACE_MAX_LENGTH} allowed"),
    (None, "must be a string"),
])
def test_a_bad_namespace_is_refused_naming_it(bad, why):
    with pytest.raises(NamespaceError, match=why) as e:
        wrap(bad, "t")
    if isinstance(bad, str):
        assert repr(bad[:40]) in str(e.value)
    with pytest.raises(NamespaceError):
        check_namespace(bad)


@pytest.mark.parametrize("bad, why", [
    ("", "must not be empty"),
    ("a%b", "must not contain '%'"),
    ("%RETRY%", "nothing after its prefix"),
    ("NS%", "nothing after its prefix"),
    ("%X%t", "must not contain '%'"),
    ("%RETRY%a%b", "must not contain '%'"),
])
def test_a_bad_name_in_a_namespace_is_refused_naming_it(bad, why):
    with pytest.raises(InvalidNameError, match=why) as e:
        wrap("NS", bad, kind="topic")
    assert not isinstance(e.value, NamespaceError)
    assert "topic" in str(e.value)


def test_the_longest_namespace_is_allowed():
    ns = "n" * NAMESPACE_MAX_LENGTH
    assert wrap(ns, "t") == f"{ns}%t"


def test_a_bare_future_passes_results_and_cancellation_both_ways():
    import concurrent.futures

    from tidemark.client.message import MessageQueue, SendResult
    from tidemark.client.namespacing import Names

    names = Names("ns")
    inner: concurrent.futures.Future = concurrent.futures.Future()
    out = names.bare_future(inner)
    inner.set_result(SendResult("id", MessageQueue("ns%T", "broker-a", 0), 7))
    assert out.result(1).message_queue.topic == "T"

    inner = concurrent.futures.Future()
    out = names.bare_future(inner)
    assert out.cancel()
    assert inner.cancelled()  # the application's cancel reaches the send

    inner = concurrent.futures.Future()
    out = names.bare_future(inner)
    assert inner.set_running_or_notify_cancel()  # the send is under way: it can no longer be cancelled
    out.cancel()
    inner.set_result(SendResult("id", MessageQueue("ns%T", "broker-a", 0), 8))  # no InvalidStateError
    assert out.cancelled()
