"""SQL92 property filters: RocketMQ's `MessageSelector.bySql`, RocketMQ 5's `FilterExpressionType.SQL92`.

`parse_sql92` turns an expression into a tree (the node classes below), `format_sql92` prints a tree back
as text that parses to the same tree, and `compile_sql92` (memoised by text) gives a `Sql92Filter` whose
`matches(properties)` evaluates the compiled tree against one message's properties without parsing again.
Pure functions, no I/O; the semantics (values, conversions, unknowns) are in `sql92_eval.py`.

The grammar is RocketMQ's (filter/.../parser/SelectorParser.jj, itself ActiveMQ's without arithmetic):

    condition   := and ("OR" and)*
    and         := equality ("AND" equality)*
    equality    := comparison (("=" | "<>") comparison | "IS" ["NOT"] "NULL")*
    comparison  := unary ((">" | ">=" | "<" | "<=") unary
                        | ["NOT"] "BETWEEN" unary "AND" unary
                        | ["NOT"] "IN" "(" string ("," string)* ")"
                        | ["NOT"] ("CONTAINS" | "STARTSWITH" | "ENDSWITH") string
                        | ["NOT"] "LIKE" string ["ESCAPE" string])*
    unary       := "+" unary | "-" unary | "NOT" unary | primary
    primary     := string | integer | decimal | "TRUE" | "FALSE" | "NULL" | property | "(" condition ")"

Keywords are case-insensitive, property names are not (`[A-Za-z_$][A-Za-z0-9_$]*`); strings are in single
quotes ('' is a quote); integers are decimal without leading zeros (an `L` suffix is allowed), decimals as
`1.5`, `1.`, `.5`, `1e3`; `--` and `/* */` are comments. What differs from RocketMQ, on purpose:

- `LIKE` / `NOT LIKE` (`%` any run, `_` one character, optional `ESCAPE`) are ActiveMQ's: RocketMQ removed
  them from its grammar (it has CONTAINS, STARTSWITH and ENDSWITH, which are here too). LIKE and ESCAPE are
  keywords only where an operator may stand, so a property named `like` stays usable.
- RocketMQ's NOT binds to the value next to it: it reads `NOT a = 1` as `(NOT a) = 1` (which never
  matches) and `NOT a IS NULL` as `(NOT a) IS NULL` (which is `a IS NULL`). Such a NOT followed by a
  comparison is refused here, with the two parenthesised spellings in the message, so that every
  expression accepted here selects what RocketMQ selects.
- A decimal literal of 0 (`0.0`) is accepted; RocketMQ refuses it (its "less than Double.MIN_VALUE" check).
  So is a `--` comment that ends the text without a line break (RocketMQ's needs one).
- `!=`, `==`, `&&`, `||` and double quotes are refused with the SQL92 spelling in the message.

The checks RocketMQ makes while building its tree are made here too, with the column: only numbers (and
properties) are ordered with < <= > >= and BETWEEN, NULL is never compared with = or <> (IS NULL is),
TRUE/FALSE cannot be equated with a non-boolean literal, IN needs a property on its left, BETWEEN's
literal bounds must be in order, and AND, OR, NOT and the whole expression need conditions (a property
counts as one; a number or string does not).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tidemark.common.sql92_eval import (
    BOOLEAN_NODES,
    And,
    Between,
    Compare,
    In,
    IsNull,
    Like,
    Literal,
    Long,
    Negate,
    Node,
    Not,
    Or,
    Property,
    StringTest,
    compile_node,
)

__all__ = ["And", "Between", "Compare", "In", "IsNull", "Like", "Literal", "Long", "Negate", "Node", "Not", "Or",
           "Property", "Sql92Error", "Sql92Filter", "StringTest", "compile_sql92", "format_sql92", "parse_sql92"]

INT_MAX, LONG_MAX = 2**31 - 1, 2**63 - 1
# Parentheses, NOT and signs nested deeper than this are refused (the parser and the evaluator recurse).
MAX_NESTING = 50
# Trees deeper than this are refused (compiling and evaluating recurse over the tree).
MAX_DEPTH = 200
KEYWORDS = frozenset({"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS", "CONTAINS", "STARTSWITH",
                      "ENDSWITH"})
STRING_TESTS = ("CONTAINS", "STARTSWITH", "ENDSWITH")
ORDERING = (">", ">=", "<", "<=")


class Sql92Error(ValueError):
    """A bad SQL92 expression: `column` (1-based; `line` too when the text has several) and what was expected."""

    def __init__(self, expression: str, position: int, reason: str) -> None:
        line = expression.count("\n", 0, position) + 1
        column = position - (expression.rfind("\n", 0, position) + 1) + 1
        where = f"line {line}, column {column}" if "\n" in expression else f"column {column}"
        shown = expression if len(expression) <= 200 else expression[:200] + "..."
        super().__init__(f'SQL92 expression "{shown}" at {where}: {reason}')
        self.expression, self.line, self.column, self.reason = expression, line, column, reason


# ---- tokens --------------------------------------------------------------------------------------------

_TOKEN = re.compile(r"""
    (?P<space>[ \t\n\r\f]+|--[^\n\r]*(?:\r\n|\n|\r|$)|/\*.*?\*/)
  | (?P<decimal>(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+)
  | (?P<integer>(?:0|[1-9][0-9]*)[lL]?)
  | (?P<string>'(?:''|[^'])*')
  | (?P<name>[A-Za-z_$][A-Za-z0-9_$]*)
  | (?P<bad>!=|==|&&|\|\||"|/\*|')
  | (?P<op><>|<=|>=|=|<|>|\(|\)|,|\+|-)
""", re.VERBOSE | re.DOTALL)
_BAD_HINTS = {"!=": "'!=' is not SQL92; use '<>'", "==": "'==' is not SQL92; use '='", "&&": "'&&' is not SQL92; use AND",
              "||": "'||' is not SQL92; use OR", '"': "strings are in single quotes",
              "/*": "the comment is not closed with */", "'": "the string is not closed with ' (write '' for a quote)"}


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "keyword", "name", "integer", "decimal", "string", "op", "end"
    text: str  # keywords upper-cased, strings decoded
    pos: int


def _tokens(text: str) -> list[_Token]:
    out, pos, n = [], 0, len(text)
    while pos < n:
        m = _TOKEN.match(text, pos)
        if m is None:
            raise Sql92Error(text, pos, f"unexpected character {text[pos]!r}")
        kind, raw = m.lastgroup, m.group()
        if kind == "bad":
            raise Sql92Error(text, pos, _BAD_HINTS[raw])
        if kind == "name" and raw.upper() in KEYWORDS:
            out.append(_Token("keyword", raw.upper(), pos))
        elif kind == "string":
            out.append(_Token("string", raw[1:-1].replace("''", "'"), pos))
        elif kind != "space":
            out.append(_Token(kind, raw, pos))
        pos = m.end()
    out.append(_Token("end", "", n))
    return out


# ---- parsing -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Parsed:
    node: Node
    pos: int  # where the operand starts
    # Where an unparenthesised NOT starts whose operand ends this one (see the module's docstring), or None.
    bare_not: int | None = None


def _is_condition(node: Node) -> bool:
    return isinstance(node, BOOLEAN_NODES) or isinstance(node, Property) or (
        isinstance(node, Literal) and (node.value is None or type(node.value) is bool))


def _describe(node: Node) -> str:
    if isinstance(node, Literal):
        v = node.value
        kind = "string" if type(v) is str else "number" if type(v) in (int, Long, float) else "literal"
        return f"the {kind} {format_sql92(node)}"
    return format_sql92(node)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.i = 0
        self.depth = 0

    # -- helpers --
    @property
    def tok(self) -> _Token:
        return self.tokens[self.i]

    def at(self, kind: str, *texts: str) -> bool:
        t = self.tok
        return t.kind == kind and (not texts or t.text in texts)

    def at_word(self, word: str, ahead: int = 0) -> bool:
        """A keyword, or a contextual one (LIKE, ESCAPE) spelt as a name."""
        t = self.tokens[min(self.i + ahead, len(self.tokens) - 1)]
        return t.kind in ("keyword", "name") and t.text.upper() == word

    def take(self) -> _Token:
        t = self.tok
        self.i += 1
        return t

    def fail(self, expected: str, token: _Token | None = None) -> Sql92Error:
        t = token or self.tok
        got = "" if t.kind == "end" else f", got {t.text!r}" if t.kind != "string" else f", got the string '{t.text}'"
        return Sql92Error(self.text, t.pos, f"expected {expected}{got}")

    def expect(self, kind: str, text: str, expected: str) -> _Token:
        if not self.at(kind, text):
            raise self.fail(expected)
        return self.take()

    def string(self, what: str) -> str:
        if not self.at("string"):
            raise self.fail(f"a string literal in single quotes {what}")
        return self.take().text

    def nest(self, pos: int) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise Sql92Error(self.text, pos, f"expressions nested more than {MAX_NESTING} deep are not supported")

    # -- checks (RocketMQ's, made while it builds its tree) --
    def condition(self, p: _Parsed, where: str) -> Node:
        if not _is_condition(p.node):
            raise Sql92Error(self.text, p.pos, f"expected a condition {where}, got {_describe(p.node)}")
        return p.node

    def orderable(self, p: _Parsed, op: str) -> Node:
        node = p.node
        if isinstance(node, Literal):
            refused = type(node.value) not in (int, Long, float)  # strings, booleans, NULL
        else:
            refused = isinstance(node, BOOLEAN_NODES)  # conditions; properties and negations are fine
        if refused:
            raise Sql92Error(self.text, p.pos, f"{_describe(node)} cannot be compared with {op}; only numbers "
                                               f"and properties can")
        return node

    def equatable(self, p: _Parsed, op: str) -> Node:
        if isinstance(p.node, Literal) and p.node.value is None:
            raise Sql92Error(self.text, p.pos, f"NULL cannot be compared with {op}; use IS NULL or IS NOT NULL")
        return p.node

    def no_bare_not(self, left: _Parsed) -> None:
        if left.bare_not is not None:
            op, at = self.tok.text.upper(), self.tok.pos
            negation = self.text[left.bare_not:at].strip()
            operand = negation[3:].strip()
            raise Sql92Error(self.text, at, f"{op} after {negation}: RocketMQ reads this as ({negation}) {op} ...; "
                                            f"write NOT ({operand} {op} ...) to negate the comparison, or "
                                            f"({negation}) {op} ... to keep RocketMQ's reading")

    # -- grammar --
    def parse(self) -> Node:
        if self.at("end"):
            raise self.fail("a condition")
        p = self.or_()
        if not self.at("end"):
            raise self.fail("an operator, AND, OR or the end of the expression")
        return self.condition(p, "for the whole expression")

    def or_(self) -> _Parsed:
        return self.chain(self.and_, "OR", Or)

    def and_(self) -> _Parsed:
        return self.chain(self.equality, "AND", And)

    def chain(self, operand: Callable[[], _Parsed], word: str, cls: type) -> _Parsed:
        first = operand()
        if not self.at("keyword", word):
            return first
        parts = [self.condition(first, f"before {word}")]
        while self.at("keyword", word):
            self.take()
            nxt = operand()
            node = self.condition(nxt, f"after {word}")
            parts.extend(node.operands if isinstance(node, cls) else (node,))
        if isinstance(first.node, cls):
            parts[:1] = first.node.operands
        return _Parsed(cls(tuple(parts)), first.pos)

    def equality(self) -> _Parsed:
        left = self.comparison()
        while True:
            if self.at("op", "=", "<>"):
                self.no_bare_not(left)
                op = self.take().text
                right = self.comparison()
                a, b = self.equatable(left, op), self.equatable(right, op)
                if isinstance(a, Literal) and isinstance(b, Literal) and _is_condition(a) and not _is_condition(b):
                    raise Sql92Error(self.text, left.pos, f"{_describe(a)} cannot be compared with {_describe(b)}")
                left = _Parsed(Compare(op, a, b), left.pos, right.bare_not)
            elif self.at("keyword", "IS"):
                self.no_bare_not(left)
                self.take()
                negated = self.at("keyword", "NOT") and bool(self.take())
                self.expect("keyword", "NULL", "NULL after IS" if not negated else "NULL after IS NOT")
                left = _Parsed(IsNull(left.node, negated), left.pos)
            else:
                return left

    def comparison(self) -> _Parsed:
        left = self.unary()
        while True:
            negated = self.at("keyword", "NOT") and any(self.at_word(w, 1) for w in (*STRING_TESTS, "BETWEEN", "IN",
                                                                                       "LIKE"))
            if not (negated or self.at("op", *ORDERING) or self.at("keyword", "BETWEEN", "IN", *STRING_TESTS)
                    or self.at_word("LIKE")):
                return left
            self.no_bare_not(left)
            if negated:
                self.take()
            op = self.take().text.upper()
            if op in ORDERING:
                right = self.unary()
                node: Node = Compare(op, self.orderable(left, op), self.orderable(right, op))
                left = _Parsed(node, left.pos, right.bare_not)
                continue
            if op == "BETWEEN":
                low = self.unary()
                self.expect("keyword", "AND", "AND between BETWEEN's bounds")
                high = self.unary()
                for p in (left, low, high):
                    self.orderable(p, "BETWEEN")
                self.check_bounds(low, high)
                node = Between(left.node, low.node, high.node, negated)
            elif op == "IN":
                if not isinstance(left.node, Property):
                    raise Sql92Error(self.text, left.pos, f"IN needs a property on its left, got {_describe(left.node)}")
                self.expect("op", "(", "'(' after IN")
                values = [self.string("in IN's list")]
                while self.at("op", ","):
                    self.take()
                    values.append(self.string("in IN's list"))
                self.expect("op", ")", "',' or ')' in IN's list")
                node = In(left.node, tuple(values), negated)
            elif op == "LIKE":
                pattern = self.string("after LIKE")
                escape = None
                if self.at_word("ESCAPE"):
                    token = self.take()
                    escape = self.string("after ESCAPE")
                    if len(escape) != 1:
                        raise Sql92Error(self.text, token.pos, f"ESCAPE takes one character, got {escape!r}")
                node = Like(left.node, pattern, escape, negated)
            else:
                node = StringTest(op, left.node, self.string(f"after {op}"), negated)
            left = _Parsed(node, left.pos)

    def check_bounds(self, low: _Parsed, high: _Parsed) -> None:
        lo, hi = low.node, high.node
        if isinstance(lo, Literal) and isinstance(hi, Literal) and hi.value < lo.value:
            raise Sql92Error(self.text, low.pos, f"BETWEEN's lower bound {format_sql92(lo)} is above its upper "
                                                 f"bound {format_sql92(hi)}")

    def unary(self) -> _Parsed:
        t = self.tok
        if self.at("op", "+", "-") or self.at("keyword", "NOT"):
            self.take()
            self.nest(t.pos)
            inner = self.unary()
            self.depth -= 1
            if t.text == "+":
                return _Parsed(inner.node, t.pos, inner.bare_not)
            if t.text == "-":
                return _Parsed(Negate(inner.node), t.pos, inner.bare_not)
            return _Parsed(Not(self.condition(inner, "after NOT")), t.pos, t.pos)
        return self.primary()

    def primary(self) -> _Parsed:
        t = self.tok
        if t.kind == "string":
            self.take()
            return _Parsed(Literal(t.text), t.pos)
        if t.kind == "integer":
            self.take()
            digits = t.text.rstrip("lL")
            value = int(digits) if len(digits) <= 19 else LONG_MAX + 1
            if value > LONG_MAX:
                raise Sql92Error(self.text, t.pos, f"integer {t.text} is out of range (at most {LONG_MAX})")
            return _Parsed(Literal(value if value <= INT_MAX else Long(value)), t.pos)
        if t.kind == "decimal":
            self.take()
            value = float(t.text)
            if value == float("inf"):
                raise Sql92Error(self.text, t.pos, f"decimal {t.text[:40]} is out of range")
            return _Parsed(Literal(value), t.pos)
        if t.kind == "keyword" and t.text in ("TRUE", "FALSE", "NULL"):
            self.take()
            return _Parsed(Literal({"TRUE": True, "FALSE": False, "NULL": None}[t.text]), t.pos)
        if t.kind == "name":
            self.take()
            return _Parsed(Property(t.text), t.pos)
        if self.at("op", "("):
            self.take()
            self.nest(t.pos)
            inner = self.or_()
            self.depth -= 1
            self.expect("op", ")", "')'" if not self.at("end") else f"')' to close the '(' at column {t.pos + 1}")
            return _Parsed(inner.node, t.pos)
        raise self.fail("a value")


def parse_sql92(text: str) -> Node:
    """The tree of an SQL92 filter expression; Sql92Error (a ValueError) says where and what is wrong."""
    if not isinstance(text, str):
        raise TypeError(f"an SQL92 expression is a str, got {type(text).__name__}")
    try:
        tree = _Parser(text).parse()
        deep = _depth(tree) > MAX_DEPTH
    except RecursionError:  # a chain like a = a = ... = a nests deeper than Python's stack (or its messages do)
        deep = True
    if deep:
        raise Sql92Error(text, 0, f"the expression's tree is more than {MAX_DEPTH} levels deep")
    return tree


def _depth(tree: Node) -> int:
    """How deep a tree is (without recursion: chains like a = b = c = ... are built without it too)."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        for field in getattr(node, "__slots__", ()):
            child = getattr(node, field)
            for c in child if isinstance(child, tuple) else (child,):
                if isinstance(c, (*BOOLEAN_NODES, Negate)):
                    stack.append((c, depth + 1))
    return deepest


# ---- printing ------------------------------------------------------------------------------------------


def format_sql92(node: Node) -> str:
    """Text that parses back to the same tree (canonical spacing, keywords upper-case)."""
    if isinstance(node, Property):
        return node.name
    if isinstance(node, Literal):
        v = node.value
        if v is None or type(v) is bool:
            return {None: "NULL", True: "TRUE", False: "FALSE"}[v]
        if type(v) is str:
            return "'" + v.replace("'", "''") + "'"
        return repr(v) if type(v) is float else str(int(v))
    if isinstance(node, Negate):
        inner = _operand(node.operand)
        return f"-({inner})" if inner.startswith("-") else f"-{inner}"
    if isinstance(node, Not):
        return f"NOT {_operand(node.operand)}"
    if isinstance(node, And | Or):
        word = " AND " if isinstance(node, And) else " OR "
        return word.join(f"({format_sql92(o)})" if isinstance(o, Or) else format_sql92(o) for o in node.operands)
    no = "NOT " if getattr(node, "negated", False) else ""
    if isinstance(node, Compare):
        return f"{_operand(node.left)} {node.op} {_operand(node.right)}"
    if isinstance(node, IsNull):
        return f"{_operand(node.operand)} IS {no}NULL"
    if isinstance(node, Between):
        return f"{_operand(node.operand)} {no}BETWEEN {_operand(node.low)} AND {_operand(node.high)}"
    if isinstance(node, In):
        return f"{node.property.name} {no}IN ({', '.join(format_sql92(Literal(v)) for v in node.values)})"
    if isinstance(node, StringTest):
        return f"{_operand(node.operand)} {no}{node.op} {format_sql92(Literal(node.text))}"
    if isinstance(node, Like):
        escape = "" if node.escape is None else f" ESCAPE {format_sql92(Literal(node.escape))}"
        return f"{_operand(node.operand)} {no}LIKE {format_sql92(Literal(node.pattern))}{escape}"
    raise TypeError(f"not an SQL92 node: {node!r}")


def _operand(node: Node) -> str:
    """An operand of a comparison or of NOT / minus: values bare, conditions in parentheses."""
    text = format_sql92(node)
    return text if isinstance(node, Property | Literal | Negate) else f"({text})"


# ---- compiled filters ----------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, slots=True)
class Sql92Filter:
    """A compiled SQL92 subscription: `matches(properties)` is RocketMQ's verdict for one message (an
    expression that is unknown or fails on the message's values does not match). `properties` needs only
    `get(name)` (a dict, or common.records.RawProperties over a record's encoded properties)."""

    expression: str
    tree: Node
    # The compiled expression itself (matches without a call in between, for the scans).
    matches_properties: Callable[[Mapping[str, str]], bool]

    # What it shares with common.protocol.TagExpression, so readers of a queue can take either.
    expression_type = "SQL92"
    matches_all = False
    code_filter = None  # no consume-queue tags codes to pre-filter by: every entry's properties are read

    def matches(self, properties: Mapping[str, str]) -> bool:
        return self.matches_properties(properties)

    def matches_code(self, code: int) -> bool:
        return True


@functools.lru_cache(maxsize=1024)
def compile_sql92(expression: str) -> Sql92Filter:
    """Parse and compile once; memoised by text, as every pull and receive carries its subscription."""
    tree = parse_sql92(expression)
    return Sql92Filter(expression, tree, compile_node(tree))
