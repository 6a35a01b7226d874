"""mini/structured_output compiler: regex -> NFA -> DFA over bytes, schema -> regex, token index, bitmask."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import numpy as np
import pytest
import torch

from mini.structured_output.backend_mini import MiniBackend, MiniGrammar, build_checked_nfa
from mini.structured_output.bitmask import apply_token_bitmask_inplace, unpack_bitmask
from mini.structured_output.dfa import DEAD, build_dfa
from mini.structured_output.json_schema import any_json_regex, choice_to_regex, schema_to_regex
from mini.structured_output.regex_nfa import build_nfa, utf8_sequences
from mini.structured_output.regex_parser import parse_regex
from mini.structured_output.token_index import (
    TokenIndex,
    TokenTrie,
    bitmask_words,
    pack_allowed,
    token_byte_strings,
    unpack_allowed,
)


def dfa_of(pattern: str):
    return build_dfa(build_nfa(parse_regex(pattern)))


REGEXES = [
    r"ab|c+", r"\d{3}-\d{2,4}", r"[^\"\\]*x", r"(?:ab)?x$", r"^[a-c]{1,3}(d|e)*", r"a.b", r"[\w.]+@[a-z]+",
    r"(?P<year>\d{2})/(0[1-9]|1[0-2])", r"\s?[^\sa]+", r"x{2,}y?", r"(a|b)*abb", r"[α-ω]é+|日本",
]
ALPHABET = "abcdexy0123-/.@_ \t\n\"\\αβωé日本"


@pytest.mark.parametrize("pattern", REGEXES)
def test_dfa_agrees_with_python_re_on_random_strings(pattern):
    dfa = dfa_of(pattern)
    rng = random.Random(pattern)
    compiled = re.compile(pattern, re.ASCII)  # \d \w \s are ASCII classes in mini (as ECMA-262 \d \w)
    for _ in range(400):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 6)))
        assert dfa.matches(text.encode()) == bool(compiled.fullmatch(text)), (pattern, text)
    # and on strings the language really contains: random accepting walks
    for text in random_walk_strings(dfa, rng, 30):
        assert compiled.fullmatch(text.decode("utf-8")), (pattern, text)


def random_walk_strings(dfa, rng: random.Random, count: int, max_len: int = 40) -> list[bytes]:
    """Strings of the DFA's language, found by random walks that stop in accepting states."""
    found = []
    for _ in range(count * 20):
        state, data = 0, b""
        while len(data) < max_len:
            if dfa.accepting[state] and rng.random() < 0.3:
                found.append(data)
                break
            moves = [b for b in range(256) if dfa.transitions[state][b] != DEAD]
            if not moves:
                break
            byte = rng.choice(moves)
            data += bytes([byte])
            state = dfa.transitions[state][byte]
        if len(found) == count:
            break
    assert found, "no accepting walk found"
    return found


def test_utf8_sequences_cover_each_code_point_exactly_once():
    rng = random.Random(0)
    for lo, hi in [(0, 0x10FFFF), (0x80, 0x7FF), (0x3B1, 0x3C9), (0xE000, 0x10FFFF), (0x7F, 0x800)]:
        sequences = utf8_sequences(lo, hi)
        for _ in range(500):
            code = rng.randint(lo, hi)
            if 0xD800 <= code <= 0xDFFF:
                continue
            data = chr(code).encode()
            hits = sum(len(s) == len(data) and all(a <= x <= b for x, (a, b) in zip(data, s,
                                                                                    strict=False)) for s in sequences)
            assert hits == 1, (hex(code), sequences)


def test_dfa_is_trimmed_and_minimal():
    dfa = dfa_of(r"(a|b)*abb")
    assert dfa.num_states == 4  # the textbook minimal DFA
    # trimmed: every state can still reach acceptance, so no live state is a trap
    dfa = dfa_of(r"ab")
    assert dfa.walk(b"b") == DEAD and dfa.walk(b"a") != DEAD


@pytest.mark.parametrize("pattern, message", [
    ("(ab", "missing ')'"), ("a)", "unexpected ')'"), ("*a", "nothing to repeat"), (r"(?=a)b", "look-around"),
    (r"(a)\1", "back references"), ("a{3,1}", "max < min"), ("a^b", "'^'"), ("a$b", "'$'"),
    ("[:alpha:]]", None),
])
def test_bad_regexes_raise_value_error_naming_regex(pattern, message):
    if message is None:  # parses as a plain class: fine
        parse_regex(pattern)
        return
    with pytest.raises(ValueError, match="regex") as info:
        parse_regex(pattern)
    assert message in str(info.value)


def test_empty_language_is_refused():
    with pytest.raises(ValueError, match="admits no string"):
        build_checked_nfa("regex", r"[^\x00-\U0010ffff]")
    with pytest.raises(ValueError, match="admits no"):
        build_checked_nfa("json", json.dumps({"type": "array", "minItems": 3, "maxItems": 1}))


SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5}, "age": {"type": "integer"},
                                      "ok": {"type": "boolean"}}, "required": ["name", "age"]},
    {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": ["string", "null"]},
                                      "c": {"enum": ["x", 2, None]}}, "additionalProperties": False},
    {"type": "array", "items": {"type": "string", "pattern": "[a-z]{1,3}"}, "minItems": 1, "maxItems": 3},
    {"anyOf": [{"type": "integer"}, {"const": {"k": [1, 2]}}]},
    {"type": "object", "properties": {"inner": {"type": "object", "properties": {"v": {"type": "null"}},
                                                "required": ["v"]}}, "required": ["inner"]},
    {"type": "string", "minLength": 2, "maxLength": 4},
    {},
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=range(len(SCHEMAS)))
def test_schema_regex_strings_are_valid_json_for_the_schema(schema):
    dfa = dfa_of(schema_to_regex(schema))
    for data in random_walk_strings(dfa, random.Random(1), 25, max_len=60):
        jsonschema.validate(json.loads(data.decode("utf-8")), schema)


def test_schema_regex_accepts_the_canonical_dump_and_rejects_others():
    dfa = dfa_of(schema_to_regex(SCHEMAS[0]))
    assert dfa.matches(b'{"name": "bob", "age": 7}')
    assert dfa.matches(b'{"name": "bob", "age": -7, "ok": true}')
    assert not dfa.matches(b'{"age": 7, "name": "bob"}')  # properties in schema order
    assert not dfa.matches(b'{"name": "bob"}')  # required age missing
    assert not dfa.matches(b'{"name":"bob","age":7}')  # whitespace policy: ", " and ": "
    assert not dfa.matches(b'{"name": "bobbyb", "age": 7}')  # maxLength


@pytest.mark.parametrize("schema, keyword", [
    ({"type": "string", "format": "date"}, "format"), ({"$ref": "#/x"}, "$ref"),
    ({"type": "integer", "minimum": 0}, "minimum"), ({"type": "tuple"}, "type"),
    ({"type": "object", "properties": {"a": {}}, "additionalProperties": True}, "additionalProperties"),
    ({"type": "object", "properties": {"a": {}}, "required": ["b"]}, "required"),
    ({"enum": []}, "enum"), ("{not json", "not valid JSON"), (3, "JSON schema object"),
])
def test_unsupported_schemas_raise_naming_the_keyword(schema, keyword):
    with pytest.raises(ValueError, match="structured_outputs.json") as info:
        schema_to_regex(schema)
    assert keyword in str(info.value)


def test_choice_and_json_object():
    dfa = dfa_of(choice_to_regex(["yes", "no", "a.b", "日本"]))
    assert all(dfa.matches(c.encode()) for c in ["yes", "no", "a.b", "日本"])
    assert not dfa.matches(b"axb") and not dfa.matches(b"ye")
    dfa = dfa_of(any_json_regex())
    for data in random_walk_strings(dfa, random.Random(2), 30, max_len=50):
        json.loads(data.decode("utf-8"))
    assert dfa.matches(b'{"a": [1, {"b": null}]}') is False  # depth 3 > MAX_DEPTH = 2
    assert dfa.matches(b'{"a": [1, "x"], "b": {}}')


# ---------------------------------------------------------------------- token index and bitmask
class ToyTokenizer:
    """Just enough of a tokenizer: a fixed vocabulary of byte strings (no backend_tokenizer)."""

    def __init__(self, tokens):
        self.tokens = tokens
        self.all_special_ids = [0]

    def __len__(self):
        return len(self.tokens)

    def convert_ids_to_tokens(self, ids):
        return [self.tokens[i] for i in ids]


def test_token_index_equals_brute_force():
    vocab = ["<eos>", "a", "b", "ab", "ba", "abb", "c", "1", "12", "123", "-", "x", "▁a", "<0x41>"]
    byte_strings = token_byte_strings(ToyTokenizer(vocab), vocab_size=20)
    assert byte_strings[12] == b" a" and byte_strings[13] == b"A" and byte_strings[0] is None
    assert byte_strings[15] is None  # beyond the tokenizer: never allowed
    dfa = dfa_of(r"(a|b)*abb|\d{2,3}")
    index = TokenIndex(dfa, TokenTrie.build(byte_strings), vocab_size=20, eos_token_id=0)
    for state in range(dfa.num_states):
        expected = [t for t, data in enumerate(byte_strings) if data and dfa.walk(data, state) != DEAD]
        expected += [0] if dfa.accepting[state] else []
        assert index.allowed_token_ids(state) == sorted(expected)
        assert unpack_allowed(index.mask(state), 20) == sorted(expected)


def test_shipped_tokenizer_byte_strings_round_trip():
    from mini.config import SHIPPED_MODEL_DIR
    from mini.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(SHIPPED_MODEL_DIR)
    strings = token_byte_strings(tokenizer, 4096)
    text = "Hello, wörld! {\"a\": 1}\n"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert b"".join(strings[i] for i in ids) == text.encode()
    assert strings[tokenizer.eos_token_id] is None


def test_grammar_accepts_valid_and_refuses_invalid_tokens():
    vocab = ["<eos>", "a", "b", "ab", "abb"]
    backend = MiniBackend(ToyTokenizer(vocab), vocab_size=5, eos_token_id=0)
    grammar = MiniGrammar(backend.compile_grammar("regex", "ab{1,2}"))
    assert grammar.validate_tokens([3, 2, 2]) == [3, 2]  # "ab" "b", then a third b is too many
    assert not grammar.accept_tokens([0])  # EOS before an accepting state
    assert grammar.accept_tokens([1]) and grammar.accept_tokens([2])
    assert grammar.accept_tokens([0]) and grammar.is_terminated()
    assert not grammar.accept_tokens([1])
    bitmask = np.zeros((1, bitmask_words(5)), dtype=np.int32)
    grammar.reset()
    grammar.fill_bitmask(bitmask, 0)
    assert unpack_allowed(bitmask[0], 5) == [1, 3, 4]


def test_pack_unpack_and_apply_bitmask_rows():
    vocab_size = 70
    rng = random.Random(3)
    allowed = [sorted(rng.sample(range(vocab_size), 9)), list(range(vocab_size))]
    packed = np.stack([pack_allowed(a, vocab_size) for a in allowed])
    assert packed.shape == (2, 3) and packed.dtype == np.int32
    bits = unpack_bitmask(torch.from_numpy(packed), vocab_size)
    assert [torch.nonzero(r).flatten().tolist() for r in bits] == allowed
    logits = torch.randn(3, vocab_size)
    original = logits.clone()
    apply_token_bitmask_inplace(logits, torch.from_numpy(packed), torch.tensor([2, 0]))
    assert torch.equal(logits[1], original[1])  # unconstrained row untouched
    assert torch.equal(logits[2].isfinite().nonzero().flatten(), torch.tensor(allowed[0]))
    assert torch.equal(logits[0], original[0])  # all-ones row changes nothing
    with pytest.raises(ValueError, match="bitmask"):
        apply_token_bitmask_inplace(logits, torch.zeros(1, 3, dtype=torch.int64))
