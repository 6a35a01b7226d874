"""Regex text -> syntax tree over Unicode code points (the first stage of mini's grammar compiler).

Plays the part of the regex front end inside the grammar backends vLLM uses
(vllm/v1/structured_output/backend_xgrammar.py hands `regex` to xgrammar, backend_outlines.py to
outlines-core); mini parses the pattern itself so that a learner can read every step.

Supported (everything else raises ValueError naming `regex` and this list):
  literals and escapes  a  \\.  \\n \\t \\r \\f \\v \\0  \\xhh  \\uhhhh  \\/ and any escaped punctuation
  classes               [abc] [a-z] [^...] . \\d \\D \\w \\W \\s \\S (inside [] too; \\d \\w \\s are ASCII-only)
  groups                (...)  (?:...)  (?P<name>...)  (?<name>...)
  alternation           a|b
  repetition            * + ? {m} {m,} {m,n} (lazy forms such as *? mean the same set of strings)
  anchors               ^ at the very start and $ at the very end only: every pattern matches the WHOLE output
The alphabet is Unicode code points; `regex_nfa.py` lowers them to UTF-8 bytes. `.` is any code point
except newline, as in Python's `re`. Back references and look-arounds cannot be expressed by a finite
automaton and are refused.
"""

# ruff: noqa: TRY004  (a wrong type is a bad value here: ValueError naming the field, as vLLM raises)
from __future__ import annotations

from dataclasses import dataclass

MAX_CODE_POINT = 0x10FFFF
# Upper bound on {m,n} counts: each copy becomes NFA states, so a huge count is refused early.
MAX_REPEAT = 1000

SUPPORTED = ("literals, escapes (\\n \\t \\xhh \\uhhhh ...), classes [...] [^...] . \\d \\w \\s (and negations), "
             "groups (...) (?:...) (?P<name>...), alternation |, repetition * + ? {m} {m,} {m,n}, "
             "^ and $ only at the ends")


# ---------------------------------------------------------------------- the syntax tree
@dataclass(frozen=True, slots=True)
class CharSet:
    """One code point out of sorted, disjoint, inclusive ranges."""
    ranges: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Concat:
    parts: tuple


@dataclass(frozen=True, slots=True)
class Alternation:
    options: tuple


@dataclass(frozen=True, slots=True)
class Repeat:
    node: object
    min_count: int
    max_count: int | None  # None: unbounded


EMPTY = Concat(())


def normalize_ranges(ranges) -> tuple[tuple[int, int], ...]:
    """Sort and merge overlapping or touching ranges."""
    merged: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return tuple((lo, hi) for lo, hi in merged)


def complement_ranges(ranges) -> tuple[tuple[int, int], ...]:
    """Every code point (surrogates excluded) not in `ranges`."""
    result, start = [], 0
    for lo, hi in normalize_ranges(ranges):
        if lo > start:
            result.append((start, lo - 1))
        start = hi + 1
    if start <= MAX_CODE_POINT:
        result.append((start, MAX_CODE_POINT))
    return subtract_surrogates(result)


def subtract_surrogates(ranges) -> tuple[tuple[int, int], ...]:
    """UTF-8 cannot encode U+D800..U+DFFF: drop them."""
    out = []
    for lo, hi in ranges:
        if lo < 0xD800:
            out.append((lo, min(hi, 0xD7FF)))
        if hi > 0xDFFF:
            out.append((max(lo, 0xE000), hi))
    return normalize_ranges(out)


DIGIT = ((ord("0"), ord("9")),)
WORD = normalize_ranges([(ord("0"), ord("9")), (ord("A"), ord("Z")), (ord("a"), ord("z")), (ord("_"), ord("_"))])
SPACE = normalize_ranges([(ord(c), ord(c)) for c in " \t\n\r\f\v"])
CLASS_ESCAPES = {"d": DIGIT, "w": WORD, "s": SPACE}
CHAR_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0", "a": "\a"}


def literal(text: str) -> Concat:
    """A fixed string as a concatenation of one-character sets."""
    return Concat(tuple(CharSet(((ord(c), ord(c)),)) for c in text))


# ---------------------------------------------------------------------- the parser
# Deepest group nesting accepted: the parser and the NFA builder recurse once per level (mini's own limit;
# xgrammar has none), so a deeper pattern is a clear ValueError instead of a RecursionError.
MAX_GROUP_NESTING = 100

class _Parser:
    """Recursive descent: alternation > concatenation > repetition > atom."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.pos = 0
        self.depth = 0  # groups open at self.pos

    def error(self, what: str) -> ValueError:
        return ValueError(f"regex {self.pattern!r}: {what} at position {self.pos}; supported: {SUPPORTED}")

    def peek(self) -> str | None:
        return self.pattern[self.pos] if self.pos < len(self.pattern) else None

    def take(self) -> str:
        if self.pos >= len(self.pattern):
            raise self.error("unexpected end of pattern")
        char = self.pattern[self.pos]
        self.pos += 1
        return char

    def parse(self):
        if self.peek() == "^":
            self.pos += 1
        node = self.alternation()
        if self.pos != len(self.pattern):
            raise self.error(f"unexpected {self.peek()!r}")
        return node

    def alternation(self):
        options = [self.concatenation()]
        while self.peek() == "|":
            self.pos += 1
            options.append(self.concatenation())
        return options[0] if len(options) == 1 else Alternation(tuple(options))

    def concatenation(self):
        parts = []
        while self.peek() not in (None, "|", ")"):
            if self.peek() == "$":
                self.pos += 1
                if self.peek() not in (None, ")", "|") or self.pos != len(self.pattern):
                    raise self.error("'$' is only supported at the end of the pattern")
                continue
            parts.append(self.repetition())
        return parts[0] if len(parts) == 1 else Concat(tuple(parts))

    def repetition(self):
        node = self.atom()
        while self.peek() in ("*", "+", "?", "{"):
            char = self.peek()
            if char == "{":
                bounds = self.braces()
                if bounds is None:
                    break
                low, high = bounds
            else:
                self.pos += 1
                low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[char]
            if self.peek() == "?":  # lazy: same language
                self.pos += 1
            elif self.peek() == "+":
                raise self.error("possessive quantifiers are not supported")
            node = Repeat(node, low, high)
        return node

    def braces(self) -> tuple[int, int | None] | None:
        """{m}, {m,}, {m,n}; None (and nothing consumed) if the brace is a literal '{'."""
        end = self.pattern.find("}", self.pos)
        body = self.pattern[self.pos + 1:end] if end > 0 else ""
        low_text, comma, high_text = body.partition(",")
        if end < 0 or not low_text.isdigit() or (high_text and not high_text.isdigit()):
            return None
        low = int(low_text)
        high = int(high_text) if high_text else (None if comma else low)
        if high is not None and high < low:
            raise self.error(f"repetition {{{body}}} has max < min")
        if max(low, high or 0) > MAX_REPEAT:
            raise self.error(f"repetition counts above {MAX_REPEAT} are not supported")
        self.pos = end + 1
        return low, high

    def atom(self):
        char = self.take()
        if char == "(":
            if self.peek() == "?":
                self.pos += 1
                kind = self.take()
                if kind == "P" and self.peek() == "<" or kind == "<" and self.peek() not in ("=", "!"):
                    if kind == "P":
                        self.pos += 1
                    close = self.pattern.find(">", self.pos)
                    if close < 0:
                        raise self.error("unterminated group name")
                    self.pos = close + 1
                elif kind != ":":
                    raise self.error(f"group (?{kind}...) (look-around, flags, references) is not supported")
            self.depth += 1
            if self.depth > MAX_GROUP_NESTING:  # recursive descent: bound the stack, answer with a ValueError
                raise self.error(f"groups nested more than {MAX_GROUP_NESTING} levels deep")
            node = self.alternation()
            if self.peek() != ")":
                raise self.error("missing ')'")
            self.pos += 1
            self.depth -= 1
            return node
        if char == "[":
            return CharSet(self.char_class())
        if char == ".":
            return CharSet(complement_ranges([(10, 10)]))
        if char == "\\":
            return self.escape(in_class=False)
        if char in "*+?":
            raise self.error(f"nothing to repeat before {char!r}")
        if char == ")":
            raise self.error("unbalanced ')'")
        if char == "^":
            raise self.error("'^' is only supported at the start of the pattern")
        return CharSet(((ord(char), ord(char)),))

    def escape(self, in_class: bool):
        """After a backslash: a class escape (-> CharSet) or one character (-> CharSet of one)."""
        char = self.take()
        if char.lower() in CLASS_ESCAPES:
            ranges = CLASS_ESCAPES[char.lower()]
            return CharSet(ranges if char.islower() else complement_ranges(ranges))
        if char in CHAR_ESCAPES:
            code = ord(CHAR_ESCAPES[char])
        elif char in ("x", "u", "U"):
            width = {"x": 2, "u": 4, "U": 8}[char]
            digits = self.pattern[self.pos:self.pos + width]
            if len(digits) != width or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.error(f"\\{char} needs {width} hex digits")
            self.pos += width
            code = int(digits, 16)
        elif char.isalnum():
            raise self.error(f"escape \\{char} (back references, \\b, \\A ...) is not supported")
        else:
            code = ord(char)
        if code > MAX_CODE_POINT or 0xD800 <= code <= 0xDFFF:
            raise self.error(f"code point {code:#x} cannot be encoded in UTF-8")
        return CharSet(((code, code),))

    def char_class(self) -> tuple[tuple[int, int], ...]:
        negate = self.peek() == "^"
        if negate:
            self.pos += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            char = self.take()
            if char == "]" and not first:
                break
            first = False
            if char == "\\":
                item = self.escape(in_class=True).ranges
            elif char == "[" and self.peek() == ":":
                raise self.error("POSIX classes [:alpha:] are not supported")
            else:
                item = ((ord(char), ord(char)),)
            if len(item) == 1 and item[0][0] == item[0][1] and self.peek() == "-" and \
                    self.pattern[self.pos + 1:self.pos + 2] not in ("]", ""):
                self.pos += 1
                end_char = self.take()
                end = self.escape(in_class=True).ranges if end_char == "\\" else ((ord(end_char),) * 2,)
                if len(end) != 1 or end[0][0] != end[0][1]:
                    raise self.error("a class escape cannot end a range")
                if end[0][0] < item[0][0]:
                    raise self.error("bad character range (end before start)")
                item = ((item[0][0], end[0][0]),)
            ranges.extend(item)
        ranges = subtract_surrogates(ranges)
        return complement_ranges(ranges) if negate else normalize_ranges(ranges)


def parse_regex(pattern: str):
    """Parse `pattern` into the tree above; ValueError naming `regex` on anything unsupported."""
    if not isinstance(pattern, str):
        raise ValueError(f"regex must be a str, got {type(pattern).__name__}")
    return _Parser(pattern).parse()
