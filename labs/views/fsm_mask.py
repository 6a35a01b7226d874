"""Mirrors no vllm/v1 file: a view of structured output (vllm/v1/structured_output/): the FSM and its mask.

`compile_grammar(tokenizer, kind, spec)` compiles a regex / JSON schema / choice with mini's backend
(mini/structured_output/backend_mini.py). `fsm_walk(compiled, token_ids)` replays tokens through the DFA
and records, after each one, the state and the allowed-token mask (`compiled.index.mask(state)`: the packed
int32 row the sampler applies). It reads only those compiled objects, never an engine.

`fsm_mask_figure(...)` draws the automaton as a graph (states on a circle, edges labelled with their byte
ranges, the current state filled, accepting states ringed) beside the mask as a grid over the vocabulary
(one cell per token id, allowed cells dark). `fsm_mask_widget(...)` adds a text box (type a prefix) and a
button that samples one allowed token at random, and lists the allowed tokens with their text.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from mini.structured_output.backend_mini import CompiledGrammar, MiniBackend
from mini.structured_output.dfa import DEAD
from mini.structured_output.token_index import unpack_allowed

CURRENT_COLOR = "#ffb300"
STATE_COLOR = "#e3f2fd"
ALLOWED_COLOR = "#1565c0"


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


def fsm_walk(compiled: CompiledGrammar, token_ids: list[int]) -> list[FsmStep]:
    """One FsmStep for the empty prefix and one after each token (stops at the first refused token)."""
    index, dfa = compiled.index, compiled.dfa
    state, steps = 0, []
    for count in range(len(token_ids) + 1):
        if state == DEAD:
            steps.append(FsmStep(token_ids[:count], DEAD, False, []))
            break
        allowed = unpack_allowed(index.mask(state), index.vocab_size)
        steps.append(FsmStep(token_ids[:count], state, dfa.accepting[state], allowed))
        if count == len(token_ids):
            break
        token = token_ids[count]
        data = index.trie_bytes(token)
        state = DEAD if data is None or token not in allowed else dfa.walk(data, state)
    return steps


def _byte_label(values: list[int]) -> str:
    """Bytes -> compact ranges: [48..57] -> '0-9'; non-printable bytes as hex."""
    def show(byte: int) -> str:
        return chr(byte) if 33 <= byte < 127 else ("␠" if byte == 32 else f"{byte:02x}")
    ranges, start = [], values[0]
    for prev, cur in zip(values, [*values[1:], None]):
        if cur is None or cur != prev + 1:
            ranges.append(show(start) if start == prev else f"{show(start)}-{show(prev)}")
            start = cur
    label = ",".join(ranges)
    return label if len(label) <= 14 else label[:12] + "…"


def plot_fsm(compiled: CompiledGrammar, state: int, ax) -> None:
    """The DFA as a graph; `state` filled (DEAD: nothing filled)."""
    dfa = compiled.dfa
    n = dfa.num_states
    pos = [(math.cos(2 * math.pi * i / n + math.pi / 2), math.sin(2 * math.pi * i / n + math.pi / 2))
           for i in range(n)]
    edges: dict[tuple[int, int], list[int]] = {}
    for source, row in enumerate(dfa.transitions):
        for byte, target in enumerate(row):
            if target != DEAD:
                edges.setdefault((source, target), []).append(byte)
    for (source, target), values in edges.items():
        (x0, y0), (x1, y1) = pos[source], pos[target]
        if source == target:
            ax.annotate(_byte_label(values), (x0 * 1.22, y0 * 1.22), fontsize=7, ha="center", color="#555")
            continue
        ax.annotate("", (x1, y1), (x0, y0), arrowprops={"arrowstyle": "->", "color": "#888",
                                                        "shrinkA": 12, "shrinkB": 12,
                                                        "connectionstyle": "arc3,rad=0.15"})
        ax.text(x0 + (x1 - x0) * 0.55, y0 + (y1 - y0) * 0.55, _byte_label(values), fontsize=7, color="#333")
    for i, (x, y) in enumerate(pos):
        face = CURRENT_COLOR if i == state else STATE_COLOR
        ax.scatter([x], [y], s=420, color=face, edgecolors="black", zorder=3)
        if dfa.accepting[i]:
            ax.scatter([x], [y], s=650, facecolors="none", edgecolors="black", zorder=2)
        ax.text(x, y, str(i), ha="center", va="center", fontsize=9, zorder=4)
    ax.set_title("DFA over bytes" + (" (dead: last token refused)" if state == DEAD else f", state {state}"))
    ax.set_xlim(-1.5, 1.5)
    ax.set_ylim(-1.5, 1.5)
    ax.axis("off")


def plot_mask(allowed_token_ids: list[int], vocab_size: int, ax) -> None:
    """The allowed-token mask as a square grid: token id t at row t // side, column t % side."""
    import numpy as np

    side = math.ceil(math.sqrt(vocab_size))
    grid = np.full(side * side, np.nan)
    grid[:vocab_size] = 0.0
    grid[list(allowed_token_ids)] = 1.0
    ax.imshow(grid.reshape(side, side), cmap="Blues", vmin=0, vmax=1.2, interpolation="nearest")
    ax.set_title(f"mask: {len(allowed_token_ids)} of {vocab_size} tokens allowed "
                 f"({math.ceil(vocab_size / 32)} int32 words)")
    ax.set_xticks([])
    ax.set_yticks([])


def token_texts(tokenizer, token_ids: list[int], limit: int = 40) -> list[str]:
    """'id:text' for the first `limit` tokens (EOS shown as its special string)."""
    return [f"{t}:{tokenizer.convert_ids_to_tokens(t)!r}" if t == tokenizer.eos_token_id
            else f"{t}:{tokenizer.decode([t])!r}" for t in token_ids[:limit]]


def fsm_mask_figure(compiled: CompiledGrammar, step: FsmStep):
    """Graph with the current state + the mask grid, side by side."""
    import matplotlib.pyplot as plt

    figure, (graph_ax, mask_ax) = plt.subplots(1, 2, figsize=(11, 4.8))
    plot_fsm(compiled, step.state, graph_ax)
    plot_mask(step.allowed_token_ids, compiled.index.vocab_size, mask_ax)
    figure.tight_layout()
    return figure


def fsm_mask_widget(compiled: CompiledGrammar, tokenizer, seed: int = 0):
    """Type a prefix or sample allowed tokens one by one; the state and the mask follow."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import display

    rng = random.Random(seed)
    text = widgets.Text(description="prefix", placeholder="type output text here")
    sample = widgets.Button(description="sample next token")
    reset = widgets.Button(description="reset")
    output = widgets.Output()
    tokens: list[int] = []

    def redraw() -> None:
        step = fsm_walk(compiled, tokens)[-1]
        with output:
            output.clear_output(wait=True)
            figure = fsm_mask_figure(compiled, step)
            display(figure)
            plt.close(figure)
            print(f"tokens so far: {token_texts(tokenizer, tokens)}")
            print(f"allowed next ({len(step.allowed_token_ids)}): {', '.join(token_texts(tokenizer, step.allowed_token_ids))}")

    def on_text(change) -> None:
        tokens[:] = tokenizer.encode(change["new"], add_special_tokens=False)
        redraw()

    def on_sample(_) -> None:
        step = fsm_walk(compiled, tokens)[-1]
        if step.allowed_token_ids:
            tokens.append(rng.choice(step.allowed_token_ids))
        redraw()

    def on_reset(_) -> None:
        tokens.clear()
        text.value = ""
        redraw()

    text.observe(on_text, names="value")
    sample.on_click(on_sample)
    reset.on_click(on_reset)
    redraw()
    box = widgets.VBox([widgets.HBox([text, sample, reset]), output])
    box.fsm_tokens = tokens  # the prefix shown (read by tests; the widget owns it)
    return box
