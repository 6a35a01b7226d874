"""Syntax tree -> Thompson NFA over BYTES (UTF-8), the second stage of mini's grammar compiler.

Tokens are byte strings (a byte-level BPE token may hold half of a UTF-8 character), so the automaton
must read bytes, not characters. A set of code points becomes a small set of byte-range sequences
(`utf8_sequences`, the classic split used by RE2 and Rust's regex crate): U+0000..U+10FFFF becomes
[00-7F] | [C2-DF][80-BF] | [E0][A0-BF][80-BF] | ... . Thompson's construction then gives every tree
node a start and an end state, joined by epsilon edges.

In vLLM this work happens inside the grammar backend (xgrammar's or outlines-core's regex compiler,
called from vllm/v1/structured_output/backend_xgrammar.py / backend_outlines.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mini.structured_output.regex_parser import Alternation, CharSet, Concat, Repeat

# Refuse patterns whose NFA would be enormous (a {m,n} nest multiplies states).
MAX_NFA_STATES = 200_000


def utf8_sequences(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """Code points lo..hi -> byte-range sequences whose union is exactly their UTF-8 encodings."""
    out: list[list[tuple[int, int]]] = []
    stack = [(lo, hi)]
    while stack:
        lo, hi = stack.pop()
        split = next((b for b in (0x7F, 0x7FF, 0xFFFF) if lo <= b < hi), None)
        if split is not None:  # different encoded lengths: split at the boundary
            stack += [(split + 1, hi), (lo, split)]
            continue
        if hi <= 0x7F:
            out.append([(lo, hi)])
            continue
        for i in (1, 2, 3):  # make every continuation byte either free or fixed
            mask = (1 << (6 * i)) - 1
            if lo & ~mask != hi & ~mask:
                if lo & mask != 0:
                    stack += [((lo | mask) + 1, hi), (lo, lo | mask)]
                    break
                if hi & mask != mask:
                    stack += [(hi & ~mask, hi), (lo, (hi & ~mask) - 1)]
                    break
        else:
            start, end = chr(lo).encode(), chr(hi).encode()
            out.append(list(zip(start, end, strict=False)))
    return out


@dataclass(slots=True)
class NFA:
    """States 0..n-1; `edges[s]`: (lo_byte, hi_byte, target); `epsilon[s]`: targets; one start, one accept."""

    edges: list[list[tuple[int, int, int]]] = field(default_factory=list)
    epsilon: list[list[int]] = field(default_factory=list)
    start: int = 0
    accept: int = 0

    @property
    def num_states(self) -> int:
        return len(self.edges)

    def new_state(self) -> int:
        if len(self.edges) >= MAX_NFA_STATES:
            raise ValueError(f"regex is too large: its automaton exceeds {MAX_NFA_STATES} states "
                             "(reduce {m,n} counts or nesting)")
        self.edges.append([])
        self.epsilon.append([])
        return len(self.edges) - 1

    def accepts_something(self) -> bool:
        """Is the language non-empty (can accept be reached from start)?"""
        seen, stack = {self.start}, [self.start]
        while stack:
            state = stack.pop()
            if state == self.accept:
                return True
            for target in self.epsilon[state] + [t for _, _, t in self.edges[state]]:
                if target not in seen:
                    seen.add(target)
                    stack.append(target)
        return False


def build_nfa(tree) -> NFA:
    """Thompson's construction over the parser's tree."""
    nfa = NFA()
    nfa.start, nfa.accept = _build(nfa, tree)
    return nfa


def _build(nfa: NFA, node) -> tuple[int, int]:
    """-> (start, end) of a fragment recognising `node`."""
    if isinstance(node, CharSet):
        start, end = nfa.new_state(), nfa.new_state()
        for lo, hi in node.ranges:
            for sequence in utf8_sequences(lo, hi):
                state = start
                for index, (byte_lo, byte_hi) in enumerate(sequence):
                    target = end if index == len(sequence) - 1 else nfa.new_state()
                    nfa.edges[state].append((byte_lo, byte_hi, target))
                    state = target
        return start, end
    if isinstance(node, Concat):
        start = end = nfa.new_state()
        for part in node.parts:
            part_start, part_end = _build(nfa, part)
            nfa.epsilon[end].append(part_start)
            end = part_end
        return start, end
    if isinstance(node, Alternation):
        start, end = nfa.new_state(), nfa.new_state()
        for option in node.options:
            option_start, option_end = _build(nfa, option)
            nfa.epsilon[start].append(option_start)
            nfa.epsilon[option_end].append(end)
        return start, end
    if isinstance(node, Repeat):
        start = end = nfa.new_state()
        for _ in range(node.min_count):  # the required copies
            copy_start, copy_end = _build(nfa, node.node)
            nfa.epsilon[end].append(copy_start)
            end = copy_end
        if node.max_count is None:  # then a loop: (node)*
            loop_start, loop_end = _build(nfa, node.node)
            exit_state = nfa.new_state()
            nfa.epsilon[end] += [loop_start, exit_state]
            nfa.epsilon[loop_end] += [loop_start, exit_state]
            return start, exit_state
        exit_state = nfa.new_state()
        for _ in range(node.max_count - node.min_count):  # optional copies, each may stop early
            copy_start, copy_end = _build(nfa, node.node)
            nfa.epsilon[end] += [copy_start, exit_state]
            end = copy_end
        nfa.epsilon[end].append(exit_state)
        return start, exit_state
    raise TypeError(f"unknown regex node {node!r}")
