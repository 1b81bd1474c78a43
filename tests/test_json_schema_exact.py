"""JSON Schema compiled exactly, or refused: the causes of wrong verdicts found on MaskBench
and the JSON-Schema-Test-Suite, one small schema each, checked against the ``jsonschema``
package; token masks checked against an oracle that shares no code with the parser (a
token is allowed iff some valid document starts with the text so far plus the token); and
the approximations ``strict=False`` reports checked against brute force.

Every schema here has a finite set of valid documents over a small universe of values, so
the oracle enumerates them all (every key order included) instead of stepping a parser."""

from __future__ import annotations

import datetime
import itertools
import json
from typing import Any

import jsonschema
import pytest

from specdec import UnsupportedSchemaError, Vocabulary
from specdec.constrain.grammar import CfgGrammar

D7 = "http://json-schema.org/draft-07/schema#"

# (cause, schema, valid instances, invalid instances): each cause gave a wrong verdict on a
# compiled schema before it was fixed; the instances reproduce it.
CAUSES: list[tuple[str, dict[str, Any], list[Any], list[Any]]] = [
    (
        "properties in an order other than the declared one",
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
            "required": ["a"],
        },
        [{"b": "x", "a": 1}, {"a": 1, "b": "x"}, {"a": 1}],
        [{"b": "x"}, {"b": 1, "a": 1}],
    ),
    (
        "undeclared required properties in any order among others",
        {"type": "object", "required": ["p", "q", "r", "s"]},
        [{"s": 1, "x": 2, "q": 3, "p": 4, "r": 5}],
        [{"s": 1, "q": 3, "p": 4}],
    ),
    (
        "$ref with a sibling enum in draft 7 (siblings ignored)",
        {
            "$schema": D7,
            "definitions": {"p": {"type": "object"}},
            "properties": {"x": {"$ref": "#/definitions/p", "enum": ["key", "sas"]}},
        },
        [{"x": {"key": "k"}}],
        [{"x": "key"}],
    ),
    (
        "$ref with a sibling enum in 2020-12 (siblings apply)",
        {
            "$defs": {"p": {"type": "string"}},
            "properties": {"x": {"$ref": "#/$defs/p", "enum": ["key", "sas"]}},
        },
        [{"x": "key"}],
        [{"x": "other"}, {"x": {"key": "k"}}],
    ),
    (
        "oneOf over objects told apart only by required names",
        {"type": "object", "oneOf": [{"required": ["href"]}, {"required": ["primitive"]}]},
        [{"href": "h"}, {"primitive": "p", "z": 1}],
        [{"href": "h", "primitive": "p"}, {"z": 1}],
    ),
    (
        "oneOf over objects with a discriminating const",
        {
            "type": "object",
            "oneOf": [
                {"properties": {"k": {"const": "a"}, "v": {"type": "integer"}}, "required": ["k"]},
                {"properties": {"k": {"const": "b"}, "v": {"type": "string"}}, "required": ["k"]},
            ],
        },
        [{"k": "a", "v": 1}, {"v": "s", "k": "b"}],
        [{"k": "a", "v": "s"}, {"k": "c"}],
    ),
    (
        "maxProperties 0 beside additional properties",
        {"type": "object", "maxProperties": 0},
        [{}],
        [{"key": "value"}],
    ),
    (
        "minProperties and maxProperties counted in any order",
        {
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "minProperties": 2,
            "maxProperties": 2,
        },
        [{"b": 1, "a": 2}, {"z": 1, "a": 2}],
        [{"a": 1}, {"a": 1, "b": 2, "c": 3}],
    ),
    (
        "const object with members in another order",
        {"const": {"foo": "bar", "baz": [{"x": 1, "y": 2}]}},
        [{"baz": [{"y": 2, "x": 1}], "foo": "bar"}],
        [{"foo": "bar"}, {"foo": "bar", "baz": [{"x": 1}]}],
    ),
    (
        "allOf over objects (required from both, any order)",
        {
            "allOf": [
                {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"properties": {"b": {"type": "string"}}, "required": ["b"]},
            ]
        },
        [{"b": "x", "a": 1}],
        [{"a": 1}, {"b": "x", "a": "1"}],
    ),
    (
        "keys matching two patternProperties",
        {"patternProperties": {"a*": {"type": "integer"}, "aaa*": {"maximum": 20}}},
        [{"aaaa": 18}, {"a": 21, "aaaa": 18}, {"b": 1}],
        [{"aaaa": 31}, {"b": "x"}],
    ),
    (
        "a declared property also matching patternProperties",
        {"properties": {"X-a": {"type": "string"}}, "patternProperties": {"^X-": {"minLength": 2}}},
        [{"X-a": "ab"}, {"X-b": "cd"}],
        [{"X-a": "a"}, {"X-b": "c"}],
    ),
    (
        "allOf of two enums (the values in both)",
        {"allOf": [{"enum": ["a", "b", 1]}, {"enum": ["b", 1.0, "c"]}]},
        ["b", 1],
        ["a", "c"],
    ),
    (
        "oneOf over strings told apart by their patterns",
        {"oneOf": [{"type": "string", "pattern": "^https?://"}, {"pattern": "^\\./.+$"}]},
        ["http://x", "./a", 3],
        ["ftp://x", "."],
    ),
    (
        "oneOf over objects told apart by a required property's type",
        {
            "oneOf": [
                {"type": "string", "enum": ["sha"]},
                {
                    "type": "object",
                    "properties": {"v": {"type": "string"}, "p": {"enum": ["x", "y"]}},
                    "required": ["v", "p"],
                },
                {
                    "type": "object",
                    "properties": {"v": {"type": "string"}, "p": {"type": "object"}},
                    "required": ["v", "p"],
                },
            ]
        },
        ["sha", {"v": "1", "p": "x"}, {"p": {}, "v": "1"}],
        [{"v": "1"}, {"v": "1", "p": 2}],
    ),
    (
        "a required name declared only by patternProperties, others closed",
        {
            "type": "object",
            "properties": {"n": {"type": "number"}},
            "patternProperties": {"^b_(s|e)$": {"type": "object", "required": ["c"]}},
            "required": ["b_s", "n"],
            "additionalProperties": False,
        },
        [{"b_s": {"c": 1}, "n": 1}, {"n": 2, "b_e": {"c": 0}, "b_s": {"c": 1}}],
        [{"n": 1}, {"b_s": {}, "n": 1}, {"b_s": {"c": 1}, "n": 1, "z": 0}],
    ),
    (
        "anyOf over objects",
        {
            "anyOf": [
                {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"properties": {"b": {"type": "string"}}, "required": ["b"]},
            ]
        },
        [{"b": "x", "a": 1}, {"b": "x"}, {"c": 1, "a": 1}],
        [{"c": 1}, {"a": "1"}],
    ),
    (
        "a float with a zero fraction is an integer",
        {"type": "integer"},
        [1.0, -3.0, 0.0, 12],
        [1.5, -0.25, "1"],
    ),
    (
        "integer bounds and multipleOf by value, zero fractions included",
        {"type": "integer", "minimum": -3, "maximum": 10, "multipleOf": 2},
        [-2.0, 10.0, 0, 4],
        [12.0, 3.0, -4.0, 2.5],
    ),
    (
        "integers written with an exponent (1e+20, 1.5e+17)",
        {"type": "integer", "multipleOf": 0.5},
        [1e20, 1.5e17, -2e16, 3],
        [2.5, 1.5e-7],
    ),
    (
        "integer multipleOf with an exponent: the mantissa's remainder",
        {"type": "integer", "multipleOf": 12},
        [1.2e18, 3.6e16, 24.0],
        [1.3e18, 6.0, 2.5e-5],
    ),
    (
        "draft 4: a float with a zero fraction is not an integer",
        {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer", "minimum": 0},
        [0, 7],
        [1.0, -1, 1e20],
    ),
    (
        "an integer const past 2^53 (compared by its digits, not as a float)",
        {"const": 9007199254740993},
        [9007199254740993],
        [9007199254740992, 9007199254740994],
    ),
    (
        "const 0 and -0.0 are one value",
        {"enum": [0, "a"]},
        [0, -0.0, 0.0, "a"],
        [1, -1.0],
    ),
]

# (cause, format, valid, invalid): with format_assertion (the default) each format is its
# RFC's grammar. The verdicts are checked against jsonschema's format checker where it
# checks the format exactly (ipv6, date, json-pointer), against a leap-second reference
# for time and date-time (jsonschema's checker refuses every second 60; RFC 3339 and the
# JSON-Schema-Test-Suite accept 23:59:60 in UTC), and are the RFC's ABNF otherwise.
FORMAT_CAUSES: list[tuple[str, str, list[str], list[str]]] = [
    (
        "time: a leap second only at 23:59:60 UTC, z in either case",
        "time",
        ["23:59:60Z", "15:59:60-08:00", "00:29:60-23:30", "01:29:60+01:30", "08:30:06z"],
        ["22:59:60Z", "23:59:60+01:00", "23:58:60+00:00", "24:00:00Z", "08:30:06"],
    ),
    (
        "date-time: t and z in either case, leap seconds",
        "date-time",
        ["1963-06-19t08:30:06.283185z", "1998-12-31T15:59:60.123-08:00"],
        ["1998-12-31T22:59:60Z", "1990-02-31T15:59:59-08:00", "1963-06-19 08:30:06Z"],
    ),
    (
        "ipv6 with an embedded IPv4 address",
        "ipv6",
        ["1::d6:192.168.0.1", "::ffff:192.168.0.1", "1:2:3:4:5:6:255.255.255.255", "::"],
        ["::ffff:192.168.0.01", "1:2:3:4:5:6:7:1.2.3.4", "1::2:192.168.256.1", "1::2::3"],
    ),
    (
        "email: RFC 5321 Mailbox (quoted local parts, address literals, no stray dots)",
        "email",
        [
            "te~st@example.com",
            '"joe bloggs"@example.com',
            '"joe@bloggs"@example.com',
            "joe.bloggs@[127.0.0.1]",
            "joe.bloggs@[IPv6:::1]",
        ],
        [".test@example.com", "test.@example.com", "te..st@example.com", "j@[127.0.0.300]"],
    ),
    (
        "uri: RFC 3986 authority (userinfo, numeric port, IP literals)",
        "uri",
        ["http://[::1]:80/", "http://u:p@h/?q#f", "urn:a:b", "http://[v1.x]"],
        ["https://[@example.org/", "http://example.com:abc/", "http://[::1.2.3.04]", "http:/[::1]"],
    ),
    (
        "duration: RFC 3339 appendix A",
        "duration",
        ["P4DT12H30M5S", "P2W", "PT36H", "P1M2D"],
        ["P1Y2D", "PT1H2S", "P0Y1W", "PT", "P1D2H"],
    ),
    (
        "json-pointer: RFC 6901",
        "json-pointer",
        ["", "/a~0b/~1", "//", '/k"l'],
        ["a", "/~2", "/a~"],
    ),
    (
        "uri-template: RFC 6570",
        "uri-template",
        ["http://x/{term:1}/{+y*}", "", "a'b", "{a.b,c}"],
        ["{}", "{a,}", "{v:0}", "{a..b}", "a b"],
    ),
]

# (cause, schema, keyword, pointer): refused in strict mode, naming the keyword and where.
REFUSED: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "oneOf whose alternatives may overlap",
        {"properties": {"s": {"oneOf": [{"pattern": "a"}, {"pattern": "b"}]}}},
        "oneOf",
        "#/properties/s",
    ),
    (
        "uniqueItems on long arrays of unbounded values",
        {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "uniqueItems",
        "#",
    ),
    (
        "maxContains",
        {"type": "array", "contains": {"const": 1}, "maxContains": 1},
        "maxContains",
        "#",
    ),
    (
        "a metaschema with unknown vocabularies",
        {"$schema": "https://example.com/no-validation", "type": "integer"},
        "$schema",
        "#",
    ),
    (
        "unevaluatedProperties",
        {"properties": {"o": {"unevaluatedProperties": False}}},
        "unevaluatedProperties",
        "#/properties/o",
    ),
    (
        "a format with no exact automaton (hostname: its labels must be valid IDNA)",
        {"properties": {"h": {"type": "string", "format": "hostname"}}},
        "format",
        "#/properties/h",
    ),
]


@pytest.fixture(scope="module")
def tekken() -> Vocabulary:
    return Vocabulary.from_tekken()


def _valid(schema: Any, data: Any) -> bool:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return bool(cls(schema).is_valid(data))


def _text(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


@pytest.mark.parametrize("cause,schema,valid,invalid", CAUSES, ids=[c[0] for c in CAUSES])
def test_cause_is_exact(
    tekken: Vocabulary, cause: str, schema: Any, valid: list[Any], invalid: list[Any]
) -> None:
    g = CfgGrammar.from_json_schema(tekken, schema)
    assert [a for a in g.approximations if a.kind != "spelling"] == []
    for data in valid + invalid:
        expected = _valid(schema, data)
        assert expected == (data in valid), f"table row disagrees with jsonschema: {data}"
        assert g.matches(_text(data)) == expected, (cause, data)


@pytest.mark.parametrize("cause,schema,keyword,pointer", REFUSED, ids=[c[0] for c in REFUSED])
def test_cause_is_refused(
    tekken: Vocabulary, cause: str, schema: Any, keyword: str, pointer: str
) -> None:
    with pytest.raises(UnsupportedSchemaError) as e:
        CfgGrammar.from_json_schema(tekken, schema)
    assert (e.value.keyword, e.value.pointer) == (keyword, pointer)
    assert keyword in str(e.value) and pointer in str(e.value)


def _leap_second_ok(text: str) -> bool:
    """RFC 3339's seconds, read with the standard library: 60 only at 23:59 in UTC."""
    t = text.split("T")[-1].split("t")[-1]
    if t[6:8] != "60":
        return True
    local = datetime.datetime.fromisoformat("2000-01-01T" + t[:6] + "59" + t[8:].upper())
    utc = local.astimezone(datetime.timezone.utc)
    return (utc.hour, utc.minute) == (23, 59)


@pytest.mark.parametrize(
    "cause,fmt,valid,invalid", FORMAT_CAUSES, ids=[c[0] for c in FORMAT_CAUSES]
)
def test_format_is_exact(
    tekken: Vocabulary, cause: str, fmt: str, valid: list[str], invalid: list[str]
) -> None:
    schema = {"type": "string", "format": fmt}
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    g = CfgGrammar.from_json_schema(tekken, schema)
    assert [a for a in g.approximations if a.kind != "spelling"] == []
    for text in valid + invalid:
        expected = text in valid
        if fmt in ("ipv6", "date", "json-pointer"):
            assert checker.conforms(text, fmt) == expected, f"jsonschema disagrees: {text}"
        if fmt in ("time", "date-time") and expected:
            assert _leap_second_ok(text), text
        if fmt in ("time", "date-time") and not expected and text[-9:-7] == "60":
            assert not _leap_second_ok(text), text
        assert g.matches(_text(text)) == expected, (cause, text)


def test_format_not_compiled_is_a_superset_without_strict(tekken: Vocabulary) -> None:
    g = CfgGrammar.from_json_schema(tekken, {"format": "hostname"}, strict=False)
    assert [(a.keyword, a.pointer, a.kind) for a in g.approximations] == [
        ("format", "#", "superset")
    ]
    assert g.matches('"-not a hostname-"') and g.matches("3")


def test_duplicate_keys_are_rejected(tekken: Vocabulary) -> None:
    schema = {"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    g = CfgGrammar.from_json_schema(tekken, schema)
    assert g.matches('{"a":1,"b":2}') and g.matches('{"b":2,"a":1}')
    assert not g.matches('{"a":1,"a":2}') and not g.matches('{"b":2,"a":1,"b":3}')


def test_declared_order_option(tekken: Vocabulary) -> None:
    schema = {"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    g = CfgGrammar.from_json_schema(tekken, schema, property_order="declared")
    assert g.matches('{"a":1,"b":2}') and not g.matches('{"b":2,"a":1}')


# The universe the oracle enumerates: values of the schemas below are built from these.
SCALARS: list[Any] = [None, True, False, 0, 1, "a", "b"]


def _objects(keys: list[str], values: list[Any]) -> list[dict[str, Any]]:
    """Every object over `keys` (each subset) with values from `values`."""
    out: list[dict[str, Any]] = []
    for n in range(len(keys) + 1):
        for ks in itertools.combinations(keys, n):
            for vs in itertools.product(values, repeat=n):
                out.append(dict(zip(ks, vs, strict=True)))
    return out


def _texts(data: Any) -> set[str]:
    """Every compact text of `data` (objects' members in every order, integers also with
    a zero fraction, zero also with a minus sign)."""
    if isinstance(data, dict):
        out = set()
        for order in itertools.permutations(data):
            parts = [[json.dumps(k) + ":" + t for t in _texts(data[k])] for k in order]
            out.update("{" + ",".join(p) + "}" for p in itertools.product(*parts))
        return out
    if isinstance(data, list):
        return {"[" + ",".join(p) + "]" for p in itertools.product(*map(_texts, data))}
    if isinstance(data, int) and not isinstance(data, bool):
        # Numbers compare by value: 1.0 is 1, -0 is 0 (one zero is enough to reach every
        # byte a mask along the plain spelling may allow).
        texts = {json.dumps(data), f"{data}.0"}
        return texts | {"-0", "-0.0"} if data == 0 else texts
    return {json.dumps(data)}


# (schema, universe): every valid document of the schema lies in the universe.
ORACLE_CASES: list[tuple[dict[str, Any], list[Any]]] = [
    (
        {
            "type": "object",
            "properties": {"a": {"enum": [0, 1]}, "b": {"type": "boolean"}, "c": {"const": "a"}},
            "required": ["a"],
            "additionalProperties": False,
        },
        _objects(["a", "b", "c", "d"], [0, 1, True, False, "a"]),
    ),
    (
        {
            "type": "object",
            "oneOf": [{"required": ["a"]}, {"required": ["b"]}],
            "properties": {"a": {"type": "null"}, "b": {"type": "null"}, "c": {"type": "null"}},
            "additionalProperties": False,
        },
        _objects(["a", "b", "c"], [None, 0]),
    ),
    (
        {
            "type": "array",
            "items": {"enum": ["a", "b", 1]},
            "uniqueItems": True,
        },
        [list(p) for n in range(4) for p in itertools.permutations(["a", "b", 1, 0], n)]
        + [["a", "a"], [1, 1, "b"]],
    ),
    (
        {
            "type": "object",
            "properties": {"k": {"enum": ["a", "b"]}},
            "required": ["k"],
            "minProperties": 2,
            "maxProperties": 2,
            "additionalProperties": {"type": "boolean"},
            "propertyNames": {"enum": ["k", "x", "y"]},
        },
        _objects(["k", "x", "y", "z"], ["a", "b", True, False]),
    ),
]


def _oracle_check(vocab: Vocabulary, schema: Any, universe: list[Any]) -> None:
    valid_texts = sorted({t for v in universe if _valid(schema, v) for t in _texts(v)})
    valid_set = set(valid_texts)
    invalid = [v for v in universe if not _valid(schema, v)]
    assert valid_texts, "the case must have valid documents"
    g = CfgGrammar.from_json_schema(vocab, schema, whitespace=False, separators=(",", ":"))
    token_bytes = [vocab.token_bytes(i) for i in range(vocab.vocab_size)]
    eos = vocab.eos_ids[0]
    for text in valid_texts:
        assert g.matches(text), text
    for text in sorted({_text(v) for v in universe if _valid(schema, v)}):
        m = g.matcher()
        data = text.encode()
        for i in range(len(data) + 1):
            prefix = data[:i]
            allowed = set(int(t) for t in m.allowed_tokens())
            expected = {
                t
                for t, b in enumerate(token_bytes)
                if b and any(v.encode().startswith(prefix + b) for v in valid_texts)
            }
            if prefix.decode() in valid_set:
                expected.add(eos)
            assert allowed == expected, (schema, prefix, allowed ^ expected)
            if i < len(data):
                assert m.accept_token(data[i])
    for v in invalid:
        for t in _texts(v):
            assert not g.matches(t), (schema, t)


@pytest.mark.parametrize("k", range(len(ORACLE_CASES)))
def test_masks_equal_completion_oracle(k: int) -> None:
    """A byte vocabulary (ids 0..255 are the bytes, 256 is EOS): the mask after every
    prefix of every valid document is exactly the set of bytes that keep some valid
    document reachable."""
    vocab = Vocabulary.from_bytes([bytes([b]) for b in range(256)] + [None], [256])
    schema, universe = ORACLE_CASES[k]
    _oracle_check(vocab, schema, universe)


# (schema, universe, kind): compiled with strict=False, the reported kind holds over the
# universe (a subset accepts no invalid value, a superset every valid one) and is strict.
APPROX_CASES: list[tuple[dict[str, Any], list[Any], str]] = [
    (
        {"type": "array", "items": {"type": "integer"}, "uniqueItems": True, "maxItems": 3},
        [list(p) for n in range(4) for p in itertools.product([0, 1, 2], repeat=n)],
        "superset",
    ),
    (
        {"oneOf": [{"enum": [0, 1, "a"]}, {"type": "integer"}]},
        SCALARS,
        "superset",
    ),
    (
        {"oneOf": [{"type": "string"}, {"maxLength": 2}]},
        ["", "ab", "abc", "abcd", 1, None, True, [], {}],
        "exact",
    ),
    (
        {"oneOf": [{"type": "integer"}, {"type": "string"}], "enum": [1, "a", None]},
        SCALARS,
        "exact",
    ),
    (
        {"properties": {"o": {"oneOf": [{"pattern": "a"}, {"pattern": "b"}]}}},
        [{"o": s} for s in ["a", "b", "ab", "c", ""]],
        "superset",
    ),
    (
        {"patternProperties": {"^a": {"type": "integer"}, "b$": {"minimum": 0}}},
        _objects(["a", "b", "ab", "c"], [0, -1, True]),
        "exact",
    ),
    (
        {
            "patternProperties": {
                "^a": {"type": "integer"},
                "b$": {"minimum": 0},
                "^c": {},
                "^d": {},
                "^e": {},
            }
        },
        _objects(["a", "b", "ab", "c"], [0, -1, True]),
        "subset",
    ),
]


@pytest.mark.parametrize("k", range(len(APPROX_CASES)))
def test_reported_approximation_holds(tekken: Vocabulary, k: int) -> None:
    schema, universe, kind = APPROX_CASES[k]
    g = CfgGrammar.from_json_schema(tekken, schema, strict=False)
    kinds = {a.kind for a in g.approximations if a.kind != "spelling"}
    assert kinds == ({kind} if kind != "exact" else set()), g.approximations
    missed = extra = 0
    for v in universe:
        # (Canonical spellings: integers are written without a fraction, a spelling
        # approximation listed apart.)
        ok, accepted = _valid(schema, v), g.matches(_text(v))
        missed += ok and not accepted
        extra += accepted and not ok
    if kind == "exact":
        assert missed == extra == 0
    elif kind == "subset":
        assert extra == 0 and missed > 0
    else:
        assert missed == 0 and extra > 0
    if kind != "exact":
        with pytest.raises(UnsupportedSchemaError):
            CfgGrammar.from_json_schema(tekken, schema)
