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
from mini.structured_output.regex_nfa import NFA, build_nfa
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
class _LoopGuard(BaseException):
    """Raised from inside the learner's code when it reads far more epsilon lists than any closure needs (a
    BaseException, so that neither `calling` nor a learner's `except Exception` turns it into something else)."""


class _CountingEpsilon(list):
    """`nfa.epsilon` as the learner's closure sees it: a list that counts (and bounds) its lookups."""

    def __init__(self, items: list[list[int]], limit: int) -> None:
        super().__init__(items)
        self.lookups, self.limit = 0, limit

    def __getitem__(self, index):
        self.lookups += 1
        if self.lookups > self.limit:
            raise _LoopGuard()
        return super().__getitem__(index)


def _guarded_nfa(nfa: NFA) -> tuple[NFA, _CountingEpsilon]:
    epsilon = _CountingEpsilon(nfa.epsilon, limit=20 * nfa.num_states + 50)
    return NFA(edges=nfa.edges, epsilon=epsilon, start=nfa.start, accept=nfa.accept), epsilon


def _as_sorted(value: object) -> object:
    """A set-like result as a sorted list (states, token ids), for comparing and showing; anything else (None
    entries, say) as a list in its own order, or as it is."""
    if isinstance(value, (set, frozenset, list, tuple)):
        if all(isinstance(v, int) for v in value):
            return sorted(value)
        return list(value)
    return value


def _closure_hint(states: list[int], expected: frozenset, got: object) -> str:
    if not isinstance(got, (set, frozenset, list, tuple)) or not all(isinstance(state, int) for state in got):
        return f"return the closure as a frozenset of NFA states (ints), not a {type(got).__name__} of other things"
    got_set = set(got)
    if not set(states) <= got_set:
        return ("the states themselves are in the closure: a path of zero epsilon edges reaches them (the DFA "
                "state must hold the NFA states it starts from)")
    if got_set - expected:
        return ("follow epsilon edges alone (nfa.epsilon): a byte edge (nfa.edges) consumes a byte, so its "
                "target is not reached 'for free'")
    return ("follow epsilon edges transitively: a state reached through two or more epsilon edges is in the "
            "closure too (a state's targets have targets of their own)")


_HAND_MADE_NFAS = [
    # the worked example of the notebook, and a cycle of epsilon edges (as `a*` and `(a?)*` make)
    (NFA(edges=[[] for _ in range(5)], epsilon=[[1, 3], [2], [], [], [0]], start=0, accept=2), [[0], [4], [2, 4]]),
    (NFA(edges=[[] for _ in range(4)], epsilon=[[1], [2], [0, 3], []], start=0, accept=3), [[0], [1], [3]]),
]


@graded
def check_epsilon_closure(candidate: Callable, seeds: Iterable[int] = range(10)) -> None:
    reference = _reference("epsilon_closure")
    num_cases = 0
    cases = [(f"hand-made NFA {i}", nfa, starts) for i, (nfa, starts) in enumerate(_HAND_MADE_NFAS)]
    for pattern in _regexes(seeds):
        nfa = build_nfa(parse_regex(pattern))
        rng = random.Random(pattern)
        starts = [[nfa.start]] + [rng.sample(range(nfa.num_states), rng.randint(1, min(3, nfa.num_states)))
                                  for _ in range(3)]
        cases.append((pattern, nfa, starts))
    for pattern, nfa, starts in cases:
        for states in starts:
            inputs = {"regex": pattern, "states": states,
                      "epsilon edges": {s: t for s, t in enumerate(nfa.epsilon) if t}}
            expected = reference(nfa, list(states))
            guarded, epsilon = _guarded_nfa(nfa)
            argument = list(states)
            try:
                with calling("epsilon_closure", inputs, expected=sorted(expected)):
                    got = candidate(guarded, argument)
            except _LoopGuard:
                raise AssertionError(
                    f"epsilon_closure(nfa, states) did not stop: it read nfa.epsilon more than {epsilon.limit} "
                    f"times for an NFA of {nfa.num_states} states\n  inputs:\n"
                    + "\n".join(f"    {key} = {value}" for key, value in inputs.items())
                    + "\n  hint: epsilon edges can form cycles (a* loops back to where it started): remember "
                      "the states you have reached, and never expand a state twice") from None
            expect_equal("epsilon_closure(nfa, states)", inputs, sorted(expected), _as_sorted(got),
                         _closure_hint(states, expected, got))
            expect_equal("type of the result", inputs, "frozenset", type(got).__name__,
                         "return a frozenset: a DFA state is a set of NFA states, looked up in a dict, so it must "
                         "be hashable and must not change afterwards")
            expect_equal("the `states` argument after the call", inputs, list(states), argument,
                         "leave `states` as it was: the caller still owns it (use a stack of your own)")
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


_SUBSET_HINT = ("row d of the table holds the moves of the set you numbered d: for each class, the closure of "
                "the NFA targets of the edges covering that class (an edge lo..hi covers every class its bytes "
                "fall in), DEAD (-1) when no NFA state of the set moves; state 0 is the closure of nfa.start; "
                "each new set gets the next number when it is first found")


def _table_problem(result: object, num_classes: int) -> str | None:
    """What is malformed in a learner's (table, accepting), or None when it has the right shape."""
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        return "return a pair (table, accepting)"
    table, accepting = result
    try:
        rows = [list(row) for row in table]
        flags = list(accepting)
    except TypeError:
        return "table is a list of rows (lists of next states) and accepting a list of bools"
    if not rows:
        return "the table has no rows: DFA state 0 (the closure of nfa.start) always exists"
    if len(flags) != len(rows):
        return f"one accepting flag per DFA state: {len(rows)} rows but {len(flags)} flags"
    for state, row in enumerate(rows):
        if len(row) != num_classes:
            return f"one entry per byte class in every row: row {state} has {len(row)} entries, not {num_classes}"
        for target in row:
            if not isinstance(target, int) or not (target == DEAD or 0 <= target < len(rows)):
                return (f"row {state} holds {target!r}: a next state is the number of a row of the table, or "
                        f"DEAD (-1)")
    return None


def _subset_variant(nfa: NFA, class_of: list[int], *, close_start: bool = True, close_targets: bool = True,
                    classes: str = "all", merge: bool = True, empty_state: bool = False
                    ) -> tuple[list[list[int]], list[bool]]:
    """The subset construction with one plausible mistake switched on (for diagnosing a learner's table)."""
    closure = _reference("epsilon_closure")
    num_classes = max(class_of) + 1
    start = closure(nfa, [nfa.start]) if close_start else frozenset([nfa.start])
    ids, sets, table = {start: 0}, [start], []
    while len(table) < len(sets) and len(sets) < 500:
        moves: dict[int, set[int]] = {cls: set() for cls in range(num_classes)} if empty_state else {}
        for nfa_state in sets[len(table)]:
            for lo, hi, target in nfa.edges[nfa_state]:
                covered = {"all": range(class_of[lo], class_of[hi] + 1), "first": [class_of[lo]],
                           "no last": range(class_of[lo], class_of[hi])}[classes]
                for cls in covered:
                    if merge:
                        moves.setdefault(cls, set()).add(target)
                    else:
                        moves[cls] = {target}
        row = [DEAD] * num_classes
        for cls, targets in moves.items():
            found = closure(nfa, targets) if close_targets else frozenset(targets)
            if found not in ids:
                ids[found] = len(sets)
                sets.append(found)
            row[cls] = ids[found]
        table.append(row)
    return table, [nfa.accept in found for found in sets]


_SUBSET_VARIANTS = [
    ({"close_start": False},
     ("state 0 is the closure of nfa.start, not the set {nfa.start}: the start's epsilon edges are followed before "
      "any byte is read")),
    ({"close_targets": False},
     ("close every set of targets too (epsilon_closure): a DFA state is a set closed under epsilon edges, or a byte "
      "that follows an epsilon move is missed")),
    ({"classes": "first"},
     ("an edge lo..hi covers every class its bytes fall in, from class_of[lo] to class_of[hi], not only the first: "
      "the edges covering that class all move on it")),
    ({"classes": "no last"},
     ("an edge lo..hi covers the classes from class_of[lo] to class_of[hi], both ends included: the edges covering "
      "that class all move on it")),
    ({"merge": False},
     ("several edges (of one NFA state or of several) can move on one class: the next set is the union of all their "
      "targets, not the last one found")),
    ({"empty_state": True},
     ("a class on which no NFA state of the set moves leads to DEAD (-1), not to a state for the empty set: DEAD is "
      "what the token walk tests to prune, and a dead-end state would look alive")),
]


def _subset_hint(nfa: NFA, class_of: list[int], expected: tuple, got: tuple) -> str:
    """The hint for the plausible mistake that gives the learner's table, else the contract."""
    matching = [hint for options, hint in _SUBSET_VARIANTS
                if (variant := canonical(*_subset_variant(nfa, class_of, **options))) == got and variant != expected]
    return " Or: ".join(matching) if matching else _SUBSET_HINT


@graded
def check_subset_construction(candidate: Callable, seeds: Iterable[int] = range(10)) -> None:
    reference = _reference("subset_construction")
    num_cases = 0
    for pattern in _regexes(seeds):
        nfa = build_nfa(parse_regex(pattern))
        class_of = byte_classes(nfa)
        num_classes = max(class_of) + 1
        expected = canonical(*reference(nfa, class_of))
        inputs = {"regex": pattern, "num_nfa_states": nfa.num_states, "num_classes": num_classes}
        with calling("subset_construction", inputs):
            result = candidate(nfa, class_of)
        problem = _table_problem(result, num_classes)
        if problem is not None:
            expect_equal("subset_construction(nfa, class_of): the shape of the result", inputs,
                         "(table [state][class] -> state or DEAD, accepting [state])", _one_line_repr(result), problem)
        got = canonical([list(row) for row in result[0]], list(result[1]))
        inputs["states renumbered"] = "breadth-first from state 0, classes in order (any numbering is accepted)"
        hint = _subset_hint(nfa, class_of, expected, got) if got != expected else _SUBSET_HINT
        expect_same("subset_construction(nfa, class_of): the transition table", inputs, expected[0], got[0],
                    hint, axis_names=("dfa state", "byte class"))
        expect_same("subset_construction(nfa, class_of): the accepting flags", inputs, expected[1], got[1],
                    "a DFA state accepts when its set of NFA states holds nfa.accept", axis_names=("dfa state",))
        num_cases += 1
    passed("check_subset_construction", num_cases)


def _one_line_repr(value: object, limit: int = 200) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[:limit - 4] + " ..."


# ---------------------------------------------------------------- allowed_token_ids
def _random_vocab(rng: random.Random) -> list[bytes | None]:
    vocab: list[bytes | None] = [None]  # id 0: EOS, no bytes
    pieces = list(ALPHABET) + ["ab", "abb", "ca", "01", "-x", "x0", "bb", "cat", "cars", "s"]
    vocab += [piece.encode() for piece in rng.sample(pieces, rng.randint(6, len(pieces)))]
    return vocab


class _CountingRow(list):
    """One row of the DFA's transition table that counts its lookups (the walk's cost: DFA steps)."""

    def __init__(self, row: list[int], counter: list[int]) -> None:
        super().__init__(row)
        self.counter = counter

    def __getitem__(self, index):
        self.counter[0] += 1
        return super().__getitem__(index)


def _counting_index(dfa: DFA, vocab: list[bytes | None], eos_token_id: int | None) -> tuple[TokenIndex, list[int]]:
    """A TokenIndex over `dfa` whose transition rows count the DFA steps any walk takes."""
    counter = [0]
    counted = DFA(transitions=[_CountingRow(row, counter) for row in dfa.transitions], accepting=list(dfa.accepting))
    return TokenIndex(counted, TokenTrie.build(vocab), vocab_size=len(vocab), eos_token_id=eos_token_id), counter


def _allowed_hint(dfa: DFA, state: int, vocab: list[bytes | None], eos_token_id: int | None,
                  missing: list[int], extra: list[int]) -> str:
    """Which rule the learner's set breaks, from the first token it gets wrong."""
    got = sorted((set(_allowed_by_walk(dfa, state, vocab, eos_token_id)) - set(missing)) | set(extra), key=repr)
    eos = [eos_token_id] if dfa.accepting[state] and eos_token_id is not None else []
    variants = [
        (_allowed_by_walk(dfa, 0, vocab, eos_token_id) if state != 0 else None,
         (f"start the walk at `state` ({state}: where the output so far has led the DFA), not at the DFA's start "
          f"state 0")),
        ([t for t, data in enumerate(vocab) if data and all(dfa.transitions[state][b] != DEAD for b in data)] + eos,
         ("carry the DFA state along the walk: each byte of a token is read from the state the byte before it led "
          "to, not from `state` again")),
        ([t for t, data in enumerate(vocab) if data and len(data) == 1 and dfa.walk(data, state) != DEAD] + eos,
         ("tokens longer than one byte count too: go on down the trie below every live node, a token is allowed "
          "when its last byte is reached alive")),
    ]
    matching = [hint for variant, hint in variants if variant is not None and sorted(variant, key=repr) == got]
    if matching:
        return " Or: ".join(matching)
    if eos_token_id is not None and eos_token_id in extra:
        return "EOS is allowed only in an accepting state: ending there would leave the output unfinished"
    if eos_token_id is not None and eos_token_id in missing:
        return "in an accepting state EOS is allowed too (self.eos_token_id): the output may end here"
    if missing:
        data = vocab[missing[0]] or b""
        end = dfa.walk(data, state)
        accepting = "an accepting state" if dfa.accepting[end] else "a live state that is not accepting"
        return (f"token {missing[0]} ({data!r}) is allowed from state {state}: reading all its bytes stays alive, "
                f"its last byte is reached alive, in {accepting} (a token need not end the match, the next tokens can "
                f"finish it)")
    if extra:
        token = extra[0]
        if not isinstance(token, int) or not 0 <= token < len(vocab):
            return f"{token!r} is not a token id of this vocabulary: the ids are the trie's (self.trie.token_ids)"
        data = vocab[token] or b""
        position, walk_state = 0, state
        for position, byte in enumerate(data):  # noqa: B007 - `position` is read after the loop
            walk_state = dfa.transitions[walk_state][byte]
            if walk_state == DEAD:
                break
        return (f"token {token} ({data!r}) is not allowed from state {state}: the DFA dies on its byte {position} "
                f"({data[position:position + 1]!r}), and stays dead: never step on from DEAD (-1 would index the "
                f"last row of the table); only tokens read alive to their last byte are allowed")
    return "compare the allowed sets token by token"


def _allowed_by_walk(dfa: DFA, state: int, vocab: list[bytes | None], eos_token_id: int | None) -> list[int]:
    """The allowed set by definition (each token read on its own), for diagnosing a learner's set."""
    allowed = [t for t, data in enumerate(vocab) if data and dfa.walk(data, state) != DEAD]
    if dfa.accepting[state] and eos_token_id is not None:
        allowed.append(eos_token_id)
    return allowed


_WALK_VOCAB: list[bytes | None] = [None] + [b"a" * n for n in range(1, 13)] + [b"ab" * n for n in range(1, 6)] + [
    b"b" * n for n in range(1, 7)] + [b"ac", b"abc", b"c"]


def _check_walk_cost(candidate: Callable, reference: Callable) -> int:
    """The design requirement: tokens that share a prefix share its walk, and a dead branch is not walked."""
    num_cases = 0
    for pattern in ["(a|b)*c", "a*b?"]:
        dfa: DFA = build_dfa(build_nfa(parse_regex(pattern)))
        for state in range(dfa.num_states):
            reference_index, reference_steps = _counting_index(dfa, _WALK_VOCAB, 0)
            expected = reference(reference_index, state)
            learner_index, learner_steps = _counting_index(dfa, _WALK_VOCAB, 0)
            inputs = {"regex": pattern, "state": state,
                      "vocab": "EOS, 'a' .. 'aaaaaaaaaaaa' (12 tokens, each a prefix of the next), 'ab' .. "
                               "'ababababab', 'b' .. 'bbbbbb', 'ac', 'abc', 'c'",
                      "bytes in all tokens": sum(len(t or b"") for t in _WALK_VOCAB)}
            with calling("allowed_token_ids", inputs, expected=expected):
                got = candidate(learner_index, state)
            got = _as_sorted(got)
            if got != expected:
                hint = "return a list of token ids (ints)"
                if isinstance(got, list) and all(isinstance(t, (int, type(None))) for t in got):
                    hint = _allowed_hint(dfa, state, _WALK_VOCAB, 0, sorted(set(expected) - set(got)),
                                         sorted(set(got) - set(expected), key=repr))
                expect_equal("allowed_token_ids(self, state)", inputs, expected, got, hint)
            bound = 2 * reference_steps[0] + 8
            expect_equal(
                "DFA steps taken (lookups in self.dfa.transitions)", inputs,
                f"<= {bound} (a walk that steps through each shared prefix once takes {reference_steps[0]})",
                f"{learner_steps[0]} steps",
                "tokens that share a prefix must share its walk: walk the vocabulary's trie together with the DFA "
                "(self.trie.children), so 'aaaa' reuses the state 'aaa' reached, instead of reading every token "
                "from `state` on its own; and stop at a dead byte, the whole subtree below it is dead",
                equal=lambda expected, got, steps=learner_steps[0], bound=bound: steps <= bound)
            num_cases += 1
    return num_cases


@graded
def check_allowed_token_ids(candidate: Callable, seeds: Iterable[int] = range(10)) -> None:
    reference = _reference("allowed_token_ids")
    num_cases = 0
    for index, pattern in enumerate(_regexes(seeds)):
        vocab = _random_vocab(random.Random(index))
        eos_token_id = None if index % 5 == 3 else 0   # a tokenizer may have no EOS: then none is ever allowed
        dfa: DFA = build_dfa(build_nfa(parse_regex(pattern)))
        token_index = TokenIndex(dfa, TokenTrie.build(vocab), vocab_size=len(vocab), eos_token_id=eos_token_id)
        for state in range(dfa.num_states):
            expected = reference(token_index, state)
            inputs = {"regex": pattern, "state": state, "accepting": dfa.accepting[state],
                      "eos_token_id": eos_token_id, "vocab": {i: b for i, b in enumerate(vocab) if b}}
            with calling("allowed_token_ids", inputs, expected=expected):
                got = candidate(token_index, state)
            got = _as_sorted(got)
            hint = "return a list of token ids (ints)"
            if isinstance(got, list) and all(isinstance(t, (int, type(None))) for t in got) and got != expected:
                missing = sorted(set(expected) - set(got))
                extra = sorted(set(got) - set(expected), key=repr)
                inputs["tokens wrongly left out (their bytes)"] = {t: vocab[t] or "EOS" for t in missing}
                inputs["tokens wrongly allowed (their bytes)"] = {
                    t: (vocab[t] or "EOS") if isinstance(t, int) and 0 <= t < len(vocab) else "not a token id"
                    for t in extra}
                hint = _allowed_hint(dfa, state, vocab, eos_token_id, missing, extra)
                if not missing and not extra:
                    hint = "each allowed token once (a token id appears at one trie node only)"
            expect_equal("allowed_token_ids(self, state)", inputs, expected, got, hint)
            num_cases += 1
    num_cases += _check_walk_cost(candidate, reference)
    passed("check_allowed_token_ids", num_cases)


# ---------------------------------------------------------------- pack_allowed
def _bit(words: np.ndarray, token: int) -> int:
    word = token // 32
    return int((int(words[word]) & 0xFFFFFFFF) >> (token % 32) & 1) if word < len(words) else 0


def _pack_raised_hint(error: Exception) -> str:
    if isinstance(error, OverflowError):
        return ("bit 31 of a word is the int32 sign bit: 1 << 31 does not fit an int32, so build each word as an "
                "unsigned 32-bit value (or a Python int) and reinterpret its bits as int32 at the end")
    if isinstance(error, IndexError):
        return ("every token below vocab_size needs its word: ceil(vocab_size / 32) words, so a vocabulary of 40 "
                "has 2 words and token 39 is bit 7 of word 1")
    return "run the same call in a notebook cell: the traceback shows which of your lines raised"


def _pack_hint(allowed: list[int], expected: np.ndarray, got: np.ndarray, vocab_size: int) -> str:
    wrong = [t for t in range(vocab_size) if _bit(expected, t) != _bit(got, t)]
    if not wrong:
        return "the bits past the vocabulary (in the last word) stay 0"
    if len(set(allowed)) != len(allowed) and any(allowed.count(t) > 1 for t in allowed):
        repeated = next(t for t in allowed if allowed.count(t) > 1)
        if any(abs(t - repeated) <= 1 or t // 32 == repeated // 32 for t in wrong):
            return (f"an id may come more than once (token {repeated} here): setting a bit that is already set "
                    f"must leave it set; adding its value again carries into the next bit")
    if all(t % 32 == 31 for t in wrong):
        return "bit 31 is token 32 * w + 31: with the sign bit set the int32 word is negative, and that is right"
    return "token t is bit t % 32 of word t // 32, counted from the least significant bit (bit 0)"


@graded
def check_pack_allowed(candidate: Callable, seeds: Iterable[int] = range(20)) -> None:
    reference = _reference("pack_allowed")
    cases = [([0, 1, 31, 33], 40), ([0, 1, 31], 32), ([31, 32], 40), ([], 5), (list(range(70)), 70),
             ([63, 0, 40, 5], 64), ([5, 3, 5, 36, 3], 40)]   # unsorted; repeated ids
    for seed in seeds:
        rng = random.Random(seed)
        vocab_size = rng.randint(1, 200)
        cases.append((sorted(rng.sample(range(vocab_size), rng.randint(0, vocab_size))), vocab_size))
    for allowed, vocab_size in cases:
        expected = reference(allowed, vocab_size)
        inputs = {"allowed_ids": allowed, "vocab_size": vocab_size}
        try:
            returned = candidate(list(allowed), vocab_size)
        except Exception as error:
            with calling("pack_allowed", inputs, expected=expected.tolist(), hint=_pack_raised_hint(error)):
                raise error from None
        try:
            got = np.asarray(returned)
        except Exception:  # noqa: BLE001 - a learner's odd return value: shown, not raised
            got = np.asarray(repr(returned))
        expect_equal("pack_allowed(...) dtype and shape", inputs, ("int32", expected.shape),
                     (str(got.dtype), got.shape),
                     "one int32 word per 32 tokens: ceil(vocab_size / 32) words (no spare word when vocab_size "
                     "is a multiple of 32), as a numpy int32 array")
        wrong_tokens = [t for t in range(vocab_size) if _bit(expected, t) != _bit(got, t)]
        if wrong_tokens:
            t = wrong_tokens[0]
            inputs["first wrong token"] = (f"token {t} (bit {t % 32} of word {t // 32}): expected "
                                           f"{'allowed' if _bit(expected, t) else 'not allowed'}, got "
                                           f"{'allowed' if _bit(got, t) else 'not allowed'}")
        expect_same("pack_allowed(...)", inputs, expected, got, _pack_hint(list(allowed), expected, got, vocab_size),
                    axis_names=("word",))
    passed("check_pack_allowed", len(cases))


# ---------------------------------------------------------------- apply_token_bitmask_inplace
_APPLY_HINT = ("in place: -inf for every token whose bit is 0, in logits row indices[i] for bitmask row i (row i "
               "when indices is None); other rows untouched")


def _apply_cases(seeds: Iterable[int]) -> list[dict]:
    """The worked example of the notebook, a case with bit 31 set, then seeded random ones (rows in random order)."""
    cases = [
        {"shape": (2, 40), "rows": [1, 0], "allowed": [[1, 5, 33], [63]], "seed": 0},
        {"shape": (2, 40), "rows": None, "allowed": [[1, 5, 33], [1, 5, 33]], "seed": 1},
        {"shape": (3, 70), "rows": [2, 0], "allowed": [[31, 32, 63, 64], [0, 31, 69]], "seed": 2},
    ]
    for seed in seeds:
        rng = random.Random(seed)
        num_rows, vocab_size = rng.randint(1, 5), rng.randint(1, 100)
        rows = rng.sample(range(num_rows), rng.randint(1, num_rows))   # any order: the batch's, not sorted
        cases.append({"shape": (num_rows, vocab_size), "rows": rows, "seed": seed + 3,
                      "allowed": [rng.sample(range(vocab_size), rng.randint(0, vocab_size)) for _ in rows]})
    return cases


def _apply_hint(case: dict, logits: torch.Tensor, bitmask: torch.Tensor, got: torch.Tensor) -> str:
    """Which plausible mistake gives `got`: the reference run on the inputs that mistake amounts to."""
    reference = _reference("apply_token_bitmask_inplace")
    indices = None if case["rows"] is None else torch.tensor(case["rows"])
    rows = case["rows"] if case["rows"] is not None else list(range(case["shape"][0]))
    untouched = [row for row in range(case["shape"][0]) if row not in rows]
    if any(not torch.equal(got[row], logits[row]) for row in untouched):
        return "a row that is not in `indices` is not constrained: leave it untouched. " + _APPLY_HINT
    if torch.equal(got, logits):
        return ("nothing changed in `logits`: edit the tensor you are given, in place (indexing with a tensor of "
                "rows, logits[rows], makes a copy: assign back into logits[rows])")

    def run(mask: torch.Tensor, row_indices: torch.Tensor | None) -> torch.Tensor:
        return reference(logits.clone(), mask, row_indices)

    expected = run(bitmask, indices)
    reversed_bits = torch.zeros_like(bitmask)
    for bit in range(32):
        reversed_bits |= ((bitmask >> bit) & 1) << (31 - bit)
    alternatives = []
    if indices is not None:
        alternatives += [
            (run(bitmask, torch.arange(len(rows))),
             (f"bitmask row i is the mask of logits row indices[i] (here {case['rows']}): not of logits row i, and "
              f"the rows come in the batch's order, not sorted. ")),
            (run(bitmask, indices.sort().values),
             (f"bitmask row i is the mask of logits row indices[i] (here {case['rows']}): the rows come in the "
              f"batch's order, not sorted. ")),
        ]
    alternatives += [
        (run(bitmask & 0x7FFFFFFF, indices),
         ("bit 31 is the sign bit of an int32 word: a word with bit 31 set is negative, so test that bit without "
          "comparing a signed value with 0. ")),
        (run(reversed_bits, indices),
         "token t is bit t % 32 of word t // 32, counted from the least significant bit (bit 0). "),
    ]
    for alternative, hint in alternatives:
        if torch.equal(got, alternative) and not torch.equal(alternative, expected):
            return hint + _APPLY_HINT
    return _APPLY_HINT


@graded
def check_apply_token_bitmask_inplace(candidate: Callable, seeds: Iterable[int] = range(10)) -> None:
    reference = _reference("apply_token_bitmask_inplace")
    pack = _reference("pack_allowed")
    num_cases = 0
    for case in _apply_cases(seeds):
        num_rows, vocab_size = case["shape"]
        bitmask = torch.from_numpy(np.stack([pack(a, vocab_size) for a in case["allowed"]]))
        logits = torch.randn(num_rows, vocab_size, generator=torch.Generator().manual_seed(case["seed"]))
        indices = None if case["rows"] is None else torch.tensor(case["rows"])
        expected = reference(logits.clone(), bitmask.clone(), indices)
        inputs = {"logits.shape": tuple(logits.shape), "indices": case["rows"],
                  "bitmask.shape": tuple(bitmask.shape), "allowed per bitmask row": case["allowed"]}
        mine = logits.clone()
        with calling("apply_token_bitmask_inplace", inputs, hint=_APPLY_HINT):
            returned = candidate(mine, bitmask.clone(), None if indices is None else indices.clone())
        if not torch.equal(expected, mine):
            expect_same("logits after apply_token_bitmask_inplace", inputs, expected, mine,
                        _apply_hint(case, logits, bitmask, mine), axis_names=("logits row", "token"))
        same_tensor = isinstance(returned, torch.Tensor) and (returned is mine or torch.equal(returned, mine))
        expect_equal("the returned tensor", inputs, "the logits tensor, edited",
                     "the logits tensor, edited" if same_tensor else f"a {type(returned).__name__}",
                     "return the logits tensor you edited")
        num_cases += 1
    with calling("apply_token_bitmask_inplace", {"note": "8 rows x 64 tokens, then 8 rows x 2048 tokens"}):
        few, many = _count_bitmask_calls(candidate, 8, 64), _count_bitmask_calls(candidate, 8, 2048)
    expect_equal(
        "apply_token_bitmask_inplace is vectorized",
        {"torch calls for 8 rows x 64 tokens": few},
        f"<= {few + 8} calls for 8 rows x 2048 tokens",
        f"{many} calls for 8 rows x 2048 tokens",
        "no Python loop over tokens or words: unpack every bit of every word at once (a shift by each of the 32 "
        "bit positions, broadcast), then mask the selected rows in one operation",
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
             part="allowed_token_ids",
             design="the token walk: find a DFA state's allowed tokens sharing every common prefix's walk and "
                    "pruning dead branches, within the check's measured bound on DFA steps"),
    Exercise("pack_allowed", check_pack_allowed, points=2, grade_id="test-pack-allowed", part="pack_allowed"),
    Exercise("apply_token_bitmask_inplace", check_apply_token_bitmask_inplace, points=2,
             grade_id="test-apply-bitmask", part="apply_token_bitmask_inplace"),
))
