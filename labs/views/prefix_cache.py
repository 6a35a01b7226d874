"""Mirrors no vllm/v1 file: a view of the prefix cache of vllm/v1/core/block_pool.py and kv_cache_manager.py.

`record_prefix_cache(llm, prompts, params)` sends the prompts to a real engine one after the other (each
finishes before the next arrives, as turns of a chat service do) and, after every `step()`, keeps what
the step's `PoolSnapshot` says about the cache (a step observer takes it: `traced_step`, recording.py): each request's
chain of full-block hashes and its block table, every block's hash and ref count, the free queue (the eviction order),
the blocks a hit can resolve to, the hit counters. It reads nothing else (see labs/views/__init__.py).

`prefix_cache_widget(recording)` draws the chains side by side, one row per request, with a step slider:
a cell is a full block (short hash + block id); blocks shared by several requests and blocks that were
prefix hits are highlighted; below, the pool: in use, free but still cached (lazy eviction), free and
empty, in free-queue order, so you see which cached block the next allocation evicts.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from labs.views.colors import request_colors
from labs.views.recording import traced_step

HIT_COLOR = "#ffd54f"       # a block this request got from the cache
SHARED_BORDER = "#d32f2f"   # a block several requests hold now
CACHED_FREE_COLOR = "#c8e6c9"
EMPTY_FREE_COLOR = "#eeeeee"


@dataclass(slots=True)
class PrefixCacheSnapshot:
    """The prefix cache after one engine step."""

    step: int
    block_size: int
    chains: dict[str, list[bytes]]            # request id -> its full-block hashes (last seen)
    block_tables: dict[str, list[int]]        # request id -> its blocks (empty once finished)
    num_cached_tokens: dict[str, int]         # request id -> tokens it got from the cache
    block_hashes: list[bytes | None]          # block id -> hash (None: none)
    ref_cnts: list[int]
    free_queue: list[int]                     # head (evicted next) -> tail
    cached_block_ids: list[int]
    queries: int
    hits: int
    events: list[str] = field(default_factory=list)

    def shared_blocks(self) -> set[int]:
        return {block_id for block_id, count in enumerate(self.ref_cnts) if count > 1}


@dataclass(slots=True)
class PrefixCacheRecording:
    snapshots: list[PrefixCacheSnapshot]
    request_ids: list[str]
    outputs: dict[str, Any] = field(default_factory=dict)   # request id -> its final RequestOutput

    def __len__(self) -> int:
        return len(self.snapshots)


def short_hash(block_hash: bytes | int | None) -> str:
    """The last 4 hex digits of a block hash (vLLM's hashes are bytes; an int is accepted too)."""
    if block_hash is None:
        return "-"
    if isinstance(block_hash, bytes):
        return block_hash[-2:].hex().rjust(4, "0")
    return f"{block_hash & 0xFFFF:04x}"


def _snapshot(pool: Any, counters: Any, scheduler_output: Any, step: int, chains: dict[str, list[int]],
              tables: dict[str, list[int]], cached_tokens: dict[str, int],
              previous: PrefixCacheSnapshot | None) -> PrefixCacheSnapshot:
    """`pool` (a PoolSnapshot) and `counters` (SchedulerStats) after step `step`; `scheduler_output` is that
    step's decision (None: before the first step, or a step that scheduled nothing)."""
    for req_id, hashes in pool.request_block_hashes.items():
        chains[req_id] = list(hashes)
    for req_id, block_ids in pool.block_ids.items():
        if block_ids:
            tables[req_id] = list(block_ids)
    cached_tokens.update(pool.num_cached_tokens)
    live = set(pool.block_ids)
    events = []
    if scheduler_output is not None:
        for new in scheduler_output.scheduled_new_reqs:
            events.append(f"{new.req_id} admitted: {new.num_computed_tokens} tokens were prefix hits")
    if previous is not None:
        for block_id, (old, new) in enumerate(zip(previous.block_hashes, pool.block_hashes, strict=False)):
            if old is not None and new != old:
                events.append(f"block {block_id} evicted (hash {short_hash(old)} dropped)")
        for req_id in previous.block_tables:
            if previous.block_tables[req_id] and req_id not in live:
                events.append(f"{req_id} finished: blocks {previous.block_tables[req_id][::-1]} freed, last first")
    return PrefixCacheSnapshot(
        step=step, block_size=pool.block_size, chains={k: list(v) for k, v in chains.items()},
        block_tables={req_id: (list(tables.get(req_id, [])) if req_id in live else []) for req_id in chains},
        num_cached_tokens=dict(cached_tokens), block_hashes=list(pool.block_hashes),
        ref_cnts=list(pool.block_ref_cnts), free_queue=list(pool.free_block_ids),
        cached_block_ids=list(pool.cached_block_ids), queries=counters.prefix_cache_stats.queries,
        hits=counters.prefix_cache_stats.hits, events=events)


def record_prefix_cache(llm: Any, prompts: Sequence[Any], params: Any) -> PrefixCacheRecording:
    """Send `prompts` one after the other to `llm` (prefix caching on) and snapshot after every step."""
    engine = llm.llm_engine
    chains: dict[str, list[int]] = {}
    tables: dict[str, list[int]] = {}
    cached_tokens: dict[str, int] = {}
    snapshots = [_snapshot(engine.snapshot_pool(), engine.get_scheduler_stats(), None, 0, chains, tables,
                           cached_tokens, None)]
    request_ids, outputs = [], {}
    for index, prompt in enumerate(prompts):
        request_id = f"r{index}"
        request_ids.append(request_id)
        engine.add_request(request_id, prompt, params)
        while engine.has_unfinished_requests():
            step_outputs, trace = traced_step(engine)
            for output in step_outputs:
                if output.finished:
                    outputs[output.request_id] = output
            pool = engine.snapshot_pool() if trace is None else trace.snapshot()
            snapshots.append(_snapshot(pool, engine.get_scheduler_stats(), None if trace is None else
                                       trace.scheduler_output, len(snapshots), chains, tables, cached_tokens,
                                       snapshots[-1]))
    return PrefixCacheRecording(snapshots, request_ids, outputs)


def render_prefix_cache_html(snapshot: PrefixCacheSnapshot, request_ids: Sequence[str]) -> str:
    colors = request_colors(list(request_ids))
    shared = snapshot.shared_blocks()
    rows = []
    for req_id in request_ids:
        if req_id not in snapshot.chains:
            continue
        table = snapshot.block_tables.get(req_id, [])
        num_hit_blocks = snapshot.num_cached_tokens.get(req_id, 0) // snapshot.block_size
        cells = []
        for position, block_hash in enumerate(snapshot.chains[req_id]):
            block_id = table[position] if position < len(table) else None
            background = HIT_COLOR if position < num_hit_blocks else colors[req_id]
            border = f"3px solid {SHARED_BORDER}" if block_id in shared else "1px solid #999"
            label = f"{short_hash(block_hash)}<br><small>{'' if block_id is None else f'#{block_id}'}</small>"
            cells.append(f'<td style="background:{background};border:{border};padding:2px 6px;'
                         f'text-align:center;font-family:monospace">{label}</td>')
        state = "running" if table else "finished"
        rows.append(f"<tr><th style='padding-right:8px'>{html.escape(req_id)} <small>({state}, "
                    f"{snapshot.num_cached_tokens.get(req_id, 0)} cached)</small></th>{''.join(cells)}</tr>")
    pool = []
    cached = set(snapshot.cached_block_ids)
    in_use = [b for b in range(1, len(snapshot.ref_cnts)) if snapshot.ref_cnts[b] > 0]
    for block_id in in_use + snapshot.free_queue:
        used = snapshot.ref_cnts[block_id] > 0
        color = "#90caf9" if used else (CACHED_FREE_COLOR if block_id in cached else EMPTY_FREE_COLOR)
        pool.append(f'<td style="background:{color};border:1px solid #999;padding:2px 4px;font-family:monospace;'
                    f'text-align:center">#{block_id}<br><small>{short_hash(snapshot.block_hashes[block_id])}'
                    f"{' x' + str(snapshot.ref_cnts[block_id]) if used else ''}</small></td>")
    rate = snapshot.hits / snapshot.queries if snapshot.queries else 0.0
    events = "".join(f"<li>{html.escape(e)}</li>" for e in snapshot.events)
    return (f"<div><b>step {snapshot.step}</b> — hits {snapshot.hits} / {snapshot.queries} tokens looked up "
            f"(hit rate {rate:.2f})<table>{''.join(rows)}</table>"
            f"<div style='margin-top:6px'>pool: in use (blue), then the free queue head → tail: cached "
            f"(green, evicted lazily) or empty (grey)</div><table><tr>{''.join(pool)}</tr></table>"
            f"<ul>{events}</ul></div>")


def render_prefix_cache_text(snapshot: PrefixCacheSnapshot, request_ids: Sequence[str]) -> str:
    """The same step as plain text: each request's hash chain (hash#block, hits and shared blocks marked),
    then the pool in eviction order."""
    shared = snapshot.shared_blocks()
    rate = snapshot.hits / snapshot.queries if snapshot.queries else 0.0
    lines = [f"step {snapshot.step}: hits {snapshot.hits} / {snapshot.queries} tokens looked up (hit rate {rate:.2f})",
             "chains: one cell per full block, hash#block; [hit] = from the cache, (shared) = several hold it now"]
    for req_id in request_ids:
        if req_id not in snapshot.chains:
            continue
        table = snapshot.block_tables.get(req_id, [])
        num_hit_blocks = snapshot.num_cached_tokens.get(req_id, 0) // snapshot.block_size
        cells = []
        for position, block_hash in enumerate(snapshot.chains[req_id]):
            block_id = table[position] if position < len(table) else None
            cell = short_hash(block_hash) + ("" if block_id is None else f"#{block_id}")
            cell += " [hit]" if position < num_hit_blocks else ""
            cell += " (shared)" if block_id in shared else ""
            cells.append(cell)
        state = "running" if table else "finished"
        lines.append(f"  {req_id} ({state}, {snapshot.num_cached_tokens.get(req_id, 0)} cached): "
                     + (" -> ".join(cells) or "(no full block yet)"))
    cached = set(snapshot.cached_block_ids)
    in_use = [b for b in range(1, len(snapshot.ref_cnts)) if snapshot.ref_cnts[b] > 0]
    lines.append("in use: " + (", ".join(f"#{b} {short_hash(snapshot.block_hashes[b])} ref {snapshot.ref_cnts[b]}"
                                        for b in in_use) or "(none)"))
    lines.append("free queue, evicted first -> last: " + (", ".join(
        f"#{b} " + (f"cached {short_hash(snapshot.block_hashes[b])}" if b in cached else "empty")
        for b in snapshot.free_queue) or "(empty)"))
    lines.extend(f"  - {event}" for event in snapshot.events)
    return "\n".join(lines)


def prefix_cache_widget(recording: PrefixCacheRecording) -> Any:
    """A step slider (with a play button) over a recorded run; each step redraws the chains and the pool.
    `text(step)` is a step as plain text (without ipywidgets, the widget is that text view alone)."""
    from labs.views.text_view import TextView, have_widgets, replay_text, view_box

    pages = [render_prefix_cache_html(s, recording.request_ids) for s in recording.snapshots]

    def page(step: int) -> str:
        return render_prefix_cache_text(recording.snapshots[step], recording.request_ids)

    title, last = "the prefix-cache widget", len(pages) - 1
    if not have_widgets():
        fallback = TextView(replay_text(title, 0, last, page))
        fallback.pages = pages
        return fallback
    import ipywidgets as widgets

    # Start at step 0: jslink copies the play button's value into the slider when the page draws it, so the
    # slider, the play button and the board must all start on the same step.
    slider = widgets.IntSlider(value=0, min=0, max=len(pages) - 1, description="step")
    play = widgets.Play(value=0, min=0, max=len(pages) - 1, interval=700)
    widgets.jslink((play, "value"), (slider, "value"))
    board = widgets.HTML(pages[0])

    def show(change: dict) -> None:
        board.value = pages[change["new"]]

    slider.observe(show, names="value")
    box = view_box([widgets.HBox([play, slider]), board], replay_text(title, 0, last, page, lambda: slider.value))
    box.pages = pages  # the HTML of every step, for tests and curious learners
    return box
