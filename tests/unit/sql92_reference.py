"""A reference for common/sql92.py's property tests (tests/unit/test_sql92.py): an evaluator written from
RocketMQ's Java code (filter/src/main/java/org/apache/rocketmq/filter/expression/), independently of the
module, a printer with random spelling, and hypothesis strategies for trees RocketMQ's parser accepts."""

from __future__ import annotations

import math
import unicodedata

from hypothesis import strategies as st

# ---- the reference evaluator ----
# Nodes are tuples: ("prop", name), ("lit", jvalue), ("neg", x), ("not", x), ("and", l, r), ("or", l, r),
# ("cmp", op, l, r), ("between", negated, x, lo, hi), ("in", negated, name, values), ("isnull", negated, x),
# ("strtest", op, negated, x, text), ("like", negated, x, pattern, escape).
# Java values are ("Integer" | "Long" | "Double" | "String" | "Boolean", value); NULL is None.


class Thrown(Exception):
    """The Java evaluation threw."""


def java_int(text, bits):
    body = text[1:] if text[:1] in "+-" else text
    if not body or any(unicodedata.decimal(c, None) is None for c in body):
        raise Thrown
    value = int("".join(str(unicodedata.decimal(c)) for c in body)) * (-1 if text[:1] == "-" else 1)
    if not -2 ** (bits - 1) <= value <= 2 ** (bits - 1) - 1:
        raise Thrown
    return value


def java_double(text):
    t = text
    while t and ord(t[0]) <= 32:
        t = t[1:]
    while t and ord(t[-1]) <= 32:
        t = t[:-1]
    sign, body = (-1.0, t[1:]) if t[:1] == "-" else (1.0, t[1:] if t[:1] == "+" else t)
    if body == "NaN":
        return math.nan
    if body == "Infinity":
        return sign * math.inf
    if body[:2].lower() == "0x":
        if "p" not in body.lower():
            raise Thrown
        return sign * float.fromhex(body.rstrip("fFdD"))
    if body[-1:] in ("f", "F", "d", "D"):
        body = body[:-1]
    mantissa, _, exponent = body.lower().partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = set("0123456789")
    ok = (whole or fraction) and set(whole) <= digits and set(fraction) <= digits and mantissa.count(".") <= 1
    if "e" in body.lower():
        e = exponent[1:] if exponent[:1] in "+-" else exponent
        ok = ok and e and set(e) <= digits
    if not ok:
        raise Thrown
    return sign * float(body)


def double_compare(x, y):
    if math.isnan(x) or math.isnan(y):
        return int(math.isnan(x)) - int(math.isnan(y))
    if x != y:
        return -1 if x < y else 1
    if x == 0:
        sx, sy = math.copysign(1, x), math.copysign(1, y)
        return 0 if sx == sy else (-1 if sx < sy else 1)
    return 0


def java_compare(lv, rv):
    """ComparisonExpression.__compare, with convertStringExpressions on."""
    (lc, lx), (rc, rx) = lv, rv
    if lc != rc:
        if lc == "Boolean":
            if rc == "String":
                raise Thrown  # (String) on a Boolean
            return -1
        if lc == "Integer":
            table = {"Long": lambda: (("Long", lx), rv), "Double": lambda: (("Double", float(lx)), rv),
                     "String": lambda: (lv, ("Integer", java_int(rx, 32)))}
        elif lc == "Long":
            table = {"Integer": lambda: (lv, ("Long", rx)), "Double": lambda: (("Double", float(lx)), rv),
                     "String": lambda: (lv, ("Long", java_int(rx, 64)))}
        elif lc == "Double":
            table = {"Integer": lambda: (lv, ("Double", float(rx))), "Long": lambda: (lv, ("Double", float(rx))),
                     "String": lambda: (lv, ("Double", java_double(rx)))}
        else:
            table = {"Boolean": lambda: (("Boolean", lx.lower() == "true"), rv),
                     "Integer": lambda: (("Integer", java_int(lx, 32)), rv),
                     "Long": lambda: (("Long", java_int(lx, 64)), rv),
                     "Double": lambda: (("Double", java_double(lx)), rv)}
        if rc not in table:
            return -1
        (lc, lx), (rc, rx) = table[rc]()
    if lc == "Double":
        return double_compare(lx, rx)
    return (lx > rx) - (lx < rx)


def ref_value(node, props):
    kind = node[0]
    if kind == "prop":
        return None if node[1] not in props else ("String", props[node[1]])
    if kind == "lit":
        return node[1]
    if kind == "neg":
        v = ref_value(node[1], props)
        return (v[0], -v[1]) if v is not None and v[0] in ("Integer", "Long", "Double") else None
    b = ref_bool(node, props)
    return None if b is None else ("Boolean", b)


def ref_bool(node, props):
    kind = node[0]
    if kind in ("prop", "lit", "neg"):
        v = ref_value(node, props)
        return None if v is None else (v[1] if v[0] == "Boolean" else False)
    if kind == "not":
        r = ref_bool(node[1], props)
        return None if r is None else not r
    if kind in ("and", "or"):
        decisive = kind == "or"
        left = ref_bool(node[1], props)
        if left is decisive:
            return decisive
        right = ref_bool(node[2], props)
        if right is decisive:
            return decisive
        return None if left is None or right is None else not decisive
    if kind == "cmp":
        _, op, left, right = node
        if op == "<>":
            return ref_bool(("not", ("cmp", "=", left, right)), props)
        lv, rv = ref_value(left, props), ref_value(right, props)
        if op == "=":
            if lv is None or rv is None:
                return True if lv is None and rv is None else (None if lv is None else False)
            return java_compare(lv, rv) == 0
        if lv is None or rv is None:
            return None
        if lv[0] == rv[0] == "String":
            c = double_compare(java_double(lv[1]), java_double(rv[1]))
        else:
            c = java_compare(lv, rv)
        return {">": c > 0, ">=": c >= 0, "<": c < 0, "<=": c <= 0}[op]
    if kind == "between":
        _, negated, x, lo, hi = node
        if negated:
            return ref_bool(("or", ("cmp", "<", x, lo), ("cmp", ">", x, hi)), props)
        return ref_bool(("and", ("cmp", ">=", x, lo), ("cmp", "<=", x, hi)), props)
    if kind == "in":
        _, negated, name, values = node
        v = ref_value(("prop", name), props)
        return None if v is None else (v[1] in values) != negated
    if kind == "isnull":
        return (ref_value(node[2], props) is None) != node[1]
    if kind == "strtest":
        _, op, negated, x, text = node
        if text == "":
            return False
        v = ref_value(x, props)
        if v is None or v[0] != "String":
            return False
        hit = {"CONTAINS": text in v[1], "STARTSWITH": v[1].startswith(text), "ENDSWITH": v[1].endswith(text)}[op]
        return hit != negated
    if kind == "like":
        _, negated, x, pattern, escape = node
        v = ref_value(x, props)
        result = None if v is None else (v[0] == "String" and like_match(v[1], pattern, escape))
        return result if result is None or not negated else not result
    raise AssertionError(node)


def like_match(text, pattern, escape):
    """Matching by hand (no regular expression): % any run, _ one character."""
    tokens, i = [], 0
    while i < len(pattern):
        if pattern[i] == escape and i + 1 < len(pattern) and pattern[i + 1] in "%_" + escape:
            tokens.append(("char", pattern[i + 1]))
            i += 2
            continue
        tokens.append({"%": ("any", None), "_": ("one", None)}.get(pattern[i], ("char", pattern[i])))
        i += 1
    reachable = {0}
    for kind, c in tokens:
        after = set()
        for pos in reachable:
            if kind == "any":
                after.update(range(pos, len(text) + 1))
            elif pos < len(text) and (kind == "one" or text[pos] == c):
                after.add(pos + 1)
        reachable = after
    return len(text) in reachable


def ref_matches(node, props):
    try:
        return ref_bool(node, props) is True
    except Thrown:
        return False


def ref_valid(node):
    """What RocketMQ's parser refuses among the trees generated here: BETWEEN's literal bounds out of order,
    NULL = x, and TRUE/FALSE = a non-boolean literal."""
    if node[0] == "between" and node[3][0] == node[4][0] == "lit" and java_compare(node[4][1], node[3][1]) < 0:
        return False
    if node[0] == "cmp" and node[1] in ("=", "<>") and ("lit", None) in (node[2], node[3]):
        return False
    if node[0] == "cmp" and node[1] in ("=", "<>") and node[2][0] == node[3][0] == "lit" \
            and node[2][1][0] == "Boolean" and node[3][1][0] != "Boolean":
        return False
    return all(ref_valid(c) for c in node[1:] if isinstance(c, tuple) and c and isinstance(c[0], str) and c[0] in
               ("prop", "lit", "neg", "not", "and", "or", "cmp", "between", "in", "isnull", "strtest", "like"))


# ---- printing the reference's trees, with random spelling ----

NAMES = ["a", "b", "c", "TAGS"]
STRINGS = ["", "x", "y", "5", "true", "it''s"]
VALUES = ["0", "1", "5", "-3", "+7", "2.5", "1e3", "abc", "", "true", "TRUE", "false", "NaN", "-0", "0.0", " 5",
          "2147483648", "9223372036854775808", "\u0663", "x", "y", "it's", "5f", "0x1p3", "ab%", "a_c"]


def spell(draw, word):
    return "".join(c.upper() if draw(st.booleans()) else c.lower() for c in word)


def text_of(draw, node, wrap=False):
    kind = node[0]
    if kind == "prop":
        out = node[1]
    elif kind == "lit":
        jv = node[1]
        if jv is None:
            out = spell(draw, "null")
        elif jv[0] == "Boolean":
            out = spell(draw, "true" if jv[1] else "false")
        elif jv[0] == "String":
            out = "'" + jv[1].replace("'", "''") + "'"
        elif jv[0] == "Double":
            out = draw(st.sampled_from(DOUBLE_SPELLINGS[jv[1]]))
        else:
            out = str(jv[1]) + draw(st.sampled_from(["", "", "L", "l"]))
    elif kind == "neg":
        out = "-(" + text_of(draw, node[1]) + ")" if node[1][0] == "neg" else "-" + text_of(draw, node[1], True)
    elif kind == "not":
        out = spell(draw, "not") + " " + text_of(draw, node[1], True)
    elif kind in ("and", "or"):
        out = text_of(draw, node[1], True) + f" {spell(draw, kind)} " + text_of(draw, node[2], True)
    elif kind == "cmp":
        out = text_of(draw, node[2], True) + draw(st.sampled_from([" ", ""])) + node[1] + " " + text_of(
            draw, node[3], True)
    elif kind == "between":
        _, negated, x, lo, hi = node
        no = spell(draw, "not ") if negated else ""
        out = (f"{text_of(draw, x, True)} {no}{spell(draw, 'between')} {text_of(draw, lo, True)} {spell(draw, 'and')} "
               f"{text_of(draw, hi, True)}")
    elif kind == "in":
        _, negated, name, values = node
        no = spell(draw, "not ") if negated else ""
        out = f"{name} {no}{spell(draw, 'in')} (" + ",".join("'" + v.replace("'", "''") + "'" for v in values) + ")"
    elif kind == "isnull":
        out = f"{text_of(draw, node[2], True)} {spell(draw, 'is')} " + (spell(draw, "not ") if node[1] else "") + \
            spell(draw, "null")
    elif kind == "strtest":
        _, op, negated, x, text = node
        out = f"{text_of(draw, x, True)} " + (spell(draw, "not ") if negated else "") + spell(draw, op) + \
            " '" + text.replace("'", "''") + "'"
    else:
        _, negated, x, pattern, escape = node
        out = f"{text_of(draw, x, True)} " + (spell(draw, "not ") if negated else "") + spell(draw, "like") + \
            " '" + pattern.replace("'", "''") + "'" + ("" if escape is None else f" {spell(draw, 'escape')} '{escape}'")
    atom = kind in ("prop", "lit") or (kind == "neg" and not wrap)
    if wrap and not atom or draw(st.integers(0, 9)) == 0:
        out = "(" + out + ")"
    return out


DOUBLE_SPELLINGS = {0.5: ["0.5", ".5", "5e-1", "5.0E-1"], 2.5: ["2.5", "25e-1", "2.50"], 1000.0: ["1e3", "1000.",
                                                                                                 "1.0E+3"],
                    0.0: ["0.0", "0.", "0e0"]}
NUMBERS = st.sampled_from([("Integer", 0), ("Integer", 1), ("Integer", 5), ("Integer", 2147483647),
                           ("Long", 2147483648), ("Long", 9223372036854775807), ("Double", 0.5), ("Double", 2.5),
                           ("Double", 1000.0), ("Double", 0.0)])


def values(depth):
    """Value operands: properties, literals, negations."""
    base = st.one_of(st.sampled_from(NAMES).map(lambda n: ("prop", n)), NUMBERS.map(lambda v: ("lit", v)),
                     st.sampled_from(STRINGS).map(lambda s: ("lit", ("String", s))),
                     st.booleans().map(lambda b: ("lit", ("Boolean", b))))
    if depth <= 0:
        return base
    return st.one_of(base, values(depth - 1).map(lambda v: ("neg", v)))


def orderables(depth):
    plain = st.one_of(st.sampled_from(NAMES).map(lambda n: ("prop", n)), NUMBERS.map(lambda v: ("lit", v)))
    return st.one_of(plain, values(depth).map(lambda v: ("neg", v)))


def conditions(depth):
    leaves = st.one_of(
        st.sampled_from(NAMES).map(lambda n: ("prop", n)),
        st.sampled_from([True, False, None]).map(lambda b: ("lit", None if b is None else ("Boolean", b))),
        st.tuples(st.sampled_from([">", ">=", "<", "<="]), orderables(1), orderables(1)).map(lambda t: ("cmp", *t)),
        st.tuples(st.booleans(), orderables(1), orderables(0), orderables(0)).map(lambda t: ("between", *t)),
        st.tuples(st.booleans(), st.sampled_from(NAMES), st.lists(st.sampled_from(STRINGS + ["it's"]), min_size=1,
                                                                  max_size=3).map(tuple)).map(lambda t: ("in", *t)),
        st.tuples(st.booleans(), values(1)).map(lambda t: ("isnull", *t)),
        st.tuples(st.sampled_from(["CONTAINS", "STARTSWITH", "ENDSWITH"]), st.booleans(), values(1),
                  st.sampled_from(STRINGS)).map(lambda t: ("strtest", *t)),
        st.tuples(st.booleans(), values(0), st.sampled_from(["ab%", "a_c", "%", "_", "x", "%5%", "a!%", "a!!"]),
                  st.sampled_from([None, "!"])).map(lambda t: ("like", *t)),
    )
    equal_operands = values(1)
    if depth <= 0:
        return st.one_of(leaves, st.tuples(st.sampled_from(["=", "<>"]), equal_operands, equal_operands).map(
            lambda t: ("cmp", *t)))
    inner = conditions(depth - 1)
    return st.one_of(
        leaves,
        st.tuples(st.sampled_from(["=", "<>"]), st.one_of(equal_operands, inner),
                  st.one_of(equal_operands, inner)).map(lambda t: ("cmp", *t)),
        inner.map(lambda c: ("not", c)),
        st.tuples(st.sampled_from(["and", "or"]), inner, inner).map(lambda t: (t[0], t[1], t[2])),
        st.tuples(st.booleans(), inner).map(lambda t: ("isnull", *t)),
    )


PROPERTIES = st.dictionaries(st.sampled_from(NAMES), st.sampled_from(VALUES), max_size=4)
