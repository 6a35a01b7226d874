"""Checks for phase 11 (structured output), against mini.structured_output.

    check_epsilon_closure(epsilon_closure)           vs mini.structured_output.dfa.epsilon_closure
    check_subset_construction(subset_construction)   vs mini.structured_output.dfa.subset_construction
    check_allowed_token_ids(allowed_token_ids)       vs mini.structured_output.token_index.TokenIndex.allowed_token_ids
    check_pack_allowed(pack_allowed)                 vs mini.structured_output.token_index.pack_allowed
    check_apply_token_bitmask_inplace(apply_token_bitmask_inplace)  vs mini.structured_output.bitmask
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

import numpy as np
import torch

from labs.checks.common import CountTorchCalls, calling, expect_equal, expect_same, passed
from labs.checks.grading import graded
from labs.manifest import Exercise, Phase
from mini import roles
from mini.structured_output.dfa import DEAD, DFA, build_dfa, byte_classes
from mini.structured_output.regex_nfa import build_nfa
from mini.structured_output.regex_parser import parse_regex
from mini.structured_output.token_index import TokenIndex, TokenTrie

FIXED_REGEXES = ["ab|c", "(a|b)*abb", "a?b+", "[0-9]{1,2}-x", "(cat|car)s?"]
ALPHABET = "abc01-x"


def _reference(name: str) -> Callable:
    return roles.reference(name)


def _random_regex(rng: random.Random, depth: int = 2) -> str:
    """A small random regex over ALPHABET (literals, classes, groups, |, *, +, ?, {m,n})."""
    parts = []
    for _ in range(rng.randint(1, 3)):
        kind = rng.random()
        if depth > 0 and kind < 0.3:
            atom = f"({_random_regex(rng, depth - 1)}|{_random_regex(rng, depth - 1)})"
        elif kind < 0.5:
            atom = "[" + "".join(sorted(set(rng.sample(ALPHABET, rng.randint(1, 3))))).replace("-", "\\-") + "]"
        else:
            atom = rng.choice(ALPHABET).replace("-", "\\-")
        atom += rng.choice(["", "", "*", "+", "?", "{1,2}"])
        parts.append(atom)
    return "".join(parts)


def _regexes(seeds: Iterable[int]) -> list[str]:
    regexes = list(FIXED_REGEXES)
    for seed in seeds:
        regexes.append(_random_regex(random.Random(seed)))
    return regexes


# ---------------------------------------------------------------- epsilon_closure
@graded
def check_epsilon_closure(candidate: Callable, seeds: Iterable[int] = range(10)) -> None:
    reference = _reference("epsilon_closure")
    num_cases = 0
    for pattern in _regexes(seeds):
        nfa = build_nfa(parse_regex(pattern))
        rng = random.Random(pattern)
        starts = [[nfa.start]] + [rng.sample(range(nfa.num_states), rng.randint(1, min(3, nfa.num_states)))
                                  for _ in range(3)]
        for states in starts:
            inputs = {"regex": pattern, "states": states, "epsilon edges": {s: t for s, t in enumerate(nfa.epsilon) if t}}
            expected = reference(nfa, list(states))
            with calling("epsilon_closure", inputs, expected=sorted(expected)):
                got = candidate(nfa, list(states))
            expect_equal("epsilon_closure(nfa, states)", inputs, sorted(expected), sorted(got),
                         "follow epsilon edges (nfa.epsilon[s]) from every state, transitively; the states "
                         "themselves are in the closure")
            expect_equal("type of the result", inputs, "frozenset", type(got).__name__,
                         "return a frozenset: DFA states are looked up by it in a dict")
            num_cases += 1
    passed("check_epsilon_closure", num_cases)


# ---------------------------------------------------------------- subset_construction
def canonical(table: list[list[int]], accepting: list[bool]) -> tuple[list[list[int]], list[bool]]:
    """Renumber a DFA's states in breadth-first order from state 0 (classes in order): equal up to naming."""
    order, queue = {0: 0}, [0]
    for state in queue:
        for target in table[state]:
            if target != DEAD and target not in order:
                order[target] = len(order)
                queue.append(target)
    renamed = [[DEAD if t == DEAD else order[t] for t in table[old]] for old in queue]
    return renamed, [bool(accepting[old]) for old in queue]


@graded
def check_subset_construction(candidate: Callable, seeds: Iterable[int] = range(10)) -> None:
    reference = _reference("subset_construction")
    num_cases = 0
    for pattern in _regexes(seeds):
        nfa = build_nfa(parse_regex(pattern))
        class_of = byte_classes(nfa)
        expected = canonical(*reference(nfa, class_of))
        inputs = {"regex": pattern, "num_nfa_states": nfa.num_states, "num_classes": max(class_of) + 1}
        with calling("subset_construction", inputs):
            table, accepting = candidate(nfa, class_of)
        got = canonical([list(row) for row in table], list(accepting))
        inputs["states renumbered"] = "breadth-first from state 0, classes in order (any numbering is accepted)"
        expect_same("subset_construction(nfa, class_of): the transition table", inputs, expected[0], got[0],
                    "state 0 = closure of nfa.start; for each class, move every NFA state of the set along the "
                    "edges covering that class (an edge lo..hi covers classes class_of[lo]..class_of[hi]), "
                    "close the result, number new sets as found; DEAD (-1) when no NFA state moves",
                    axis_names=("dfa state", "byte class"))
        expect_same("subset_construction(nfa, class_of): the accepting flags", inputs, expected[1], got[1],
                    "a DFA state accepts when its set of NFA states holds nfa.accept", axis_names=("dfa state",))
        num_cases += 1
    passed("check_subset_construction", num_cases)


# ---------------------------------------------------------------- allowed_token_ids
def _random_vocab(rng: random.Random) -> list[bytes | None]:
    vocab: list[bytes | None] = [None]  # id 0: EOS, no bytes
    pieces = list(ALPHABET) + ["ab", "abb", "ca", "01", "-x", "x0", "bb", "cat", "cars", "s"]
    vocab += [piece.encode() for piece in rng.sample(pieces, rng.randint(6, len(pieces)))]
    return vocab


@graded
def check_allowed_token_ids(candidate: Callable, seeds: Iterable[int] = range(10)) -> None:
    reference = _reference("allowed_token_ids")
    num_cases = 0
    for index, pattern in enumerate(_regexes(seeds)):
        vocab = _random_vocab(random.Random(index))
        dfa: DFA = build_dfa(build_nfa(parse_regex(pattern)))
        token_index = TokenIndex(dfa, TokenTrie.build(vocab), vocab_size=len(vocab), eos_token_id=0)
        for state in range(dfa.num_states):
            expected = reference(token_index, state)
            inputs = {"regex": pattern, "state": state, "accepting": dfa.accepting[state],
                      "vocab": {i: b for i, b in enumerate(vocab) if b}}
            with calling("allowed_token_ids", inputs, expected=expected):
                got = candidate(token_index, state)
            got = sorted(got)
            if got != expected:
                missing = sorted(set(expected) - set(got))
                extra = sorted(set(got) - set(expected))
                inputs["tokens wrongly left out (their bytes)"] = {t: vocab[t] or "EOS" for t in missing}
                inputs["tokens wrongly allowed (their bytes)"] = {t: vocab[t] or "EOS" for t in extra}
            expect_equal("allowed_token_ids(self, state)", inputs, expected, got,
                         "walk the trie (self.trie.children / token_ids) and the DFA (self.dfa.transitions) "
                         "together from `state`; a token is allowed if its last byte is reached alive; add "
                         "self.eos_token_id when the state is accepting")
            num_cases += 1
    passed("check_allowed_token_ids", num_cases)


# ---------------------------------------------------------------- pack_allowed
def _bit(words: np.ndarray, token: int) -> int:
    word = token // 32
    return int((int(words[word]) & 0xFFFFFFFF) >> (token % 32) & 1) if word < len(words) else 0


@graded
def check_pack_allowed(candidate: Callable, seeds: Iterable[int] = range(20)) -> None:
    reference = _reference("pack_allowed")
    cases = [([0, 1, 31], 32), ([31, 32], 40), ([], 5), (list(range(70)), 70)]
    for seed in seeds:
        rng = random.Random(seed)
        vocab_size = rng.randint(1, 200)
        cases.append((sorted(rng.sample(range(vocab_size), rng.randint(0, vocab_size))), vocab_size))
    for allowed, vocab_size in cases:
        expected = reference(allowed, vocab_size)
        inputs = {"allowed_ids": allowed, "vocab_size": vocab_size}
        with calling("pack_allowed", inputs, expected=expected.tolist()):
            got = np.asarray(candidate(list(allowed), vocab_size))
        expect_equal("pack_allowed(...) dtype and shape", inputs, ("int32", expected.shape), (str(got.dtype), got.shape),
                     "one int32 word per 32 tokens: ceil(vocab_size / 32) words")
        wrong_tokens = [t for t in range(vocab_size) if _bit(expected, t) != _bit(got, t)]
        if wrong_tokens:
            t = wrong_tokens[0]
            inputs["first wrong token"] = (f"token {t} (bit {t % 32} of word {t // 32}): expected "
                                           f"{'allowed' if _bit(expected, t) else 'not allowed'}, got "
                                           f"{'allowed' if _bit(got, t) else 'not allowed'}")
        expect_same("pack_allowed(...)", inputs, expected, got,
                    "token t is bit t % 32 of word t // 32 (bit 31 set makes the int32 negative)",
                    axis_names=("word",))
    passed("check_pack_allowed", len(cases))


# ---------------------------------------------------------------- apply_token_bitmask_inplace
@graded
def check_apply_token_bitmask_inplace(candidate: Callable, seeds: Iterable[int] = range(10)) -> None:
    reference = _reference("apply_token_bitmask_inplace")
    pack = _reference("pack_allowed")
    num_cases = 0
    for seed in [None, *seeds]:
        rng = random.Random(seed)
        num_rows, vocab_size = (2, 40) if seed is None else (rng.randint(1, 5), rng.randint(1, 100))
        rows = list(range(num_rows)) if seed is None else sorted(rng.sample(range(num_rows), rng.randint(1, num_rows)))
        allowed = [[1, 5, 33] if seed is None else rng.sample(range(vocab_size), rng.randint(0, vocab_size))
                   for _ in rows]
        bitmask = torch.from_numpy(np.stack([pack(a, vocab_size) for a in allowed]))
        logits = torch.randn(num_rows, vocab_size, generator=torch.Generator().manual_seed(seed or 0))
        indices = None if seed is None else torch.tensor(rows)
        expected = reference(logits.clone(), bitmask.clone(), indices)
        inputs = {"logits.shape": tuple(logits.shape), "rows": rows, "allowed per row": allowed}
        mine = logits.clone()
        with calling("apply_token_bitmask_inplace", inputs):
            returned = candidate(mine, bitmask.clone(), None if indices is None else indices.clone())
        expect_same("logits after apply_token_bitmask_inplace", inputs, expected, mine,
                    "in place: -inf for every token whose bit is 0 in rows `indices` (all rows if None); "
                    "other rows untouched", axis_names=("logits row", "token"))
        expect_equal("the returned tensor", inputs, True, returned is mine or torch.equal(returned, mine),
                     "return the logits tensor you edited")
        num_cases += 1
    with calling("apply_token_bitmask_inplace", {"note": "8 rows x 64 tokens, then 8 rows x 2048 tokens"}):
        few, many = _count_bitmask_calls(candidate, 8, 64), _count_bitmask_calls(candidate, 8, 2048)
    expect_equal(
        "apply_token_bitmask_inplace is vectorized",
        {"torch calls for 8 rows x 64 tokens": few},
        f"<= {few + 8} calls for 8 rows x 2048 tokens",
        f"{many} calls for 8 rows x 2048 tokens",
        "no Python loop over tokens or words: shift every word by arange(32) at once, keep the lowest "
        "bit, flatten to [n, 32 * words], and mask the rows with one masked_fill",
        equal=lambda expected, got: many <= few + 8,
    )
    passed("check_apply_token_bitmask_inplace", num_cases + 1)


def _count_bitmask_calls(candidate: Callable, num_rows: int, vocab_size: int) -> int:
    rng = random.Random(vocab_size)
    pack = _reference("pack_allowed")
    bitmask = torch.from_numpy(np.stack([pack(rng.sample(range(vocab_size), vocab_size // 2), vocab_size)
                                         for _ in range(num_rows)]))
    logits = torch.randn(2 * num_rows, vocab_size, generator=torch.Generator().manual_seed(num_rows))
    indices = torch.arange(0, 2 * num_rows, 2)
    with CountTorchCalls() as counter:
        candidate(logits, bitmask, indices)
    return counter.count


PHASE = Phase("11_structured_output", (
    Exercise("epsilon_closure", check_epsilon_closure, points=2, grade_id="test-epsilon-closure",
             part="epsilon_closure"),
    Exercise("subset_construction", check_subset_construction, points=3, grade_id="test-subset-construction",
             part="subset_construction"),
    Exercise("allowed_token_ids", check_allowed_token_ids, points=3, grade_id="test-allowed-token-ids",
             part="allowed_token_ids"),
    Exercise("pack_allowed", check_pack_allowed, points=2, grade_id="test-pack-allowed", part="pack_allowed"),
    Exercise("apply_token_bitmask_inplace", check_apply_token_bitmask_inplace, points=2,
             grade_id="test-apply-bitmask", part="apply_token_bitmask_inplace"),
))
