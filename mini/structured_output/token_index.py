"""The token-level index: for a DFA state, which token ids keep the walk alive, as a packed bitmask.

Mirrors the tokenizer side of vllm/v1/structured_output/backend_xgrammar.py (`xgr.TokenizerInfo`:
the vocabulary as byte strings) and xgrammar's adaptive token mask cache, in the simplest form that
works: the vocabulary's byte strings go into a trie; for a DFA state we walk the trie and the DFA
together, and every trie node reached while the DFA is still alive marks its tokens as allowed.
Because the DFA is trimmed (dfa.py), "alive" means "can still end in an accepting state".

Bitmask layout (vLLM's and xgrammar's): int32 words, token t is bit t % 32 of word t // 32, 1 = allowed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mini.structured_output.dfa import DEAD, DFA


def bitmask_words(vocab_size: int) -> int:
    """ceil(vocab_size / 32): int32 words per row."""
    return (vocab_size + 31) // 32


def pack_allowed(allowed_ids, vocab_size: int) -> np.ndarray:
    """Token ids -> one packed int32 row of `bitmask_words(vocab_size)` words."""
    bits = np.zeros(bitmask_words(vocab_size) * 32, dtype=bool)
    bits[list(allowed_ids)] = True
    return np.packbits(bits, bitorder="little").view("<i4").astype(np.int32)


def unpack_allowed(row: np.ndarray, vocab_size: int) -> list[int]:
    """One packed row -> sorted allowed token ids."""
    bits = np.unpackbits(np.asarray(row, dtype="<i4").view(np.uint8), bitorder="little")[:vocab_size]
    return np.flatnonzero(bits).tolist()


def _gpt2_byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode: the printable stand-in character of each byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


def token_byte_strings(tokenizer, vocab_size: int) -> list[bytes | None]:
    """The bytes each token id stands for (None: special, unused or beyond the tokenizer).

    Byte-level BPE (GPT-2, Llama 3, Qwen, the shipped model) spells bytes with stand-in characters;
    SentencePiece-style vocabularies (Llama 2) use '▁' for a space and '<0xNN>' for raw bytes.
    """
    decoder_kind = None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        decoder = json.loads(backend.to_str()).get("decoder") or {}
        kinds = [decoder.get("type")] + [d.get("type") for d in decoder.get("decoders", []) or []]
        decoder_kind = "byte_level" if "ByteLevel" in kinds else "sentencepiece"
    byte_decoder = _gpt2_byte_decoder()
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    size = min(vocab_size, len(tokenizer))
    tokens = tokenizer.convert_ids_to_tokens(list(range(size)))
    result: list[bytes | None] = [None] * vocab_size
    for token_id, token in enumerate(tokens):
        if token is None or token_id in special:
            continue
        if decoder_kind == "byte_level" and all(c in byte_decoder for c in token):
            result[token_id] = bytes(byte_decoder[c] for c in token)
        elif len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            result[token_id] = bytes([int(token[3:5], 16)])
        else:
            result[token_id] = token.replace("▁", " ").encode("utf-8")
        if result[token_id] == b"":
            result[token_id] = None
    return result


@dataclass(slots=True)
class TokenTrie:
    """The vocabulary as a byte trie: node 0 is the root."""

    children: list[list[tuple[int, int]]]  # node -> [(byte, child node)]
    token_ids: list[list[int]]  # node -> tokens whose bytes end here
    byte_strings: list[bytes | None]  # token id -> its bytes (None: never allowed)

    @classmethod
    def build(cls, byte_strings: list[bytes | None]) -> TokenTrie:
        child_maps: list[dict[int, int]] = [{}]
        token_ids: list[list[int]] = [[]]
        for token_id, data in enumerate(byte_strings):
            if not data:
                continue
            node = 0
            for byte in data:
                nxt = child_maps[node].get(byte)
                if nxt is None:
                    nxt = len(child_maps)
                    child_maps[node][byte] = nxt
                    child_maps.append({})
                    token_ids.append([])
                node = nxt
            token_ids[node].append(token_id)
        return cls(children=[sorted(m.items()) for m in child_maps], token_ids=token_ids,
                   byte_strings=list(byte_strings))


def allowed_token_ids(index: TokenIndex, state: int) -> list[int]:
    """Tokens whose whole byte string can be read from `state` of `index.dfa` without dying, walking
    `index.trie` and the DFA together (+ `index.eos_token_id` if the state is accepting), sorted."""
    transitions, children, trie_tokens = index.dfa.transitions, index.trie.children, index.trie.token_ids
    allowed: list[int] = []
    stack = [(0, state)]
    while stack:
        node, dfa_state = stack.pop()
        row = transitions[dfa_state]
        for byte, child in children[node]:
            nxt = row[byte]
            if nxt != DEAD:
                allowed.extend(trie_tokens[child])
                stack.append((child, nxt))
    if index.dfa.accepting[state] and index.eos_token_id is not None:
        allowed.append(index.eos_token_id)
    return sorted(allowed)


class TokenIndex:
    """Allowed-token bitmask for each DFA state, computed on first use and cached.

    `find_allowed` and `pack`: how a state's allowed tokens are found and packed (the grammar compiler,
    mini/structured_output/backend_mini.py, passes the ones its engine chose; the references by default).
    """

    def __init__(self, dfa: DFA, trie: TokenTrie, vocab_size: int, eos_token_id: int | None, *,
                 find_allowed: Callable[[TokenIndex, int], list[int]] = allowed_token_ids,
                 pack: Callable[[list[int], int], np.ndarray] = pack_allowed) -> None:
        self.dfa = dfa
        self.trie = trie
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self._find_allowed = find_allowed
        self._pack = pack
        self._masks: dict[int, np.ndarray] = {}
        self._counts: dict[int, int] = {}

    def allowed_token_ids(self, state: int) -> list[int]:
        """Tokens whose whole byte string can be read from `state` without dying (+ EOS if accepting)."""
        return self._find_allowed(self, state)

    def trie_bytes(self, token_id: int) -> bytes | None:
        """The bytes of `token_id` (None for special or unknown ids)."""
        strings = self.trie.byte_strings
        return strings[token_id] if 0 <= token_id < len(strings) else None

    def mask(self, state: int) -> np.ndarray:
        """Packed int32 row for `state` (cached)."""
        row = self._masks.get(state)
        if row is None:
            allowed = self.allowed_token_ids(state)
            row = self._pack(allowed, self.vocab_size)
            self._masks[state] = row
            self._counts[state] = len(allowed)
        return row

    def num_allowed(self, state: int) -> int:
        self.mask(state)
        return self._counts[state]

    def warm(self, max_states: int) -> None:
        """Fill the cache for the first `max_states` states (done on the compile thread)."""
        for state in range(min(max_states, self.dfa.num_states)):
            self.mask(state)
