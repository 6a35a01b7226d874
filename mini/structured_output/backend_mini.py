"""mini's grammar backend: spec -> compiled grammar (DFA + token index) -> per-request matcher.

Mirrors vllm/v1/structured_output/backend_xgrammar.py and backend_types.py: a backend turns a request's
`StructuredOutputsParams` into a grammar (`compile_grammar`), and each request gets a matcher object
with `accept_tokens`, `validate_tokens`, `fill_bitmask`, `is_terminated` and `reset` (vLLM's
`StructuredOutputGrammar` interface). Compiled grammars are cached by spec, so 32 requests with the
same schema compile once (xgrammar's GrammarCompiler cache does the same).

    spec --(json_schema.py)--> regex text --(regex_parser.py)--> tree --(regex_nfa.py)--> byte NFA
         --(dfa.py)--> trimmed minimal DFA --(token_index.py)--> allowed-token bitmask per state
"""

from __future__ import annotations

import functools
import json
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from mini import roles
from mini.structured_output import dfa as dfa_steps
from mini.structured_output import token_index as token_steps
from mini.structured_output.dfa import DEAD, DFA
from mini.structured_output.json_schema import any_json_regex, choice_to_regex, schema_to_regex
from mini.structured_output.regex_nfa import NFA, build_nfa
from mini.structured_output.regex_parser import parse_regex
from mini.structured_output.token_index import TokenIndex, TokenTrie, token_byte_strings

# States whose masks are computed on the compile thread; the rest fill in on first use.
WARM_STATES = 256


def spec_key(params) -> tuple[str, str]:
    """(kind, canonical spec text): the compile-cache key of a StructuredOutputsParams."""
    kind = params.kind
    value = getattr(params, kind)
    if kind == "json" and isinstance(value, dict):
        value = json.dumps(value)  # key order kept: properties are emitted in schema order
    elif kind == "choice":
        value = json.dumps(value)
    return kind, str(value)


def spec_to_regex(kind: str, spec: str) -> str:
    """The regex a spec compiles to (the readable intermediate form)."""
    if kind == "regex":
        return spec
    if kind == "json":
        return schema_to_regex(spec)
    if kind == "choice":
        return choice_to_regex(json.loads(spec))
    if kind == "json_object":
        return any_json_regex()
    raise ValueError(f"structured_outputs kind must be regex, json, choice or json_object, got {kind!r}")


@functools.lru_cache(maxsize=64)
def build_checked_nfa(kind: str, spec: str) -> NFA:
    """Parse and build the NFA; ValueError (naming the field) for a bad or empty-language spec.

    Cheap (linear in the pattern), so the input processor runs it at add_request; the DFA and the
    token index, the expensive part, are built later on the compile thread. Cached: the NFA is read-only.
    """
    nfa = build_nfa(parse_regex(spec_to_regex(kind, spec)))
    if not nfa.accepts_something():
        raise ValueError(f"structured_outputs.{kind} admits no string at all")
    return nfa


@dataclass(slots=True)
class CompiledGrammar:
    """Shared by every request with the same spec (read-only after compilation)."""

    kind: str
    regex: str
    dfa: DFA
    index: TokenIndex


class MiniGrammarCompiler:
    """The compiler's algorithms: byte NFA -> DFA (subset construction over epsilon-closures), DFA state ->
    allowed tokens -> packed mask row. vLLM's XgrammarBackend builds one `xgr.GrammarCompiler` for its
    tokenizer (vllm/v1/structured_output/backend_xgrammar.py); the backend below builds one of these.

    Home of the `structured_output` role's compiler parts (mini/roles.py): `epsilon_closure`,
    `subset_construction`, `allowed_token_ids` and `pack_allowed`; an engine built with other parts uses a
    subclass holding them (`roles.resolve(config, MiniGrammarCompiler)`), chosen once when its backend is built.
    """

    epsilon_closure = staticmethod(dfa_steps.epsilon_closure)
    subset_construction = staticmethod(dfa_steps.subset_construction)
    allowed_token_ids = staticmethod(token_steps.allowed_token_ids)
    pack_allowed = staticmethod(token_steps.pack_allowed)

    def build_dfa(self, nfa: NFA) -> DFA:
        """NFA -> trimmed, minimized DFA (dfa.py), by this compiler's subset construction."""
        return dfa_steps.build_dfa(nfa, subset_construction=self.subset_construction)

    def build_token_index(self, dfa: DFA, trie: TokenTrie, vocab_size: int, eos_token_id: int | None
                          ) -> TokenIndex:
        """The per-state token masks of `dfa`, found and packed by this compiler's parts."""
        return TokenIndex(dfa, trie, vocab_size, eos_token_id, find_allowed=self.allowed_token_ids,
                          pack=self.pack_allowed)


class MiniBackend:
    """Compiles specs for one tokenizer/vocabulary (vLLM: XgrammarBackend).

    `config`: the engine's EngineConfig (None: none); its `parts` (mini/roles.py) pick the compiler's class.
    """

    def __init__(self, tokenizer, vocab_size: int, eos_token_id: int | None, config: Any = None) -> None:
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.compiler = roles.resolve(config, MiniGrammarCompiler)()
        self._tokenizer = tokenizer
        self._trie: TokenTrie | None = None
        self._cache: dict[tuple[str, str], CompiledGrammar] = {}
        self._lock = threading.Lock()

    @property
    def trie(self) -> TokenTrie:
        with self._lock:
            if self._trie is None:
                self._trie = TokenTrie.build(token_byte_strings(self._tokenizer, self.vocab_size))
            return self._trie

    def compile_grammar(self, kind: str, spec: str) -> CompiledGrammar:
        """spec -> CompiledGrammar (cached). Runs on the manager's compile thread."""
        key = (kind, spec)
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None:
            return cached
        dfa = self.compiler.build_dfa(build_checked_nfa(kind, spec))
        index = self.compiler.build_token_index(dfa, self.trie, self.vocab_size, self.eos_token_id)
        index.warm(WARM_STATES)
        compiled = CompiledGrammar(kind=kind, regex=spec_to_regex(kind, spec), dfa=dfa, index=index)
        with self._lock:
            return self._cache.setdefault(key, compiled)


class MiniGrammar:
    """One request's position in its grammar (vLLM: XgrammarGrammar around a GrammarMatcher)."""

    def __init__(self, compiled: CompiledGrammar) -> None:
        self.compiled = compiled
        self.state = 0
        self.num_processed_tokens = 0
        self._terminated = False

    def _next_state(self, state: int, token_id: int) -> int:
        """State after one token; DEAD if the token is not allowed there."""
        index = self.compiled.index
        if token_id == index.eos_token_id:
            return state if self.compiled.dfa.accepting[state] else DEAD
        data = index.trie_bytes(token_id)
        return DEAD if data is None else self.compiled.dfa.walk(data, state)

    def validate_tokens(self, token_ids: list[int]) -> list[int]:
        """The longest prefix of `token_ids` the grammar accepts from here (state unchanged)."""
        state, accepted = self.state, []
        for token_id in token_ids:
            if self._terminated or state == DEAD:
                break
            state = self._next_state(state, token_id)
            if state == DEAD:
                break
            accepted.append(token_id)
            if token_id == self.compiled.index.eos_token_id:
                break
        return accepted

    def accept_tokens(self, token_ids: list[int]) -> bool:
        """Advance by `token_ids`; False (state unchanged) if any of them is not allowed."""
        if len(self.validate_tokens(token_ids)) != len(token_ids):
            return False
        for token_id in token_ids:
            self.state = self._next_state(self.state, token_id)
            if token_id == self.compiled.index.eos_token_id:
                self._terminated = True
        self.num_processed_tokens += len(token_ids)
        return True

    def is_terminated(self) -> bool:
        """True once EOS was accepted."""
        return self._terminated

    def is_dead_end(self) -> bool:
        """No token (EOS included) is allowed here: the request cannot go on in the grammar."""
        return not self._terminated and self.compiled.index.num_allowed(self.state) == 0

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        """Write this state's allowed-token words into `bitmask[row]`."""
        bitmask[row] = self.compiled.index.mask(self.state)

    def reset(self) -> None:
        self.state, self.num_processed_tokens, self._terminated = 0, 0, False
