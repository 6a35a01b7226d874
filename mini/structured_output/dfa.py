"""NFA -> DFA over bytes (subset construction), trimmed of dead states and minimized.

The third stage of mini's grammar compiler (vLLM leaves it to the backend: xgrammar compiles regexes
to an FSM in C++, outlines-core builds a DFA in Rust). Three steps, each a textbook algorithm:

1. **Byte classes**: bytes that every NFA edge treats alike are one class (for a JSON grammar ~30
   classes instead of 256), so each DFA state looks at each class once.
2. **Subset construction**: a DFA state is the epsilon-closure of a set of NFA states.
3. **Trim + minimize**: states from which no accepting state can be reached are dropped (a walk that
   enters one could never finish: that transition becomes "dead", -1), then Moore's partition
   refinement merges states with the same future.

The result: `transitions[state][byte] -> next state or -1`, `accepting[state]`, start state 0.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from mini.structured_output.regex_nfa import NFA

DEAD = -1
MAX_DFA_STATES = 20_000


@dataclass(slots=True)
class DFA:
    transitions: list[list[int]]  # [num_states][256] -> next state or DEAD
    accepting: list[bool]

    @property
    def num_states(self) -> int:
        return len(self.accepting)

    def walk(self, data: bytes, state: int = 0) -> int:
        """The state after reading `data` from `state` (DEAD once the walk leaves the language)."""
        for byte in data:
            if state == DEAD:
                break
            state = self.transitions[state][byte]
        return state

    def matches(self, data: bytes) -> bool:
        state = self.walk(data)
        return state != DEAD and self.accepting[state]


def byte_classes(nfa: NFA) -> list[int]:
    """class_of[byte]: bytes no NFA edge tells apart share a class."""
    cuts = {0, 256}
    for edges in nfa.edges:
        for lo, hi, _ in edges:
            cuts.update((lo, hi + 1))
    bounds = sorted(cuts)
    class_of = [0] * 256
    for index, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        class_of[lo:hi] = [index] * (hi - lo)
    return class_of


def epsilon_closure(nfa: NFA, states) -> frozenset[int]:
    """Every NFA state reachable from `states` by epsilon edges alone (`states` included)."""
    seen, stack = set(states), list(states)
    while stack:
        for target in nfa.epsilon[stack.pop()]:
            if target not in seen:
                seen.add(target)
                stack.append(target)
    return frozenset(seen)


def subset_construction(nfa: NFA, class_of: list[int], *, epsilon_closure=epsilon_closure
                        ) -> tuple[list[list[int]], list[bool]]:
    """-> (transitions [state][class], accepting) with start state 0; DEAD for no move.

    DFA state 0 is the epsilon-closure of the NFA's start; new sets are numbered as they are found. A
    DFA state is accepting when its set holds `nfa.accept`. `epsilon_closure`: the closure to use (the
    grammar compiler passes its own, mini/structured_output/backend_mini.py).
    """
    num_classes = max(class_of) + 1
    start = epsilon_closure(nfa, [nfa.start])
    ids = {start: 0}
    sets = [start]
    table: list[list[int]] = []
    while len(table) < len(sets):
        current = sets[len(table)]
        moves: dict[int, set[int]] = {}
        for nfa_state in current:
            for lo, hi, target in nfa.edges[nfa_state]:
                for cls in range(class_of[lo], class_of[hi] + 1):
                    moves.setdefault(cls, set()).add(target)
        row = [DEAD] * num_classes
        for cls, targets in moves.items():
            closure = epsilon_closure(nfa, targets)
            if closure not in ids:
                if len(sets) >= MAX_DFA_STATES:
                    raise ValueError(f"grammar is too large: its DFA exceeds {MAX_DFA_STATES} states")
                ids[closure] = len(sets)
                sets.append(closure)
            row[cls] = ids[closure]
        table.append(row)
    return table, [nfa.accept in s for s in sets]


def trim(table: list[list[int]], accepting: list[bool]) -> tuple[list[list[int]], list[bool]]:
    """Drop states that cannot reach an accepting state; renumber (start stays 0 if it survives)."""
    reverse: list[set[int]] = [set() for _ in table]
    for state, row in enumerate(table):
        for target in row:
            if target != DEAD:
                reverse[target].add(state)
    live = {s for s, acc in enumerate(accepting) if acc}
    stack = list(live)
    while stack:
        for source in reverse[stack.pop()]:
            if source not in live:
                live.add(source)
                stack.append(source)
    if 0 not in live:
        raise ValueError("the grammar admits no string")
    order = sorted(live)
    new_id = {old: new for new, old in enumerate(order)}
    new_table = [[new_id.get(t, DEAD) for t in table[old]] for old in order]
    return new_table, [accepting[old] for old in order]


def minimize(table: list[list[int]], accepting: list[bool]) -> tuple[list[list[int]], list[bool]]:
    """Moore's partition refinement: merge states with identical futures. Start state stays 0."""
    block = [1 if acc else 0 for acc in accepting]
    num_blocks = len(set(block))
    while True:
        signatures: dict[tuple, int] = {}
        new_block = []
        for state, row in enumerate(table):
            key = (block[state], *(DEAD if t == DEAD else block[t] for t in row))
            new_block.append(signatures.setdefault(key, len(signatures)))
        block = new_block
        if len(signatures) == num_blocks:
            break
        num_blocks = len(signatures)
    # Renumber so that the start state's block is 0, in order of first appearance.
    order: dict[int, int] = {}
    for b in block:
        order.setdefault(b, len(order))
    representatives: dict[int, int] = {}
    for state, b in enumerate(block):
        representatives.setdefault(order[b], state)
    new_table = [[DEAD if t == DEAD else order[block[t]] for t in table[representatives[i]]]
                 for i in range(len(order))]
    return new_table, [accepting[representatives[i]] for i in range(len(order))]


def build_dfa(nfa: NFA, *, subset_construction=subset_construction) -> DFA:
    """NFA -> trimmed, minimized DFA with a dense [state][byte] table (`subset_construction`: step 2)."""
    class_of = byte_classes(nfa)
    table, accepting = subset_construction(nfa, class_of)
    table, accepting = trim(table, accepting)
    table, accepting = minimize(table, accepting)
    transitions = [[row[class_of[byte]] for byte in range(256)] for row in table]
    return DFA(transitions=transitions, accepting=accepting)
