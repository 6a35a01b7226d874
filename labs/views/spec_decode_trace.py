"""Mirrors no vllm/v1 file: a trace of speculative decoding (vllm/v1/spec_decode/, vllm/v1/sample/rejection_sampler.py).

`record_spec_decode(llm, prompts, params)` adds the prompts to a real engine built with a
`speculative_config` and steps it to the end. After every `step()` it reads, for each request, the draft
tokens that step verified (`trace.scheduler_output.scheduled_spec_decode_tokens`, from a step observer:
`traced_step`, recording.py) and the tokens the step emitted (the `RequestOutput`s `step()` returns), and the
engine-wide counters of `engine.get_scheduler_stats().spec_decoding_stats` (vLLM's `SpecDecodingStats`
names, cumulative). It reads
nothing else (see labs/views/__init__.py).

How a step's tokens are told apart: the rejection sampler emits the accepted drafts first, so they are the
common prefix of the drafts and the emitted tokens. The token after them is the target's own: a
*recovered* token (a sample of the residual, standing in for the first rejected draft) when a draft was
rejected, or the *bonus* token when every draft was accepted. A recovered token never equals the draft it
replaces (the residual gives that token probability 0), so the prefix rule is exact.

`spec_decode_widget(recording)` replays the run with a step slider: per request, the drafts (accepted
green, the rejected one red with its replacement, the unchecked ones grey, the bonus marked), and beside it
the running histogram of acceptance lengths (matplotlib). `plot_acceptance_histogram`,
`plot_tokens_per_pass` and `plot_rejection_frequencies` are the static figures.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from labs.views.recording import traced_step

ACCEPTED_COLOR = "#c8e6c9"
REJECTED_COLOR = "#ffcdd2"
RECOVERED_COLOR = "#ffe0b2"
BONUS_COLOR = "#d1c4e9"
UNCHECKED_COLOR = "#eeeeee"
PLAIN_COLOR = "#e3f2fd"


@dataclass(slots=True)
class RequestStep:
    """What one engine step did for one request."""

    req_id: str
    num_scheduled_tokens: int   # 1 + the drafts verified (a prefill: the prompt chunk)
    drafts: list[int]           # the draft tokens this step verified (empty: none were proposed)
    emitted: list[int]          # the tokens this step appended to the request
    num_accepted: int           # drafts accepted (the common prefix of drafts and emitted)
    kind: str                   # what the token after the accepted drafts is:
    #   "bonus" (all drafts accepted), "recovered" (a draft was rejected), "plain" (no drafts: an
    #   ordinary sample), "stopped" (the request stopped inside the accepted drafts), "none" (no token:
    #   a prefill chunk)
    finished: bool = False

    @property
    def acceptance_length(self) -> int:
        """Tokens this verification produced, vLLM's convention: accepted drafts + 1."""
        return self.num_accepted + 1


@dataclass(slots=True)
class SpecDecodeStep:
    """One engine step: what each scheduled request verified and emitted, and the counters after it."""

    step: int
    requests: list[RequestStep]
    acceptance_counts: list[int]        # running: acceptance_counts[L - 1] = verifications that produced L tokens
    num_no_draft_steps: int             # running: request-steps that decoded without drafts
    engine_counters: dict[str, Any] = field(default_factory=dict)  # spec_decoding_stats after the step

    def mean_acceptance_length(self) -> float:
        total = sum(self.acceptance_counts)
        if not total:
            return 0.0
        return sum((length + 1) * count for length, count in enumerate(self.acceptance_counts)) / total


@dataclass(slots=True)
class SpecDecodeRecording:
    steps: list[SpecDecodeStep]
    request_ids: list[str]
    num_speculative_tokens: int                                     # k (0: no speculation)
    method: str | None
    prompt_token_ids: dict[str, list[int]] = field(default_factory=dict)
    output_token_ids: dict[str, list[int]] = field(default_factory=dict)  # every token each request produced
    token_texts: dict[int, str] = field(default_factory=dict)      # token id -> text, when a tokenizer is known

    def __len__(self) -> int:
        return len(self.steps)

    def num_target_passes(self, req_id: str | None = None) -> int:
        """Target forward passes that computed tokens of `req_id` (None: of any request)."""
        return sum(1 for step in self.steps
                   if any(req_id is None or r.req_id == req_id for r in step.requests if r.num_scheduled_tokens))

    def num_generated_tokens(self, req_id: str | None = None) -> int:
        ids = self.request_ids if req_id is None else [req_id]
        return sum(len(self.output_token_ids.get(rid, [])) for rid in ids)

    def tokens_per_pass(self, req_id: str | None = None) -> float:
        """Generated tokens per target forward pass (1.0 without speculation, one request)."""
        passes = self.num_target_passes(req_id)
        return self.num_generated_tokens(req_id) / passes if passes else 0.0

    def token_text(self, token_id: int) -> str:
        return self.token_texts.get(token_id, str(token_id))


def classify(drafts: Sequence[int], emitted: Sequence[int]) -> tuple[int, str]:
    """(accepted drafts, kind of the token after them) for one request's step; see RequestStep.kind."""
    num_accepted = 0
    while num_accepted < min(len(drafts), len(emitted)) and drafts[num_accepted] == emitted[num_accepted]:
        num_accepted += 1
    if not emitted:
        return 0, "none"
    if not drafts:
        return 0, "plain"
    if num_accepted == len(emitted):        # the request stopped (max_tokens, EOS) inside the accepted drafts
        return num_accepted, "stopped"
    return num_accepted, "bonus" if num_accepted == len(drafts) else "recovered"


def _counters(engine: Any, enabled: bool) -> dict[str, Any]:
    if not enabled:
        return {}
    spec = engine.get_scheduler_stats().spec_decoding_stats
    return {"num_drafts": spec.num_drafts, "num_draft_tokens": spec.num_draft_tokens,
            "num_accepted_tokens": spec.num_accepted_tokens,
            "num_accepted_tokens_per_pos": list(spec.num_accepted_tokens_per_pos),
            "mean_acceptance_length": spec.mean_acceptance_length}


def _new_tokens(output: Any, seen: int, delta: bool) -> list[int]:
    token_ids = list(output.outputs[0].token_ids)
    return token_ids if delta else token_ids[seen:]


def record_spec_decode(llm: Any, prompts: Sequence[Any], params: Any, max_steps: int = 1000,
                       tokenizer: Any = None) -> SpecDecodeRecording:
    """Add `prompts` as requests r0, r1, ... to `llm` and step it to the end, recording every step.

    Works with any `params.output_kind` (DELTA gives only the new tokens; CUMULATIVE is cut here).
    `tokenizer` (default: the engine's, if it has one) names the tokens in the widget.
    """
    from mini.sampling_params import RequestOutputKind

    engine = llm.llm_engine
    config = engine.config.speculative_config
    if tokenizer is None:
        try:
            tokenizer = llm.get_tokenizer()
        except ValueError:       # skip_tokenizer_init=True
            tokenizer = None
    delta = params.output_kind == RequestOutputKind.DELTA
    request_ids = [f"r{index}" for index in range(len(prompts))]
    for req_id, prompt in zip(request_ids, prompts, strict=False):
        engine.add_request(req_id, prompt, params)
    produced: dict[str, list[int]] = {req_id: [] for req_id in request_ids}
    prompt_ids: dict[str, list[int]] = {}
    histogram = [0] * ((config.num_speculative_tokens if config is not None else 0) + 1)
    no_draft = 0
    steps: list[SpecDecodeStep] = []
    for number in range(1, max_steps + 1):
        if not engine.has_unfinished_requests():
            break
        outputs, trace = traced_step(engine, snapshot=False)   # trace None: the step scheduled nothing
        scheduler_output = None if trace is None else trace.scheduler_output
        scheduled = {} if scheduler_output is None else dict(scheduler_output.num_scheduled_tokens)
        spec_tokens = {} if scheduler_output is None else scheduler_output.scheduled_spec_decode_tokens
        emitted: dict[str, list[int]] = {}
        finished: set[str] = set()
        for output in outputs:
            req_id = output.request_id
            if output.prompt_token_ids is not None:
                prompt_ids.setdefault(req_id, list(output.prompt_token_ids))
            new = _new_tokens(output, len(produced.get(req_id, [])), delta)
            emitted[req_id] = new
            produced.setdefault(req_id, []).extend(new)
            if output.finished:
                finished.add(req_id)
        rows = []
        for req_id in [r for r in request_ids if r in scheduled or r in emitted] + \
                [r for r in scheduled if r not in request_ids]:
            drafts = [int(t) for t in spec_tokens.get(req_id, [])]
            new = emitted.get(req_id, [])
            num_accepted, kind = classify(drafts, new)
            if drafts and new:
                length = min(num_accepted + 1, len(histogram))
                histogram[length - 1] += 1
            elif new and scheduled.get(req_id, 0) == 1:
                no_draft += 1
            rows.append(RequestStep(req_id, scheduled.get(req_id, 0), drafts, new, num_accepted, kind,
                                    req_id in finished))
        steps.append(SpecDecodeStep(number, rows, list(histogram), no_draft, _counters(engine, config is not None)))
    texts: dict[int, str] = {}
    if tokenizer is not None:
        every = {t for ids in list(produced.values()) + list(prompt_ids.values()) for t in ids}
        every |= {t for step in steps for row in step.requests for t in row.drafts}
        texts = {t: tokenizer.decode([t]) for t in every}
    return SpecDecodeRecording(steps, request_ids, len(histogram) - 1, None if config is None else config.method,
                               prompt_ids, produced, texts)


# ---------------------------------------------------------------- drawing
def _chip(text: str, background: str, title: str, strike: bool = False, mark: str = "") -> str:
    decoration = "line-through" if strike else "none"
    shown = html.escape(text.replace("\n", "\\n")) or "&nbsp;"
    badge = f"<sup style='font-size:9px'>{mark}</sup>" if mark else ""
    return (f'<span title="{html.escape(title)}" style="background:{background};border:1px solid #999;'
            f"border-radius:3px;padding:1px 4px;margin:1px;font-family:monospace;white-space:pre;"
            f'text-decoration:{decoration};display:inline-block">{shown}{badge}</span>')


def _context_tail(recording: SpecDecodeRecording, req_id: str, before: int, count: int = 6) -> str:
    tokens = recording.prompt_token_ids.get(req_id, []) + recording.output_token_ids.get(req_id, [])[:before]
    tail = "".join(recording.token_text(t) for t in tokens[-count:]) if recording.token_texts else \
        " ".join(str(t) for t in tokens[-count:])
    return html.escape(("…" if len(tokens) > count else "") + tail.replace("\n", "\\n"))


def render_request_row(recording: SpecDecodeRecording, row: RequestStep, produced_before: int) -> str:
    """One request's step as coloured chips: accepted, rejected + replacement, unchecked, bonus."""
    name = recording.token_text
    chips = []
    if row.kind == "none":
        chips.append(f"<i>prefill chunk of {row.num_scheduled_tokens} prompt tokens, no token yet</i>")
    elif row.kind == "plain":
        what = "prefill" if row.num_scheduled_tokens > 1 else "no drafts proposed"
        chips.append(_chip(name(row.emitted[0]), PLAIN_COLOR, f"sampled by the target ({what})"))
        chips.append(f"<small>&nbsp;{what}</small>")
    else:
        for position, token in enumerate(row.drafts):
            if position < row.num_accepted:
                chips.append(_chip(name(token), ACCEPTED_COLOR, f"draft {position + 1}: accepted"))
            elif position == row.num_accepted and row.kind == "recovered":
                chips.append(_chip(name(token), REJECTED_COLOR, f"draft {position + 1}: rejected", strike=True))
                replacement = row.emitted[row.num_accepted]
                chips.append("&rarr;" + _chip(name(replacement), RECOVERED_COLOR,
                                              "recovered: sampled from the residual max(0, p - q)", mark="rec"))
            else:
                chips.append(_chip(name(token), UNCHECKED_COLOR,
                                   f"draft {position + 1}: never looked at (an earlier draft was rejected"
                                   " or the request stopped)"))
        if row.kind == "bonus":
            chips.append("+" + _chip(name(row.emitted[-1]), BONUS_COLOR,
                                     "bonus: the target's token after all drafts were accepted", mark="bonus"))
        summary = f"{row.num_accepted}/{len(row.drafts)} accepted, {len(row.emitted)} token(s) out"
        if row.kind == "stopped":
            summary += " (the request stopped)"
        chips.append(f"<small>&nbsp;{summary}</small>")
    finished = " <small>(finished)</small>" if row.finished else ""
    return (f"<tr><th style='text-align:left;padding-right:6px'>{html.escape(row.req_id)}{finished}</th>"
            f"<td style='color:#777;font-family:monospace;white-space:pre;padding-right:6px'>"
            f"{_context_tail(recording, row.req_id, produced_before)}</td><td>{''.join(chips)}</td></tr>")


def render_spec_step_html(recording: SpecDecodeRecording, index: int) -> str:
    """The board of step `index` (0-based into recording.steps)."""
    step = recording.steps[index]
    produced: dict[str, int] = {}
    for earlier in recording.steps[:index]:
        for row in earlier.requests:
            produced[row.req_id] = produced.get(row.req_id, 0) + len(row.emitted)
    rows = "".join(render_request_row(recording, row, produced.get(row.req_id, 0)) for row in step.requests)
    counters = step.engine_counters
    if not counters:
        engine = "no speculation (no counters)"
    elif not counters["num_drafts"]:
        engine = "engine counters: no drafts verified yet"
    else:
        engine = (f"engine counters: {counters['num_drafts']} drafts, {counters['num_draft_tokens']} draft tokens, "
                  f"{counters['num_accepted_tokens']} accepted, mean acceptance length "
                  f"{counters['mean_acceptance_length']:.2f}")
    legend = " ".join((_chip("accepted", ACCEPTED_COLOR, ""), _chip("rejected", REJECTED_COLOR, "", strike=True),
                       _chip("recovered", RECOVERED_COLOR, ""), _chip("bonus", BONUS_COLOR, ""),
                       _chip("unchecked", UNCHECKED_COLOR, ""), _chip("no drafts", PLAIN_COLOR, "")))
    method = recording.method or "none"
    return (f"<div style='font-family:sans-serif'><b>step {step.step}</b> of {len(recording.steps)} "
            f"&mdash; method {html.escape(method)}, k={recording.num_speculative_tokens}; one target pass "
            f"verified these drafts<table style='margin-top:4px'><tr><th>request</th><th>context</th>"
            f"<th>drafts verified, and what came out</th></tr>{rows}</table>"
            f"<div style='margin-top:4px'>{legend}</div><div><small>{engine}</small></div></div>")


ORIGIN_COLORS = {"accepted": ACCEPTED_COLOR, "recovered": RECOVERED_COLOR, "bonus": BONUS_COLOR,
                 "plain": "#ffffff"}


def token_origins(recording: SpecDecodeRecording, req_id: str) -> list[tuple[int, str]]:
    """Every output token of `req_id` with how it was made: 'accepted' (a draft the target agreed with),
    'recovered', 'bonus' or 'plain' (an ordinary sample: prefill, or a decode step without drafts)."""
    origins = []
    for step in recording.steps:
        for row in step.requests:
            if row.req_id != req_id:
                continue
            for position, token in enumerate(row.emitted):
                if position < row.num_accepted:
                    origins.append((token, "accepted"))
                else:
                    origins.append((token, row.kind if row.kind in ("recovered", "bonus") else "plain"))
    return origins


def render_output_html(recording: SpecDecodeRecording, req_id: str) -> str:
    """The request's output text, each token shaded by how it was made (see `token_origins`)."""
    spans = []
    counts: dict[str, int] = {}
    for token, origin in token_origins(recording, req_id):
        counts[origin] = counts.get(origin, 0) + 1
        text = html.escape(recording.token_text(token))
        spans.append(f'<span title="{token}: {origin}" style="background:{ORIGIN_COLORS[origin]}">{text}</span>')
    legend = ", ".join(f'<span style="background:{ORIGIN_COLORS[o]}">{o}</span> {counts.get(o, 0)}'
                       for o in ORIGIN_COLORS)
    return (f"<div style='font-family:monospace;white-space:pre-wrap;border:1px solid #ccc;padding:4px'>"
            f"{''.join(spans)}</div><div style='font-family:sans-serif'><small>{legend}</small></div>")


def plot_acceptance_histogram(recording: SpecDecodeRecording, index: int | None = None, ax: Any = None) -> Any:
    """Acceptance lengths (accepted drafts + 1) of every verification up to step `index` (None: the end)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    step = recording.steps[-1 if index is None else index]
    counts = step.acceptance_counts
    if ax is None:
        _, ax = plt.subplots(figsize=(3.6, 2.6))
    lengths = list(range(1, len(counts) + 1))
    colors = ["#e57373" if length == 1 else "#81c784" for length in lengths]
    ax.bar(lengths, counts, color=colors)
    ax.set_xticks(lengths)
    ax.set_ylim(0, max(1, *counts) * 1.1)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("tokens out of one verification")
    ax.set_ylabel("verifications")
    total = sum(counts)
    mean = f"mean {step.mean_acceptance_length():.2f}" if total else "no drafts yet"
    ax.set_title(f"up to step {step.step}: {total} verifications, {mean}\n"
                 f"({step.num_no_draft_steps} decode(s) without drafts)", fontsize=8)
    return ax


def plot_tokens_per_pass(recordings: dict[str, SpecDecodeRecording], ax: Any = None) -> Any:
    """One bar per run: generated tokens per target forward pass."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(1.4 * len(recordings) + 1.5, 2.8))
    names = list(recordings)
    values = [recordings[name].tokens_per_pass() for name in names]
    ax.bar(range(len(names)), values, color=["#bab0ac"] + ["#4e79a7"] * (len(names) - 1))
    for x, value in enumerate(values):
        ax.text(x, value, f"{value:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_ylabel("tokens per target pass")
    ax.set_ylim(0, max(values, default=1.0) * 1.15)
    ax.set_title("same greedy output, fewer passes of the big model", fontsize=9)
    return ax


def plot_rejection_frequencies(target_probs: Sequence[float], draft_probs: Sequence[float] | None,
                               counts: Sequence[int], ax: Any = None) -> Any:
    """The target p and the draft q (bars) against how often each token came out first (dots)."""
    import matplotlib.pyplot as plt

    vocab = list(range(len(target_probs)))
    if ax is None:
        _, ax = plt.subplots(figsize=(0.6 * len(vocab) + 2.5, 2.8))
    width = 0.4 if draft_probs is not None else 0.7
    target_x = [v - (width / 2 if draft_probs is not None else 0) for v in vocab]
    ax.bar(target_x, target_probs, width=width, color="#4e79a7", label="target p")
    if draft_probs is not None:
        ax.bar([v + width / 2 for v in vocab], draft_probs, width=width, color="#f28e2b", label="draft q")
    total = sum(counts)
    ax.plot(target_x, [c / total for c in counts], "o", color="#e15759", label=f"first token out ({total} rows)")
    ax.set_xticks(vocab)
    ax.set_xlabel("token id")
    ax.legend(fontsize=7)
    ax.set_title("what the rejection sampler emits follows p, not q", fontsize=9)
    return ax


def spec_decode_widget(recording: SpecDecodeRecording) -> Any:
    """A step slider (with a play button) over a recorded run: the step's drafts and verdicts, and the
    running acceptance-length histogram beside them. `text(step)` is a step as plain text, with the
    histogram's counts (without ipywidgets, the widget is that text view alone)."""
    from labs.views.text_view import TextView, have_widgets, html_to_text, replay_text, view_box

    pages = [render_spec_step_html(recording, index) for index in range(len(recording.steps))]
    first, last = recording.steps[0].step, recording.steps[-1].step

    def page(step: int) -> str:
        counts = list(recording.steps[step - first].acceptance_counts)
        return (html_to_text(pages[step - first]) + "\nacceptance-length histogram so far (verifications "
                f"that produced 1, 2, 3, ... tokens): {counts}")

    title = "the spec-decode widget"
    if not have_widgets():
        fallback = TextView(replay_text(title, first, last, page))
        fallback.pages = pages
        return fallback
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import display

    # Start on the first step: jslink copies the play button's value into the slider when the page draws it.
    slider = widgets.IntSlider(value=first, min=first, max=last, description="step")
    play = widgets.Play(value=first, min=first, max=last, interval=800)
    widgets.jslink((play, "value"), (slider, "value"))
    board = widgets.HTML(pages[0])
    histogram = widgets.Output(layout=widgets.Layout(min_width="330px"))
    shown: dict[str, Any] = {}   # what the histogram draws now (read by tests)

    def draw(index: int) -> None:
        shown.update(step=recording.steps[index].step, acceptance_counts=list(recording.steps[index].acceptance_counts))
        with histogram:
            histogram.clear_output(wait=True)
            ax = plot_acceptance_histogram(recording, index)
            ax.figure.tight_layout()
            display(ax.figure)
            plt.close(ax.figure)

    def show(change: dict) -> None:
        index = change["new"] - first
        board.value = pages[index]
        draw(index)

    slider.observe(show, names="value")
    draw(0)
    box = view_box([widgets.HBox([play, slider]), widgets.HBox([board, histogram])],
                   replay_text(title, first, last, page, lambda: slider.value))
    box.pages = pages  # the HTML of every step, for tests and curious learners
    box.histogram_shown = shown
    return box
