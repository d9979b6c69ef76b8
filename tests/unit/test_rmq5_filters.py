"""RocketMQ 5's FilterExpression on the broker: TAG (or unspecified) and SQL, in a receive and in a consumer's
settings; a bad expression is ILLEGAL_FILTER_EXPRESSION with the column of the error."""

from __future__ import annotations

import pytest

from tidemark.broker.services.rmq5.status import Code, ProtocolError
from tidemark.broker.services.rmq5.telemetry import filter_expression, parse_settings
from tidemark.common.protocol import ExpressionType
from tidemark.rmq5.v2 import messaging_pb2 as pb


def test_tag_and_sql_filters_are_read_as_their_type():
    assert filter_expression(pb.FilterExpression(expression="a||b")).expression_type == ExpressionType.TAG
    assert filter_expression(pb.FilterExpression(type=pb.TAG, expression="")).matches_all
    sql = filter_expression(pb.FilterExpression(type=pb.SQL, expression="region = 'eu' AND amount > 100"))
    assert sql.expression_type == ExpressionType.SQL92
    assert sql.matches_properties({"region": "eu", "amount": "101"})
    assert not sql.matches_properties({"region": "eu", "amount": "100"})


@pytest.mark.parametrize("f, words", [
    (pb.FilterExpression(type=pb.SQL, expression="a >"), 'SQL92 expression "a >" at column 4: expected a value'),
    (pb.FilterExpression(type=pb.SQL, expression=""), "at column 1: expected a condition"),
    (pb.FilterExpression(type=pb.TAG, expression="a || "), "empty tag"),
])
def test_a_bad_filter_is_an_illegal_filter_expression(f, words):
    with pytest.raises(ProtocolError) as caught:
        filter_expression(f)
    assert caught.value.code == Code.ILLEGAL_FILTER_EXPRESSION and words in str(caught.value)


def test_a_consumers_sql_subscription_is_registered_as_sql92():
    settings = pb.Settings(client_type=pb.PUSH_CONSUMER, subscription=pb.Subscription(
        group=pb.Resource(name="g"), subscriptions=[
            pb.SubscriptionEntry(topic=pb.Resource(name="A"),
                                 expression=pb.FilterExpression(type=pb.SQL, expression="a IS NOT NULL")),
            pb.SubscriptionEntry(topic=pb.Resource(name="B"), expression=pb.FilterExpression(type=pb.TAG,
                                                                                               expression="x"))]))
    client = parse_settings("c1", settings)
    assert client.subscriptions == (("A", "a IS NOT NULL"), ("B", "x")) and client.sql92_topics == {"A"}
