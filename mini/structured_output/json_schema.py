"""JSON schema (a subset) -> regex text; choice -> alternation; json_object -> any JSON value to a depth.

Mirrors the job of xgrammar's `Grammar.from_json_schema` / outlines-core's `build_regex_from_schema`,
which vllm/v1/structured_output/backend_xgrammar.py and backend_outlines.py call. Unlike xgrammar
(a pushdown automaton, so any nesting), mini targets a FINITE automaton: recursion is unrolled to
`MAX_DEPTH` levels, which is exactly what a regex can express.

Whitespace policy (the same as xgrammar with `any_whitespace=False, separators=(", ", ": ")`):
items and properties are separated by ", ", keys and values by ": ", and there is no other whitespace.

Supported keywords (anything else -> ValueError naming the keyword and this list):
  type (one name or a list), enum, const, anyOf;
  object: properties (emitted in the schema's order), required, additionalProperties false (or absent:
  only the listed properties are allowed, as xgrammar's strict mode);
  array: items, minItems, maxItems;  string: pattern (the whole string body), minLength, maxLength;
  integer, number, boolean, null (no numeric bounds); annotations (title, description, default,
  examples, $schema, $id, $comment) are ignored. An empty schema {} means any JSON value.
"""

# ruff: noqa: TRY004  (a wrong type is a bad value here: ValueError naming the field, as vLLM raises)
from __future__ import annotations

import json

# How deeply an "any JSON value" (json_object, {} or an untyped object/array) may nest objects and arrays.
MAX_DEPTH = 2
# vLLM's bound on a schema document: objects and arrays nested at most this deep (the value of
# MAX_STRUCTURED_OUTPUT_JSON_NESTING in vllm/sampling_params.py, checked by `check_json_nesting` there).
MAX_STRUCTURED_OUTPUT_JSON_NESTING = 64
# mini's own bound: a regex longer than this is refused (an array of arrays doubles the regex per level).
MAX_REGEX_LENGTH = 200_000
SEPARATOR_ITEM = ", "
SEPARATOR_KEY = ": "

STRING_CHAR = r'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})'
STRING = f'"{STRING_CHAR}*"'
INTEGER = r"(?:0|-?[1-9][0-9]*)"  # as xgrammar: no "-0"
NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
BOOLEAN = "(?:true|false)"
NULL = "null"

SUPPORTED_KEYWORDS = ("type", "enum", "const", "anyOf", "properties", "required", "additionalProperties",
                      "items", "minItems", "maxItems", "pattern", "minLength", "maxLength")
IGNORED_KEYWORDS = ("title", "description", "default", "examples", "$schema", "$id", "$comment")
TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")


def escape(text: str) -> str:
    """A regex matching exactly `text` (every ASCII non-alphanumeric character escaped)."""
    return "".join("\\" + c if c.isascii() and not c.isalnum() and c not in "\n\t\r" else
                   {"\n": r"\n", "\t": r"\t", "\r": r"\r"}.get(c, c) for c in text)


def dump(value) -> str:
    """A JSON value as the text the whitespace policy produces."""
    return json.dumps(value, ensure_ascii=False, separators=(SEPARATOR_ITEM, SEPARATOR_KEY))


def choice_to_regex(choices) -> str:
    """choice=[...] -> (?:a|b|...) matching one choice exactly (as vLLM's choice -> regex)."""
    if not isinstance(choices, (list, tuple)) or not choices or not all(isinstance(c, str) for c in choices):
        raise ValueError(f"structured_outputs.choice must be a non-empty list of str, got {choices!r}")
    return "(?:" + "|".join(escape(c) for c in choices) + ")"


def any_json_regex(depth: int = MAX_DEPTH) -> str:
    """Any JSON value with objects/arrays nested at most `depth` levels."""
    scalar = f"(?:{STRING}|{NUMBER}|{BOOLEAN}|{NULL})"
    if depth <= 0:
        return scalar
    inner = any_json_regex(depth - 1)
    return f"(?:{scalar}|{_object_of(STRING, inner)}|{_array_of(inner, 0, None)})"


def _object_of(key: str, value: str) -> str:
    member = f"{key}{escape(SEPARATOR_KEY)}{value}"
    return rf"\{{(?:{member}(?:{escape(SEPARATOR_ITEM)}{member})*)?\}}"


def _array_of(item: str, min_items: int, max_items: int | None) -> str:
    sep = escape(SEPARATOR_ITEM)
    high = "" if max_items is None else str(max_items - 1)
    if min_items == 0:
        body = "" if max_items == 0 else f"(?:{item}(?:{sep}{item}){{0,{high}}})?"
    else:
        body = f"{item}(?:{sep}{item}){{{min_items - 1},{high}}}"
    return rf"\[{body}\]"


def nesting_exceeds(document, limit: int) -> bool:
    """Whether `document` nests dicts and lists more than `limit` levels deep (level by level, no recursion)."""
    level = [document]
    for _ in range(limit):
        level = [child for node in level for child in (node.values() if isinstance(node, dict) else node)
                 if isinstance(child, (dict, list))]
        if not level:
            return False
    return True


def check_json_nesting(spec) -> None:
    """ValueError when a schema (dict or JSON text) nests objects and arrays more than
    MAX_STRUCTURED_OUTPUT_JSON_NESTING levels, as vLLM's `check_json_nesting` (vllm/sampling_params.py)."""
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except RecursionError:
            spec = None  # deeper than the JSON parser itself accepts
        except ValueError:
            return  # malformed JSON: reported by schema_to_regex
        else:
            if not isinstance(spec, (dict, list)) or not nesting_exceeds(spec, MAX_STRUCTURED_OUTPUT_JSON_NESTING):
                return
    elif not isinstance(spec, (dict, list)) or not nesting_exceeds(spec, MAX_STRUCTURED_OUTPUT_JSON_NESTING):
        return
    raise ValueError(f"structured_outputs.json is nested too deeply: objects and arrays may nest at most "
                     f"{MAX_STRUCTURED_OUTPUT_JSON_NESTING} levels (MAX_STRUCTURED_OUTPUT_JSON_NESTING)")


def schema_to_regex(schema, depth: int = MAX_DEPTH) -> str:
    """Compile a JSON schema (dict, JSON text or True) to a regex; ValueError on unsupported input."""
    check_json_nesting(schema)
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as error:
            raise ValueError(f"structured_outputs.json is not valid JSON: {error}") from None
    regex = _compile(schema, depth, "structured_outputs.json")
    _check_length(regex, "structured_outputs.json")
    return regex


def _check_length(regex: str, where: str) -> str:
    if len(regex) > MAX_REGEX_LENGTH:
        raise ValueError(f"{where} compiles to a regex longer than MAX_REGEX_LENGTH = {MAX_REGEX_LENGTH} "
                         "characters (mini unrolls nesting into a finite automaton: nest arrays less deeply)")
    return regex


def _int_field(schema: dict, name: str, where: str) -> int | None:
    value = schema.get(name)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise ValueError(f"{where}.{name} must be a non-negative int, got {value!r}")
    return value


def _compile(schema, depth: int, where: str) -> str:
    if schema is True or schema == {}:
        return any_json_regex(depth)
    if not isinstance(schema, dict):
        raise ValueError(f"{where} must be a JSON schema object (dict), got {schema!r}")
    unknown = [k for k in schema if k not in SUPPORTED_KEYWORDS and k not in IGNORED_KEYWORDS]
    if unknown:
        raise ValueError(f"{where}: unsupported JSON schema keyword(s) {unknown}; supported: "
                         f"{', '.join(SUPPORTED_KEYWORDS)} (annotations {', '.join(IGNORED_KEYWORDS)} are ignored)")
    if "const" in schema:
        return escape(dump(schema["const"]))
    if "enum" in schema:
        values = schema["enum"]
        if not isinstance(values, list) or not values:
            raise ValueError(f"{where}.enum must be a non-empty list, got {values!r}")
        return "(?:" + "|".join(escape(dump(v)) for v in values) + ")"
    if "anyOf" in schema:
        options = schema["anyOf"]
        if not isinstance(options, list) or not options:
            raise ValueError(f"{where}.anyOf must be a non-empty list of schemas, got {options!r}")
        return "(?:" + "|".join(_compile(o, depth, f"{where}.anyOf[{i}]") for i, o in enumerate(options)) + ")"
    kind = schema.get("type")
    if kind is None:
        return any_json_regex(depth)
    kinds = kind if isinstance(kind, list) else [kind]
    if not kinds or any(k not in TYPES for k in kinds):
        raise ValueError(f"{where}.type must be one of {', '.join(TYPES)} (or a list of them), got {kind!r}")
    return _check_length("(?:" + "|".join(_compile_type(schema, k, depth, where) for k in kinds) + ")", where)


def _compile_type(schema: dict, kind: str, depth: int, where: str) -> str:
    if kind == "string":
        return _compile_string(schema, where)
    if kind == "integer":
        return INTEGER
    if kind == "number":
        return NUMBER
    if kind == "boolean":
        return BOOLEAN
    if kind == "null":
        return NULL
    if kind == "array":
        min_items = _int_field(schema, "minItems", where) or 0
        max_items = _int_field(schema, "maxItems", where)
        if max_items is not None and max_items < min_items:
            raise ValueError(f"{where}: maxItems={max_items} < minItems={min_items} admits no array")
        if depth <= 0 and "items" not in schema:
            raise ValueError(f"{where}: nesting deeper than {MAX_DEPTH} levels is not supported")
        item = _compile(schema.get("items", True), depth - 1, f"{where}.items")
        return _array_of(item, min_items, max_items)
    return _compile_object(schema, depth, where)


def _compile_string(schema: dict, where: str) -> str:
    if "pattern" in schema:
        if not isinstance(schema["pattern"], str):
            raise ValueError(f"{where}.pattern must be a str, got {schema['pattern']!r}")
        if "minLength" in schema or "maxLength" in schema:
            raise ValueError(f"{where}: pattern together with minLength/maxLength is not supported")
        body = schema["pattern"]
        body = body.removeprefix("^")
        body = body[:-1] if body.endswith("$") and not body.endswith("\\$") else body
        return f'"(?:{body})"'
    low = _int_field(schema, "minLength", where) or 0
    high = _int_field(schema, "maxLength", where)
    if high is not None and high < low:
        raise ValueError(f"{where}: maxLength={high} < minLength={low} admits no string")
    if low == 0 and high is None:
        return STRING
    return f'"{STRING_CHAR}{{{low},{"" if high is None else high}}}"'


def _compile_object(schema: dict, depth: int, where: str) -> str:
    properties = schema.get("properties", {})
    extra = schema.get("additionalProperties", False)
    if not isinstance(properties, dict):
        raise ValueError(f"{where}.properties must be an object, got {properties!r}")
    if extra is not False and not (extra is True and not properties):
        raise ValueError(f"{where}.additionalProperties: only false (or absent) is supported, got {extra!r}")
    if not properties and "properties" not in schema:
        if depth <= 0:
            raise ValueError(f"{where}: nesting deeper than {MAX_DEPTH} levels is not supported")
        return _object_of(STRING, any_json_regex(depth - 1))
    required = schema.get("required", [])
    if not isinstance(required, list) or any(name not in properties for name in required):
        raise ValueError(f"{where}.required must list names from properties, got {required!r}")
    members = [(escape(dump(name) + SEPARATOR_KEY) + _compile(sub, depth - 1, f"{where}.properties.{name}"),
                name in required) for name, sub in properties.items()]
    sep = escape(SEPARATOR_ITEM)

    def after_first(index: int) -> str:  # members from `index` on, once one has been written
        return "".join(f"{sep}{m}" if req else f"(?:{sep}{m})?" for m, req in members[index:])

    def from_start(index: int) -> str:  # members from `index` on, none written yet
        if index == len(members):
            return ""
        member, req = members[index]
        if req:
            return member + after_first(index + 1)
        return f"(?:{member}{after_first(index + 1)}|{from_start(index + 1)})"

    return rf"\{{{from_start(0)}\}}"
