"""The SQL92 filter's tree and what it means for one message: RocketMQ's semantics, compiled to closures.

Parsing and printing are in `sql92.py`; this module holds the node classes and `compile_node`, which turns a
tree into `matches(properties) -> bool` once, so that a scan evaluates each message without walking the
tree. Pure, no I/O. The rules, as RocketMQ's filter module evaluates them (filter/src/main/java/org/apache/
rocketmq/filter/expression/, with string conversion on, as SelectorParser.parse sets it):

- Property values are strings; a missing property is NULL. Literals are strings, booleans, NULL, integers
  (Java Integer when they fit 32 bits, else Long) and decimals (Double).
- Conditions have three values: true, false and unknown (Java's null). AND is false when an operand is
  false, else unknown when one is unknown; OR is true when one is true, else unknown when one is unknown;
  NOT of unknown is unknown (LogicExpression, UnaryExpression.createNOT). A message matches only when the
  whole expression is true (ExpressionMessageFilter.isMatchedByCommitLog).
- `x = y` (ComparisonExpression.doCreateEqual): both NULL is true; a NULL left side is unknown; a NULL right
  side is false; else the values are compared after conversion. `x <> y` is NOT (x = y). IS NULL is true
  exactly when the value is NULL (it never is unknown), IS NOT NULL is its negation.
- Conversion when the two sides differ in type (ComparisonExpression.__compare): a string meets a number
  by being parsed as that number's Java type (Integer.valueOf, Long.valueOf, Double.valueOf: so
  `a > 5` fails on a = '5.5', `a > 5.0` does not), and a boolean by Boolean.valueOf ('true' in any case
  is TRUE, anything else FALSE); an Integer meets a Long or a Double by widening. A string that does not
  parse makes the evaluation fail; a boolean compared with a number is simply unequal and smaller.
- `<`, `<=`, `>`, `>=` (ComparisonExpression.evaluate): unknown when a side is NULL; two strings (two
  properties) are both parsed as doubles. Decimals compare as Java's Double.compareTo does (NaN above
  everything and equal to itself, -0.0 below 0.0).
- `x BETWEEN a AND b` is `x >= a AND x <= b`; NOT BETWEEN is `x < a OR x > b`.
- `p IN ('a', ...)`: unknown when p is NULL, else whether the string is listed (NOT IN: not listed).
- CONTAINS / STARTSWITH / ENDSWITH (and their NOT forms): false when the value is NULL or not a string or
  the searched text is empty; else the test (or its negation).
- LIKE (ActiveMQ's): unknown on NULL, false on a non-string, else a whole-string match where % is any run
  and _ any one character (the ESCAPE character makes the next %, _ or itself literal); NOT LIKE is NOT.
- A property where a condition is needed (`a AND b`) is unknown when missing, else false (a string is not
  a Boolean: UnaryExpression.createBooleanCast). `-x` negates a number, and is NULL for anything else.
- A failure anywhere (a string that does not parse, RocketMQ's ClassCastException when a boolean
  condition meets a string) makes the message not match: RocketMQ logs the exception and filters the
  message out. Evaluation is left to right and stops as RocketMQ's does (AND at a false operand, OR at a
  true one), so a later operand that would fail is not reached.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

__all__ = ["BOOLEAN_NODES", "And", "Between", "Compare", "In", "IsNull", "Like", "Literal", "Long", "Negate", "Node",
           "Not", "Or", "Property", "StringTest", "compile_node", "like_matcher"]


class Long(int):
    """An integer literal that Java holds as a Long (it does not fit 32 bits): a string meeting it is parsed
    with Long.valueOf instead of Integer.valueOf."""

    def __neg__(self) -> Long:
        return Long(-int(self))

    def __repr__(self) -> str:
        return f"Long({int(self)})"


# ---- the tree ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Property:
    name: str


@dataclass(frozen=True, slots=True, eq=False)
class Literal:
    value: None | bool | int | float | str  # int may be a Long

    def _key(self) -> tuple[type, Any]:
        return type(self.value), self.value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Literal) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


@dataclass(frozen=True, slots=True)
class Negate:
    operand: Node


@dataclass(frozen=True, slots=True)
class Not:
    operand: Node


@dataclass(frozen=True, slots=True)
class And:
    operands: tuple[Node, ...]  # two or more, none an And (chains are flattened: AND is associative here)


@dataclass(frozen=True, slots=True)
class Or:
    operands: tuple[Node, ...]  # two or more, none an Or


@dataclass(frozen=True, slots=True)
class Compare:
    op: str  # = <> > >= < <=
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Between:
    operand: Node
    low: Node
    high: Node
    negated: bool = False


@dataclass(frozen=True, slots=True)
class In:
    property: Property
    values: tuple[str, ...]
    negated: bool = False


@dataclass(frozen=True, slots=True)
class IsNull:
    operand: Node
    negated: bool = False


@dataclass(frozen=True, slots=True)
class StringTest:
    op: str  # CONTAINS STARTSWITH ENDSWITH
    operand: Node
    text: str
    negated: bool = False


@dataclass(frozen=True, slots=True)
class Like:
    operand: Node
    pattern: str
    escape: str | None = None
    negated: bool = False


Node: TypeAlias = Property | Literal | Negate | Not | And | Or | Compare | Between | In | IsNull | StringTest | Like
# RocketMQ's BooleanExpressions (besides the TRUE, FALSE and NULL literals).
BOOLEAN_NODES = (Not, And, Or, Compare, Between, In, IsNull, StringTest, Like)

Props: TypeAlias = Mapping[str, str]
Cond: TypeAlias = Callable[[Props], bool | None]
Value: TypeAlias = Callable[[Props], Any]


class _Failed(Exception):
    """RocketMQ's evaluation threw (a string that does not parse as the number it meets, ...)."""


# ---- Java's conversions and comparisons ----------------------------------------------------------------

_INTEGER = re.compile(r"[+-]?\d+")  # Integer.parseInt / Long.parseLong (Character.digit takes any Nd digit)
_DOUBLE = re.compile(r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)")
_HEX_DOUBLE = re.compile(r"[+-]?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+[fFdD]?")
_JAVA_TRIM = "".join(map(chr, range(33)))  # String.trim: every char <= ' '
_PLAIN_DOUBLE = "0123456789.eE+-"


def _to_int(text: str, bits: int) -> int:
    if not (text.isascii() and text.isdigit()) and _INTEGER.fullmatch(text) is None:  # the fast test first
        raise _Failed
    try:
        value = int(text)
    except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits): out of range anyway
        raise _Failed from None
    if not -(1 << bits - 1) <= value < 1 << bits - 1:
        raise _Failed
    return value


def _to_int32(text: str) -> int:
    return _to_int(text, 32)


def _to_int64(text: str) -> int:
    return _to_int(text, 64)


def _to_double(text: str) -> float:
    """Double.valueOf: Java's literal syntax (suffix f/d allowed), NaN, Infinity, hex with a p exponent."""
    if text and not text.strip(_PLAIN_DOUBLE):  # plain digits, point, exponent, signs: what float() takes is Java's
        try:
            return float(text)
        except ValueError:
            raise _Failed from None
    t = text.strip(_JAVA_TRIM)
    if _DOUBLE.fullmatch(t) is not None:
        return float(t.rstrip("fFdD") if t[-1] in "fFdD" else t)
    if _HEX_DOUBLE.fullmatch(t) is not None:
        return float.fromhex(t.rstrip("fFdD") if t[-1] in "fFdD" else t)
    raise _Failed


def _java_bool(text: str) -> bool:
    return len(text) == 4 and text.lower() == "true"


def _dcmp(a: float, b: float) -> int:
    """Double.compare: NaN is above everything and equal to itself; -0.0 is below 0.0."""
    if a < b:
        return -1
    if a > b:
        return 1
    a_nan, b_nan = a != a, b != b
    if a_nan or b_nan:
        return a_nan - b_nan
    if a == 0.0:
        return (math.copysign(1, a) > math.copysign(1, b)) - (math.copysign(1, a) < math.copysign(1, b))
    return 0


def _icmp(a: int, b: int) -> int:
    return (a > b) - (a < b)


def _compare(left: Any, right: Any) -> int:
    """RocketMQ's __compare with string conversion on: the order of two non-NULL values, or _Failed."""
    lt, rt = type(left), type(right)
    if lt is rt:
        return _dcmp(left, right) if lt is float else _icmp(left, right)
    if lt is bool:
        if rt is str:
            raise _Failed  # RocketMQ casts the Boolean to a String: ClassCastException
        return -1
    if lt is str:
        if rt is bool:
            return _icmp(_java_bool(left), right)
        if rt is float:
            return _dcmp(_to_double(left), right)
        if rt is int or rt is Long:
            return _icmp(_to_int32(left) if rt is int else _to_int64(left), right)
        return -1
    if rt is bool:
        return -1
    if lt is float or rt is float:  # a Double and an Integer or Long: widened
        return _dcmp(float(left), float(right)) if rt is not str else _dcmp(left, _to_double(right))
    if rt is str:
        return _icmp(left, _to_int32(right) if lt is int else _to_int64(right))
    return _icmp(left, right)  # an Integer and a Long


_TESTS: dict[str, Callable[[int], bool]] = {
    "=": lambda c: c == 0, ">": lambda c: c > 0, ">=": lambda c: c >= 0, "<": lambda c: c < 0, "<=": lambda c: c <= 0}


def like_matcher(pattern: str, escape: str | None) -> Callable[[str], bool]:
    """ActiveMQ's LIKE: % any run, _ one character, the escape character making the next %, _ or itself
    literal (elsewhere it is an ordinary character). Whole-string match.

    Not one regular expression: ".*" per % backtracks, so a pattern like '%a%a%a%a%a%b' takes time that grows
    as a power of the value's length, on the broker's event loop, for every message a scan reads. Here the
    pattern is cut at each %, and the pieces (fixed length: literals and _) are placed leftmost one after the
    other, which decides a wildcard match exactly: linear searches, in C."""
    pieces: list[list[str | None]] = [[]]  # None: _ (any one character)
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == escape and i + 1 < len(pattern) and pattern[i + 1] in ("%", "_", escape):
            pieces[-1].append(pattern[i + 1])
            i += 2
            continue
        if c == "%":
            pieces.append([])
        else:
            pieces[-1].append(None if c == "_" else c)
        i += 1
    regexes = [re.compile("".join("." if t is None else re.escape(t) for t in piece), re.DOTALL) for piece in pieces]
    if len(regexes) == 1:
        return lambda v: regexes[0].fullmatch(v) is not None
    first, *middle, last = regexes
    last_len = len(pieces[-1])

    def match(v: str) -> bool:
        head = first.match(v)
        tail_at = len(v) - last_len
        if head is None or tail_at < head.end():
            return False
        pos = head.end()
        for rx in middle:  # each piece at its leftmost place, ending before the last piece
            found = rx.search(v, pos, tail_at)
            if found is None:
                return False
            pos = found.end()
        return last.fullmatch(v, tail_at) is not None
    return match


# ---- compiling -----------------------------------------------------------------------------------------


def compile_node(tree: Node) -> Callable[[Props], bool]:
    """`matches(properties)`: whether the expression is true for a message with these properties."""
    condition = _condition(tree)

    def matches(properties: Props) -> bool:
        try:
            return condition(properties) is True
        except _Failed:
            return False
    return matches


def _constant(node: Node) -> tuple[bool, Any]:
    """(True, value) when a value node is the same for every message (a literal, a negated literal)."""
    if isinstance(node, Literal):
        return True, node.value
    if isinstance(node, Negate):
        known, value = _constant(node.operand)
        if known:
            return True, -value if type(value) in (int, Long, float) else None
    return False, None


def _value(node: Node) -> Value:
    known, constant = _constant(node)
    if known:
        return lambda p: constant
    if isinstance(node, Property):
        name = node.name
        return lambda p: p.get(name)
    if isinstance(node, Negate):
        inner = _value(node.operand)

        def negate(p: Props) -> Any:
            v = inner(p)
            return -v if type(v) in (int, Long, float) else None
        return negate
    return _condition(node)


def _condition(node: Node) -> Cond:
    if isinstance(node, Property | Literal | Negate):
        value = _value(node)
        # UnaryExpression.createBooleanCast: NULL stays unknown, a non-Boolean is false.
        return lambda p: (v if type(v := value(p)) is bool else None if v is None else False)
    if isinstance(node, Not):
        inner = _condition(node.operand)
        return lambda p: None if (r := inner(p)) is None else not r
    if isinstance(node, And | Or):
        return _logic(tuple(_condition(o) for o in node.operands), stop=isinstance(node, Or))
    if isinstance(node, Compare):
        if node.op == "<>":
            return _condition(Not(Compare("=", node.left, node.right)))
        return _equal(node.left, node.right) if node.op == "=" else _ordered(node.op, node.left, node.right)
    if isinstance(node, Between):
        v, lo, hi = node.operand, node.low, node.high
        fast = _between(node)
        if fast is not None:
            return fast
        if node.negated:
            return _condition(Or((Compare("<", v, lo), Compare(">", v, hi))))
        return _condition(And((Compare(">=", v, lo), Compare("<=", v, hi))))
    if isinstance(node, IsNull):
        value, negated = _value(node.operand), node.negated
        return lambda p: (value(p) is None) != negated
    if isinstance(node, In):
        return _in(node)
    if isinstance(node, StringTest):
        return _string_test(node)
    if isinstance(node, Like):
        return _like(node)
    raise TypeError(f"not an SQL92 node: {node!r}")


def _logic(operands: tuple[Cond, ...], *, stop: bool) -> Cond:
    """AND (stop=False: a false operand decides) or OR (stop=True: a true one does), three-valued."""
    def logic(p: Props) -> bool | None:
        unknown = False
        for operand in operands:
            r = operand(p)
            if r is stop:
                return stop
            if r is None:
                unknown = True
        return None if unknown else not stop
    return logic


def _converter(constant: Any) -> Callable[[str], Any] | None:
    """How RocketMQ converts a string that meets this literal, or None when not by parsing."""
    kind = type(constant)
    return {int: _to_int32, Long: _to_int64, float: _to_double, bool: _java_bool}.get(kind)


def _equal(left: Node, right: Node) -> Cond:
    known, constant = _constant(right)
    if isinstance(left, Property) and known and constant is not None:
        name = left.name
        if type(constant) is str:
            return lambda p: None if (v := p.get(name)) is None else v == constant
        convert = _converter(constant)
        if type(constant) is float:
            return lambda p: None if (v := p.get(name)) is None else _dcmp(convert(v), constant) == 0
        return lambda p: None if (v := p.get(name)) is None else convert(v) == constant
    lv, rv = _value(left), _value(right)

    def equal(p: Props) -> bool | None:
        a, b = lv(p), rv(p)
        if a is None:
            return True if b is None else None
        if b is None:
            return False
        return _compare(a, b) == 0
    return equal


def _ordered(op: str, left: Node, right: Node) -> Cond:
    test = _TESTS[op]
    known, constant = _constant(right)
    if isinstance(left, Property) and known and type(constant) in (int, Long, float):
        name, convert = left.name, _converter(constant)
        if type(constant) is float:
            return lambda p: None if (v := p.get(name)) is None else test(_dcmp(convert(v), constant))
        return lambda p: None if (v := p.get(name)) is None else test(_icmp(convert(v), constant))
    lv, rv = _value(left), _value(right)

    def ordered(p: Props) -> bool | None:
        a = lv(p)
        if a is None:
            return None
        b = rv(p)
        if b is None:
            return None
        if type(a) is str and type(b) is str:
            return test(_dcmp(_to_double(a), _to_double(b)))
        return test(_compare(a, b))
    return ordered


def _between(node: Between) -> Cond | None:
    """A property between two numeric literals of one type: the value is converted once."""
    (known_lo, lo), (known_hi, hi) = _constant(node.low), _constant(node.high)
    if not (isinstance(node.operand, Property) and known_lo and known_hi and type(lo) is type(hi)
            and type(lo) in (int, Long, float)):
        return None
    name, convert, negated = node.operand.name, _converter(lo), node.negated
    order = _dcmp if type(lo) is float else _icmp

    def between(p: Props) -> bool | None:
        v = p.get(name)
        if v is None:
            return None
        x = convert(v)
        return (order(x, lo) < 0 or order(x, hi) > 0) if negated else (order(x, lo) >= 0 and order(x, hi) <= 0)
    return between


def _in(node: In) -> Cond:
    name, values, negated = node.property.name, frozenset(node.values), node.negated

    def member(p: Props) -> bool | None:
        v = p.get(name)
        if type(v) is not str:
            return None
        return (v in values) != negated
    return member


def _string_test(node: StringTest) -> Cond:
    value, text, negated = _value(node.operand), node.text, node.negated
    test = {"CONTAINS": lambda v: text in v, "STARTSWITH": lambda v: v.startswith(text),
            "ENDSWITH": lambda v: v.endswith(text)}[node.op]
    if not text:
        return lambda p: False

    def string_test(p: Props) -> bool:
        v = value(p)
        return type(v) is str and test(v) != negated
    return string_test


def _like(node: Like) -> Cond:
    value, matches, negated = _value(node.operand), like_matcher(node.pattern, node.escape), node.negated

    def like(p: Props) -> bool | None:
        v = value(p)
        if v is None:
            return None
        if type(v) is not str:
            return negated  # LIKE is false on a non-string, so NOT LIKE is true
        return matches(v) != negated
    return like
