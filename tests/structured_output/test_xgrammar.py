"""Oracle cross-check: mini's allowed-token sets equal xgrammar's along random walks (shipped tokenizer).

xgrammar is the grammar backend vLLM uses by default (vllm/v1/structured_output/backend_xgrammar.py).
Both are given the same language: xgrammar's JSON schema compiler with `any_whitespace=False,
separators=(", ", ": ")` is mini's whitespace policy. Known, documented difference left out here:
xgrammar's strings with minLength/maxLength forbid escapes and allow raw control characters; mini keeps
JSON's string rules there too (README, "Structured output").
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from mini.config import SHIPPED_MODEL_DIR
from mini.structured_output.backend_mini import MiniBackend, MiniGrammar
from mini.structured_output.token_index import unpack_allowed

xgr = pytest.importorskip("xgrammar", reason="xgrammar (the oracle) is not installed: pip install xgrammar "
                          "after torch, see scripts/setup.sh")

VOCAB_SIZE = 4096
REGEXES = [r"\d{3}-[a-z]{2,4}", r"(cat|dog)s?!*", r"[A-Z][a-z]{0,5}( [A-Z][a-z]{0,5}){0,2}", r"héllo|wörld|日本語",
           r"[^\n]{1,6}\.", r"(\+|-)?[0-9]+(\.[0-9]+)?"]
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                      "tags": {"type": "array", "items": {"enum": ["a", "b", "cc"]},
                                               "minItems": 1, "maxItems": 3}}, "required": ["name"]},
    {"type": "object", "properties": {"x": {"type": "number"}, "y": {"anyOf": [{"type": "null"}, {"type": "boolean"}]},
                                      "z": {"type": "object", "properties": {"k": {"const": "v"}}, "required": ["k"]}},
     "required": ["x", "z"]},
    {"type": "array", "items": {"type": "integer"}, "maxItems": 4},
    {"enum": ["red", 1, None, True]},
]


@pytest.fixture(scope="module")
def setup():
    from mini.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(SHIPPED_MODEL_DIR)
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=VOCAB_SIZE)
    return MiniBackend(tokenizer, VOCAB_SIZE, tokenizer.eos_token_id), xgr.GrammarCompiler(info)


def xgrammar_allowed(matcher) -> set[int]:
    bitmask = xgr.allocate_token_bitmask(1, VOCAB_SIZE)
    matcher.fill_next_token_bitmask(bitmask)
    return set(unpack_allowed(bitmask[0].numpy().astype(np.int32), VOCAB_SIZE))


def compare_random_walks(compiled, xgrammar_compiled, seed: int, walks: int = 3, steps: int = 30) -> int:
    """Walk both automata with the same random allowed tokens; assert equal sets at every step."""
    rng = random.Random(seed)
    compared = 0
    for _ in range(walks):
        ours, theirs = MiniGrammar(compiled), xgr.GrammarMatcher(xgrammar_compiled)
        prefix = []
        for _ in range(steps):
            allowed = set(compiled.index.allowed_token_ids(ours.state))
            expected = xgrammar_allowed(theirs)
            assert allowed == expected, (f"after tokens {prefix}: mini-only {sorted(allowed - expected)[:10]}, "
                                         f"xgrammar-only {sorted(expected - allowed)[:10]}")
            compared += 1
            # Prefer non-EOS tokens so walks go deep; EOS ends the walk.
            choices = sorted(allowed - {compiled.index.eos_token_id}) or sorted(allowed)
            token = rng.choice(choices)
            assert ours.accept_tokens([token]) and theirs.accept_token(token)
            prefix.append(token)
            if token == compiled.index.eos_token_id:
                break
    return compared


@pytest.mark.parametrize("pattern", REGEXES)
def test_regex_masks_equal_xgrammar(setup, pattern):
    backend, compiler = setup
    assert compare_random_walks(backend.compile_grammar("regex", pattern), compiler.compile_regex(pattern),
                                seed=len(pattern)) > 3


@pytest.mark.parametrize("schema", SCHEMAS, ids=range(len(SCHEMAS)))
def test_json_schema_masks_equal_xgrammar(setup, schema):
    backend, compiler = setup
    text = json.dumps(schema)
    oracle = compiler.compile_json_schema(text, any_whitespace=False, separators=(", ", ": "))
    assert compare_random_walks(backend.compile_grammar("json", text), oracle, seed=7, steps=40) > 3


def test_choice_masks_equal_xgrammar_regex(setup):
    backend, compiler = setup
    choices = ["yes", "no", "maybe later", "y.e.s"]
    from mini.structured_output.json_schema import choice_to_regex

    assert compare_random_walks(backend.compile_grammar("choice", json.dumps(choices)),
                                compiler.compile_regex(choice_to_regex(choices)), seed=1) > 3
