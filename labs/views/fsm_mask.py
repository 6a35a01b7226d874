"""Mirrors no vllm/v1 file: a view of structured output (vllm/v1/structured_output/): the FSM and its mask.

`compile_grammar(tokenizer, kind, spec)` compiles a regex / JSON schema / choice with mini's backend
(mini/structured_output/backend_mini.py). `fsm_walk(compiled, token_ids)` replays tokens through the DFA and
records, after each one, the state, the allowed-token mask (`compiled.index.mask(state)`: the packed int32 row
the sampler applies) and the states the token's bytes walked through (a multi-byte token crosses several).
It reads only those compiled objects, and the model's logits through a callable the notebook passes
(`next_logits(output_token_ids)`: the phase-11 notebook captures the sampler's input, as phases 08 and 09 do).

What the views draw, so a JSON schema stays readable (a DFA of a few dozen states):
- `plot_fsm`: the DFA laid out in layers, left to right by distance from the start state (a window of
  layers around the current state when it is large); edges carry their byte ranges ("¬\"" = any byte but a
  quote); the current state is filled, the states the last token passed through are shaded and its edges
  drawn thick; accepting states are ringed;
- `render_fsm_html` / `render_fsm_text`: the current state's live transitions (a state table), the allowed
  tokens grouped by the state they lead to (with counts: tokens in one group are alike to the grammar), one
  int32 word of the packed bitmask with its 32 bits and the token ids they stand for, and, given the model's
  logits, the top tokens' probabilities before and after the mask;
- `fsm_mask_widget(compiled, tokenizer, next_logits=...)`: a text box (type a prefix), "sample next token"
  (draws from the MODEL's masked distribution; uniform over the allowed tokens only when no model is given)
  and "reset". Its `text()` (and its `text/plain`) is the text view (labs/views/text_view.py).
"""

from __future__ import annotations

import html
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from labs.views.text_view import TextView, have_widgets, header, view_box
from mini.structured_output.backend_mini import CompiledGrammar, MiniBackend
from mini.structured_output.dfa import DEAD
from mini.structured_output.token_index import bitmask_words, unpack_allowed

CURRENT_COLOR = "#ffb300"
PATH_COLOR = "#ffe0a0"
STATE_COLOR = "#e3f2fd"
ALLOWED_COLOR = "#1565c0"
PATH_EDGE_COLOR = "#d84315"
MAX_DRAWN_STATES = 24


def compile_grammar(tokenizer, kind: str, spec: str, vocab_size: int | None = None) -> CompiledGrammar:
    """Compile `spec` ('regex' | 'json' (JSON text) | 'choice' (JSON list) | 'json_object') for a tokenizer."""
    size = len(tokenizer) if vocab_size is None else vocab_size
    return MiniBackend(tokenizer, size, tokenizer.eos_token_id).compile_grammar(kind, spec)


@dataclass(slots=True)
class FsmStep:
    """The automaton after a prefix of tokens."""

    token_ids: list[int]
    state: int                 # DFA state, or DEAD (-1) once a token was refused
    accepting: bool
    allowed_token_ids: list[int]
    path: list[int] = field(default_factory=list)  # the last token's walk: [state before, after byte 1, ...]


def token_path(compiled: CompiledGrammar, state: int, data: bytes) -> list[int]:
    """The states reading `data` from `state` passes through: [state, after byte 1, ...] (stops at DEAD)."""
    path = [state]
    for byte in data:
        state = compiled.dfa.transitions[state][byte]
        path.append(state)
        if state == DEAD:
            break
    return path


def fsm_walk(compiled: CompiledGrammar, token_ids: list[int]) -> list[FsmStep]:
    """One FsmStep for the empty prefix and one after each token (stops at the first refused token)."""
    index, dfa = compiled.index, compiled.dfa
    state, path, steps = 0, [], []
    for count in range(len(token_ids) + 1):
        if state == DEAD:
            steps.append(FsmStep(token_ids[:count], DEAD, False, [], path))
            break
        allowed = unpack_allowed(index.mask(state), index.vocab_size)
        steps.append(FsmStep(token_ids[:count], state, dfa.accepting[state], allowed, path))
        if count == len(token_ids):
            break
        token = token_ids[count]
        data = index.trie_bytes(token)
        if token == index.eos_token_id and dfa.accepting[state]:
            path = [state]        # EOS ends the output: the state stays (and the next mask is empty)
            continue
        path = [state, DEAD] if data is None or token not in allowed else token_path(compiled, state, data)
        state = path[-1]
    return steps


# ------------------------------------------------------------------------------------------ the automaton


def _show_byte(byte: int) -> str:
    return chr(byte) if 33 <= byte < 127 else ("␣" if byte == 32 else f"{byte:02x}")


def _ranges(values: list[int]) -> str:
    ranges, start = [], values[0]
    for prev, cur in zip(values, [*values[1:], None], strict=False):
        if cur is None or cur != prev + 1:
            ranges.append(_show_byte(start) if start == prev else f"{_show_byte(start)}-{_show_byte(prev)}")
            start = cur
    return ",".join(ranges)


def _byte_label(values: list[int], width: int = 14) -> str:
    """Bytes -> compact ranges: [48..57] -> '0-9'; most bytes -> '¬' + the few left out; non-printable as hex."""
    if len(values) == 256:
        return "any byte"
    if len(values) > 128:
        missing = sorted(set(range(256)) - set(values))
        label = "¬" + _ranges(missing)
    else:
        label = _ranges(values)
    return label if len(label) <= width else label[: width - 2] + "…"


def live_transitions(compiled: CompiledGrammar, state: int) -> list[tuple[list[int], int]]:
    """The edges out of `state`: (bytes, next state), one per next state, in state order."""
    if state == DEAD:
        return []
    targets: dict[int, list[int]] = {}
    for byte, target in enumerate(compiled.dfa.transitions[state]):
        if target != DEAD:
            targets.setdefault(target, []).append(byte)
    return sorted(((values, target) for target, values in targets.items()), key=lambda item: item[1])


def state_layers(compiled: CompiledGrammar) -> list[int]:
    """Each state's distance (in bytes) from the start state 0, by breadth-first search."""
    dfa = compiled.dfa
    depth = [-1] * dfa.num_states
    depth[0], frontier = 0, [0]
    while frontier:
        following = []
        for state in frontier:
            for target in set(dfa.transitions[state]):
                if target != DEAD and depth[target] < 0:
                    depth[target] = depth[state] + 1
                    following.append(target)
        frontier = following
    unreached = max(depth) + 1
    return [d if d >= 0 else unreached for d in depth]


def plot_fsm(compiled: CompiledGrammar, state: int, ax, path: Sequence[int] = (),
             max_states: int = MAX_DRAWN_STATES) -> None:
    """The DFA in layers, left to right; `state` filled, the states and edges of `path` highlighted."""
    dfa = compiled.dfa
    depth = state_layers(compiled)
    shown = list(range(dfa.num_states))
    note = ""
    if dfa.num_states > max_states:     # a window of layers around where the walk is
        centre = depth[state] if state != DEAD else (depth[path[0]] if path else 0)
        low, high = centre - 2, centre + 3
        shown = [s for s in shown if low <= depth[s] <= high]
        note = f" (layers {max(low, 0)}-{high} of {max(depth)}: {len(shown)} of {dfa.num_states} states)"
    columns: dict[int, list[int]] = {}
    for s in shown:
        columns.setdefault(depth[s], []).append(s)
    pos = {s: (float(d), (len(col) - 1) / 2 - row) for d, col in columns.items() for row, s in enumerate(col)}
    on_path = {(a, b) for a, b in itertools.pairwise(path) if a != DEAD and b != DEAD}
    for source in shown:
        for values, target in live_transitions(compiled, source):
            if target not in pos:
                continue
            (x0, y0), (x1, y1) = pos[source], pos[target]
            hot = (source, target) in on_path
            color = PATH_EDGE_COLOR if hot else "#999"
            if source == target:
                ax.text(x0, y0 + 0.33, _byte_label(values), fontsize=8, ha="center", color=color)
                continue
            bend = 0.0 if x1 > x0 and y0 == y1 else 0.25
            ax.annotate("", (x1, y1), (x0, y0), arrowprops={
                "arrowstyle": "->", "color": color, "lw": 2.2 if hot else 0.8, "shrinkA": 9, "shrinkB": 9,
                "connectionstyle": f"arc3,rad={bend}"})
            ax.text(x0 + (x1 - x0) * 0.5, y0 + (y1 - y0) * 0.5 + 0.1, _byte_label(values), fontsize=8,
                    ha="center", color=color if hot else "#333")
    for s, (x, y) in pos.items():
        face = CURRENT_COLOR if s == state else (PATH_COLOR if s in path else STATE_COLOR)
        ax.scatter([x], [y], s=260, color=face, edgecolors="black", zorder=3)
        if dfa.accepting[s]:
            ax.scatter([x], [y], s=430, facecolors="none", edgecolors="black", zorder=2)
        ax.text(x, y, str(s), ha="center", va="center", fontsize=7, zorder=4)
    walked = " → ".join("dead" if s == DEAD else str(s) for s in path)
    title = "DFA over bytes, layered by distance from state 0" + note
    title += "\n" + ("dead: the last token was refused" if state == DEAD else f"current state {state}")
    title += f"; last token walked {walked}" if len(path) > 1 else ""
    ax.set_title(title, fontsize=8, loc="left")
    xs = [x for x, _ in pos.values()] or [0.0]
    ys = [y for _, y in pos.values()] or [0.0]
    ax.set_xlim(min(xs) - 0.6, max(xs) + 0.6)
    ax.set_ylim(min(ys) - 0.7, max(ys) + 0.7)
    ax.axis("off")


# ------------------------------------------------------------------------------------------ the mask


def token_texts(tokenizer, token_ids: list[int], limit: int = 40) -> list[str]:
    """'id:text' for the first `limit` tokens (EOS shown as its special string)."""
    return [f"{t}:{_token_text(tokenizer, t)!r}" for t in token_ids[:limit]]


def _token_text(tokenizer, token_id: int) -> str:
    if token_id == tokenizer.eos_token_id:
        return tokenizer.convert_ids_to_tokens(token_id)
    return tokenizer.decode([token_id])


def _token_repr(tokenizer, token_id: int, compiled: CompiledGrammar | None = None) -> str:
    """A token as Python would write it: its text, or its bytes where they are part of a UTF-8 character."""
    text = _token_text(tokenizer, token_id)
    if "\ufffd" in text and compiled is not None and compiled.index.trie_bytes(token_id) is not None:
        return repr(compiled.index.trie_bytes(token_id))
    return repr(text)


@dataclass(slots=True)
class AllowedGroup:
    """Allowed tokens that lead to the same next state (alike to the grammar); next_state None: EOS."""

    next_state: int | None
    token_ids: list[int]


def allowed_groups(compiled: CompiledGrammar, step: FsmStep) -> list[AllowedGroup]:
    """`step`'s allowed tokens grouped by the state each leads to, biggest group first (EOS: its own)."""
    groups: dict[int | None, list[int]] = {}
    for token in step.allowed_token_ids:
        data = compiled.index.trie_bytes(token)
        target = None if token == compiled.index.eos_token_id or data is None else compiled.dfa.walk(data, step.state)
        groups.setdefault(target, []).append(token)
    return sorted((AllowedGroup(k, v) for k, v in groups.items()), key=lambda g: (-len(g.token_ids),
                                                                                  g.next_state or -1))


@dataclass(slots=True)
class MaskWord:
    """One int32 word of a packed mask row: bit j stands for token 32 * word + j (little-endian bits)."""

    word: int
    value: int              # the word as a signed int32, as the bitmask tensor holds it
    bits: list[int]         # bit 0 .. bit 31
    token_ids: list[int]    # the token each bit stands for (past the vocabulary: none)


def mask_word(compiled: CompiledGrammar, state: int, word: int | None = None) -> MaskWord:
    """Word `word` of `state`'s packed mask (None: the first word with some bits set and some clear)."""
    vocab_size = compiled.index.vocab_size
    row = (np.zeros(bitmask_words(vocab_size), dtype=np.int32) if state == DEAD
           else np.asarray(compiled.index.mask(state), dtype=np.int32))
    if word is None:
        counts = [(int(v) & 0xFFFFFFFF).bit_count() for v in row]
        word = next((w for w, c in enumerate(counts) if 0 < c < 32), next((w for w, c in enumerate(counts) if c), 0))
    value = int(row[word])
    bits = [(value >> j) & 1 for j in range(32)]
    return MaskWord(word, value, bits, [32 * word + j for j in range(32) if 32 * word + j < vocab_size])


# ------------------------------------------------------------------------------------------ the model


@dataclass(slots=True)
class MaskedDistribution:
    """The model's next-token distribution before and after the mask (probabilities, top tokens)."""

    top_before: list[tuple[int, float, bool]]   # (token, p, allowed?)
    top_after: list[tuple[int, float]]          # (token, p renormalised over the allowed tokens)
    allowed_mass: float                         # how much of p the mask keeps
    probs_after: np.ndarray                     # over `allowed`, in its order


def masked_distribution(logits: Sequence[float], allowed: Sequence[int], top: int = 5) -> MaskedDistribution:
    """softmax(logits), then the mask: disallowed tokens to 0, the rest renormalised (same as -inf logits)."""
    values = np.asarray(logits, dtype=np.float64)
    probs = np.exp(values - values.max())
    probs /= probs.sum()
    allowed = np.asarray(list(allowed), dtype=np.int64)
    allowed_set = set(allowed.tolist())
    order = np.argsort(-probs, kind="stable")[:top]
    kept = probs[allowed] if len(allowed) else np.zeros(0)
    mass = float(kept.sum())
    after = kept / mass if mass > 0 else np.full(len(allowed), 1.0 / max(len(allowed), 1))
    best = np.argsort(-after, kind="stable")[:top]
    return MaskedDistribution([(int(t), float(probs[t]), int(t) in allowed_set) for t in order],
                              [(int(allowed[i]), float(after[i])) for i in best], mass, after)


# ------------------------------------------------------------------------------------------ report


@dataclass(slots=True)
class FsmReport:
    """Everything one redraw shows (plain data: the HTML and the text are drawn from it)."""

    step: FsmStep
    tokens: list[str]                 # 'id:text' of the prefix
    groups: list[AllowedGroup]
    word: MaskWord
    distribution: MaskedDistribution | None
    last_draw: tuple[int, str] | None = None   # (token, how it was drawn)


def fsm_report(compiled: CompiledGrammar, tokenizer, token_ids: list[int],
               next_logits: Callable[[list[int]], Sequence[float]] | None = None, word: int | None = None,
               top: int = 5) -> FsmReport:
    step = fsm_walk(compiled, token_ids)[-1]
    distribution = None
    if next_logits is not None and step.allowed_token_ids:
        logits = np.asarray(next_logits(list(step.token_ids)), dtype=np.float64)[: compiled.index.vocab_size]
        distribution = masked_distribution(logits, step.allowed_token_ids, top)
    return FsmReport(step, token_texts(tokenizer, step.token_ids, 10_000), allowed_groups(compiled, step),
                     mask_word(compiled, step.state, word), distribution)


def _group_name(group: AllowedGroup, compiled: CompiledGrammar) -> str:
    if group.next_state is None:
        return "EOS (the output may end here)"
    accept = ", accepting" if compiled.dfa.accepting[group.next_state] else ""
    return f"→ state {group.next_state}{accept}"


def _texts(tokenizer, token_ids: list[int], limit: int, compiled: CompiledGrammar | None = None) -> str:
    shown = ", ".join(_token_repr(tokenizer, t, compiled) for t in token_ids[:limit])
    return shown + (f", … (+{len(token_ids) - limit})" if len(token_ids) > limit else "")


def render_fsm_text(report: FsmReport, compiled: CompiledGrammar, tokenizer, limit: int = 8) -> str:
    step = report.step
    lines = [f"tokens so far: [{', '.join(report.tokens)}]"]
    if step.state == DEAD:
        lines.append("state: dead (the last token was refused); nothing is allowed")
    else:
        lines.append(f"state {step.state}" + (" (accepting: EOS allowed)" if step.accepting else ""))
    if len(step.path) > 2:
        lines.append(f"the last token's {len(step.path) - 1} bytes walked states "
                     + " -> ".join("dead" if s == DEAD else str(s) for s in step.path))
    lines.append("live transitions (state table row):")
    for values, target in live_transitions(compiled, step.state):
        lines.append(f"  bytes {_byte_label(values, 40):42s} -> state {target}"
                     + (" (accepting)" if compiled.dfa.accepting[target] else ""))
    lines.append(f"allowed next ({len(step.allowed_token_ids)}): "
                 + ", ".join(token_texts(tokenizer, step.allowed_token_ids, limit)))
    for group in report.groups:
        lines.append(f"  {_group_name(group, compiled)}: {len(group.token_ids)} tokens: "
                     f"{_texts(tokenizer, group.token_ids, limit, compiled)}")
    w = report.word
    lines.append(f"packed mask: {bitmask_words(compiled.index.vocab_size)} int32 words; word {w.word} = "
                 f"{w.value} (0x{w.value & 0xFFFFFFFF:08x}); bit j = token {32 * w.word} + j")
    lines.append("  bits 31..0: " + "".join(str(b) for b in reversed(w.bits)))
    set_bits = [f"bit {j} -> {t}:{_token_repr(tokenizer, t, compiled)}" for j, t in enumerate(w.token_ids) if w.bits[j]]
    lines.append("  set: " + ("; ".join(set_bits) or "(none)"))
    if report.distribution is not None:
        d = report.distribution
        lines.append(f"model's next token, before the mask (the mask keeps {d.allowed_mass:.1%} of p): "
                     + ", ".join(f"{_token_repr(tokenizer, t, compiled)} {p:.3f}{'' if ok else ' (masked)'}"
                                 for t, p, ok in d.top_before))
        lines.append("after the mask (renormalised): "
                     + ", ".join(f"{_token_repr(tokenizer, t, compiled)} {p:.3f}" for t, p in d.top_after))
    if report.last_draw is not None:
        token, how = report.last_draw
        lines.append(f"last sample: {token}:{_token_text(tokenizer, token)!r} ({how})")
    return "\n".join(lines)


def _bits_html(word: MaskWord, tokenizer, compiled: CompiledGrammar | None = None) -> str:
    cells_bit, cells_id, cells_text = [], [], []
    cell = "border:1px solid #ddd;width:30px;max-width:30px;overflow:hidden;white-space:nowrap"
    for j in range(len(word.token_ids) - 1, -1, -1):   # bit 31 on the left, as the int is written
        on = word.bits[j]
        style = f"background:{ALLOWED_COLOR if on else '#fff'};color:{'#fff' if on else '#333'}"
        cells_bit.append(f"<td class='fsm-bit' title='bit {j}' style='{style};{cell}'>{on}</td>")
        cells_id.append(f"<td style='font-size:8px;{cell}'>{word.token_ids[j]}</td>")
        text = html.escape(_token_repr(tokenizer, word.token_ids[j], compiled)[:7])
        cells_text.append(f"<td style='font-size:8px;{cell}' title='{text}'>{text}</td>")
    return (f"<table class='fsm-word' style='border-collapse:collapse;text-align:center;font:10px monospace'>"
            f"<tr><th style='font-size:9px'>bit 31…0</th>{''.join(cells_bit)}</tr>"
            f"<tr><th style='font-size:9px'>token id</th>{''.join(cells_id)}</tr>"
            f"<tr><th style='font-size:9px'>token</th>{''.join(cells_text)}</tr></table>")


def _probs_html(report: FsmReport, tokenizer, compiled: CompiledGrammar | None = None) -> str:
    d = report.distribution
    if d is None:
        return "<div><i>no model given: “sample next token” draws uniformly among the allowed tokens</i></div>"
    def bar(p: float, color: str) -> str:
        return (f"<span style='display:inline-block;height:9px;width:{max(1, round(120 * p))}px;"
                f"background:{color}'></span>")
    masked = "<b style='color:#c62828'>masked</b>"
    before = "".join(
        f"<tr><td>{html.escape(_token_repr(tokenizer, t, compiled))}</td><td>{p:.3f}</td><td>{bar(p, '#999')}</td>"
        f"<td>{'allowed' if ok else masked}</td></tr>" for t, p, ok in d.top_before)
    after = "".join(f"<tr><td>{html.escape(_token_repr(tokenizer, t, compiled))}</td><td>{p:.3f}</td>"
                    f"<td>{bar(p, ALLOWED_COLOR)}</td></tr>" for t, p in d.top_after)
    return (f"<div class='fsm-probs' style='display:flex;gap:24px'><div><b>model, before the mask</b>"
            f"<table style='font:11px monospace'>{before}</table></div><div><b>after the mask</b> (keeps "
            f"{d.allowed_mass:.1%} of p, renormalised)<table style='font:11px monospace'>{after}</table></div></div>")


def render_fsm_html(report: FsmReport, compiled: CompiledGrammar, tokenizer, limit: int = 8) -> str:
    step = report.step
    if step.state == DEAD:
        head = "<b>dead</b>: the last token was refused; nothing is allowed"
    else:
        head = f"<b>state {step.state}</b>" + (" (accepting: EOS allowed)" if step.accepting else "")
    if len(step.path) > 2:
        head += (f"; the last token's {len(step.path) - 1} bytes walked states <span class='fsm-path'>"
                 + " → ".join("dead" if s == DEAD else str(s) for s in step.path) + "</span>")
    rows = "".join(
        f"<tr><td style='font-family:monospace'>{html.escape(_byte_label(values, 40))}</td><td>{target}"
        f"{' (accepting)' if compiled.dfa.accepting[target] else ''}</td></tr>"
        for values, target in live_transitions(compiled, step.state)) or "<tr><td colspan=2>(none)</td></tr>"
    groups = "".join(
        f"<li><b>{html.escape(_group_name(g, compiled))}</b>: {len(g.token_ids)} tokens: "
        f"<span style='font-family:monospace'>{html.escape(_texts(tokenizer, g.token_ids, limit, compiled))}"
        f"</span></li>"
        for g in report.groups) or "<li>(none)</li>"
    w = report.word
    draw = ""
    if report.last_draw is not None:
        token, how = report.last_draw
        draw = (f"<div>last sample: <b>{html.escape(_token_repr(tokenizer, token, compiled))}</b> "
                f"({html.escape(how)})</div>")
    return (
        f"<div class='fsm-report' style='font:12px sans-serif'><div>{head}</div>"
        f"<div style='display:flex;gap:24px'><div><b>live transitions</b><table class='fsm-table' "
        f"style='font-size:11px'><tr><th>bytes</th><th>next state</th></tr>{rows}</table></div>"
        f"<div><b>allowed next: {len(step.allowed_token_ids)} tokens</b>, grouped by the state they lead to"
        f"<ul class='fsm-groups' style='margin:2px'>{groups}</ul></div></div>"
        f"<div><b>packed mask</b>: {bitmask_words(compiled.index.vocab_size)} int32 words per row; word {w.word} "
        f"= {w.value} (0x{w.value & 0xFFFFFFFF:08x}): bit j stands for token {32 * w.word} + j</div>"
        f"{_bits_html(w, tokenizer, compiled)}{_probs_html(report, tokenizer, compiled)}{draw}</div>"
    )


@dataclass(slots=True)
class TrailByte:
    """One byte of the output read by the DFA: the state it led to and the token it belongs to."""

    byte: int
    state: int
    token_index: int


def byte_trail(compiled: CompiledGrammar, token_ids: Sequence[int]) -> list[TrailByte]:
    """Every byte of `token_ids` read from state 0, with the state after it (stops at DEAD; EOS reads none)."""
    trail, state = [], 0
    for index, token in enumerate(token_ids):
        data = compiled.index.trie_bytes(token) or b""
        for byte in data:
            state = compiled.dfa.transitions[state][byte]
            trail.append(TrailByte(byte, state, index))
            if state == DEAD:
                return trail
    return trail


def plot_fsm_trail(compiled: CompiledGrammar, token_ids: Sequence[int], ax, max_bytes: int = 14,
                   max_targets: int = 9) -> None:
    """For a DFA too big to draw whole (a JSON schema): the states the output's bytes walked through, left to
    right (each token bracketed below its bytes, the last token's states shaded), then the current state's
    live transitions fanned out to the right."""
    trail = byte_trail(compiled, token_ids)
    shown = trail[-max_bytes:]
    cut = len(trail) - len(shown)
    states = [0 if cut == 0 else trail[cut - 1].state] + [t.state for t in shown]
    current = states[-1]
    last_token = len(token_ids) - 1
    accepting = compiled.dfa.accepting
    for i, s in enumerate(states):
        in_last = i > 0 and shown[i - 1].token_index == last_token or (
            i == 0 and shown and shown[0].token_index == last_token and cut == 0)
        face = CURRENT_COLOR if i == len(states) - 1 else (PATH_COLOR if in_last else STATE_COLOR)
        ax.scatter([i], [0], s=300, color=face, edgecolors="black", zorder=3)
        if s != DEAD and accepting[s]:
            ax.scatter([i], [0], s=480, facecolors="none", edgecolors="black", zorder=2)
        ax.text(i, 0, "✗" if s == DEAD else str(s), ha="center", va="center", fontsize=7, zorder=4)
        if i:
            hot = shown[i - 1].token_index == last_token
            ax.plot([i - 1, i], [0, 0], color=PATH_EDGE_COLOR if hot else "#777", lw=2.2 if hot else 1, zorder=1)
            ax.text(i - 0.5, 0.12, _show_byte(shown[i - 1].byte), ha="center", fontsize=8, color="#222")
    if cut:
        ax.text(-0.6, 0, "…", ha="center", va="center", fontsize=10)
    spans: dict[int, list[int]] = {}
    for i, t in enumerate(shown, start=1):
        spans.setdefault(t.token_index, []).append(i)
    for token_index, xs in spans.items():
        hot = token_index == last_token
        color = PATH_EDGE_COLOR if hot else "#888"
        ax.plot([xs[0] - 0.9, xs[-1] - 0.1], [-0.32, -0.32], color=color, lw=2 if hot else 1)
        data = compiled.index.trie_bytes(token_ids[token_index]) or b""
        label = repr(data.decode("utf-8", errors="replace"))
        ax.text((xs[0] + xs[-1]) / 2 - 0.5, -0.5, label + (f" ({len(data)} bytes)" if hot and len(data) > 1 else ""),
                ha="center", va="top", fontsize=7, color=color)
    edges = live_transitions(compiled, current)
    x = len(states) - 1
    targets = edges[:max_targets]
    for row, (values, target) in enumerate(targets):
        y = (len(targets) - 1) / 2 - row
        ax.annotate("", (x + 2, y * 0.45), (x, 0), arrowprops={"arrowstyle": "->", "color": ALLOWED_COLOR,
                                                              "lw": 0.8, "shrinkA": 8, "shrinkB": 8})
        ax.scatter([x + 2], [y * 0.45], s=160, color="white", edgecolors=ALLOWED_COLOR, zorder=3)
        ax.text(x + 2, y * 0.45, str(target), ha="center", va="center", fontsize=6, zorder=4)
        ax.text(x + 2.25, y * 0.45, _byte_label(values, 18), va="center", fontsize=6,
                color=ALLOWED_COLOR)
    if len(edges) > max_targets:
        ax.text(x + 2, -(len(targets) / 2 + 0.3) * 0.45, f"+{len(edges) - max_targets} more", fontsize=6)
    title = (f"DFA of {compiled.dfa.num_states} states: the bytes read so far (each token bracketed below, "
             f"the last one in red), then state {current}'s live transitions (blue)")
    if current == DEAD:
        title = "the last token was refused: the walk died (✗)"
    ax.set_title(title, fontsize=8, loc="left")
    reach = (len(targets) - 1) / 2 * 0.45 + 0.3
    ax.set_xlim(-1, x + 4.2)
    ax.set_ylim(min(-0.8, -reach - 0.2), max(0.4, reach))
    ax.axis("off")


def fsm_mask_figure(compiled: CompiledGrammar, step: FsmStep):
    """A small DFA whole, in layers (current state and the last token's path highlighted); a bigger one (a
    JSON schema) as the trail of states the output walked plus the current state's live transitions."""
    import matplotlib.pyplot as plt

    if compiled.dfa.num_states > MAX_DRAWN_STATES:
        figure, ax = plt.subplots(figsize=(10, 3.2))
        plot_fsm_trail(compiled, step.token_ids, ax)
    else:
        depth = state_layers(compiled)
        tallest = max(depth.count(d) for d in set(depth))
        figure, ax = plt.subplots(figsize=(min(12.0, 2.0 + 1.1 * (max(depth) + 1)), min(5.0, 1.6 + 0.6 * tallest)))
        plot_fsm(compiled, step.state, ax, step.path)
    figure.subplots_adjust(left=0.02, right=0.98, bottom=0.04, top=0.86)
    return figure


def fsm_mask_text(compiled: CompiledGrammar, tokenizer, token_ids: Sequence[int] = (),
                  next_logits: Callable[[list[int]], Sequence[float]] | None = None) -> str:
    """The widget's text view for a prefix of tokens."""
    report = fsm_report(compiled, tokenizer, list(token_ids), next_logits)
    return f"{header('the FSM-mask widget')}\n{render_fsm_text(report, compiled, tokenizer)}"


def fsm_mask_widget(compiled: CompiledGrammar, tokenizer, seed: int = 0,
                    next_logits: Callable[[list[int]], Sequence[float]] | None = None, prefix: str = ""):
    """Type a prefix or sample tokens one by one; the state, its transitions, the mask and the model follow.

    `next_logits(output_token_ids)` -> the model's logits (or log-probabilities) for the next token, e.g.
    the shipped model's logits after a prompt, captured by the notebook; "sample next token" draws from their masked
    softmax (None: uniformly among the allowed tokens). `prefix`: the output text it starts from (typed in its box)."""
    rng = np.random.default_rng(seed)
    tokens: list[int] = tokenizer.encode(prefix, add_special_tokens=False) if prefix else []
    last: dict[str, Any] = {"draw": None}
    if next_logits is not None:        # one model call per prefix: a redraw and a sample share it
        model, seen = next_logits, {}

        def next_logits(output_token_ids: list[int]) -> np.ndarray:
            key = tuple(output_token_ids)
            if key not in seen:
                seen[key] = np.asarray(model(list(output_token_ids)), dtype=np.float64)
            return seen[key]

    def report() -> FsmReport:
        result = fsm_report(compiled, tokenizer, tokens, next_logits)
        result.last_draw = last["draw"]
        return result

    def text(_: Any = None) -> str:
        return f"{header('the FSM-mask widget')}\n{render_fsm_text(report(), compiled, tokenizer)}"

    if not have_widgets():
        fallback = TextView(text)
        fallback.fsm_tokens = tokens
        return fallback
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import HTML, display

    text_box = widgets.Text(value=prefix, description="prefix", placeholder="type output text here")
    sample = widgets.Button(description="sample next token")
    reset = widgets.Button(description="reset")
    output = widgets.Output()

    def redraw() -> None:
        shown = report()
        with output:
            output.clear_output(wait=True)
            print(f"tokens so far: [{', '.join(shown.tokens)}]")
            print(f"allowed next ({len(shown.step.allowed_token_ids)}): "
                  f"{', '.join(token_texts(tokenizer, shown.step.allowed_token_ids, 12))}")
            display(HTML(render_fsm_html(shown, compiled, tokenizer)))
            figure = fsm_mask_figure(compiled, shown.step)
            display(figure)
            plt.close(figure)

    def on_text(change) -> None:
        tokens[:] = tokenizer.encode(change["new"], add_special_tokens=False)
        last["draw"] = None
        redraw()

    def on_sample(_) -> None:
        step = fsm_walk(compiled, tokens)[-1]
        if step.allowed_token_ids:
            if next_logits is None:
                tokens.append(int(rng.choice(step.allowed_token_ids)))
                last["draw"] = (tokens[-1], "uniform over the allowed tokens: no model given")
            else:
                logits = np.asarray(next_logits(list(tokens)), dtype=np.float64)[: compiled.index.vocab_size]
                dist = masked_distribution(logits, step.allowed_token_ids)
                index = int(rng.choice(len(step.allowed_token_ids), p=dist.probs_after))
                tokens.append(int(step.allowed_token_ids[index]))
                how = f"drawn from the model's masked distribution, p = {dist.probs_after[index]:.3f}"
                last["draw"] = (tokens[-1], how)
        redraw()

    def on_reset(_) -> None:
        tokens.clear()
        last["draw"] = None
        text_box.value = ""
        redraw()

    text_box.observe(on_text, names="value")
    sample.on_click(on_sample)
    reset.on_click(on_reset)
    redraw()
    box = view_box([widgets.HBox([text_box, sample, reset]), output], text)
    box.fsm_tokens = tokens  # the prefix shown (read by tests; the widget owns it)
    return box
