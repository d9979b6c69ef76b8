"""MessageSelector: which messages of a topic a consumer wants (RocketMQ's MessageSelector).

`MessageSelector.by_tag("a || b")` selects by tag, as a plain subscription expression does;
`MessageSelector.by_sql("region = 'eu' AND amount > 100")` selects by an SQL92 condition on the message's
properties (RocketMQ's `MessageSelector.bySql`; the grammar and its meaning are in common/sql92.py), which
the broker evaluates on every message before it sends it. A selector is checked when it is made: a bad
expression is InvalidArgumentError naming the column of the error.

A consumer takes either a selector or a plain string (a tag expression) where it subscribes; on the wire
the selector is the subscription's expression with its expression type (TAG or SQL92).
"""

from __future__ import annotations

from dataclasses import dataclass

from tidemark.client.errors import InvalidArgumentError, InvalidTypeError
from tidemark.common.protocol import ExpressionType, MessageFilter, parse_filter


@dataclass(frozen=True, slots=True)
class MessageSelector:
    """A subscription's expression and how it is read: by tag (`by_tag`) or by SQL92 (`by_sql`)."""

    expression: str
    expression_type: str = ExpressionType.TAG

    def __post_init__(self) -> None:
        if not isinstance(self.expression, str):
            raise InvalidTypeError(f"a selector's expression is a str, got {type(self.expression).__name__}")
        try:
            parse_filter(self.expression, self.expression_type)
        except ValueError as e:
            raise InvalidArgumentError(str(e)) from None

    @classmethod
    def by_tag(cls, expression: str = "*") -> MessageSelector:
        """Messages whose tag matches: "*" (or "") for all, "a || b" for those tags."""
        return cls(expression or "*", ExpressionType.TAG)

    @classmethod
    def by_sql(cls, expression: str) -> MessageSelector:
        """Messages whose properties satisfy an SQL92 condition, e.g. "a BETWEEN 1 AND 5 AND b IN ('x', 'y')"."""
        return cls(expression, ExpressionType.SQL92)

    @classmethod
    def of(cls, selector: str | MessageSelector | None) -> MessageSelector:
        """A selector as given, or a plain string (None: "*") read as a tag expression."""
        if isinstance(selector, MessageSelector):
            return selector
        if selector is None or isinstance(selector, str):
            return cls.by_tag(selector or "*")
        raise InvalidTypeError(f"a subscription is a tag expression (str) or a MessageSelector, got "
                               f"{type(selector).__name__}")

    @property
    def is_sql(self) -> bool:
        """Whether the broker filters by an SQL92 condition (else by tag)."""
        return self.expression_type == ExpressionType.SQL92

    @property
    def filter(self) -> MessageFilter:
        """The parsed filter (memoised): a TagExpression or a compiled SQL92 condition. The broker filters
        SQL92 exactly; a tag filter is exact on the client only (the broker filters by hash code)."""
        return parse_filter(self.expression, self.expression_type)
