"""The kernel-access view: which program of the paged decode kernel reads which KV blocks and slots.

Mirrors no single vllm/v1 file; it draws what a decode program of `kernel_unified_attention` in
vllm/v1/attention/ops/triton_unified_attention.py (and mini/attention/triton_paged.py, `_paged_decode_kernel`)
does in memory: program (request r, KV head h)
walks request r's positions tile by tile, turns each position into (block, offset) through the block table,
and reads the key and value of KV head h at that slot.

Two ways to get the same plain-data model, `KernelAccess`:

- `record_paged_decode(query, kv_cache, metadata, scale)`: RUN the Triton kernel under the interpreter
  (TRITON_INTERPRET=1) and record every masked-in load that lands in the KV cache, per program;
- `replay_paged_decode(query, kv_cache, metadata, scale)`: a PyTorch model of the same kernel (same grid,
  same tiles, same online softmax through `online_softmax_update`), for machines without Triton. It also
  returns the attention output, so it doubles as a readable reference of the kernel's math.

Then `plot_kernel_access(access)` (matplotlib), `render_kernel_access_html(access, step)` and
`kernel_access_widget(access)` (a slider over the kernel's (program, tile) steps) draw it.
"""

from __future__ import annotations

import contextlib
import functools
import html
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from labs.views.colors import FREE_COLOR, NULL_COLOR, request_colors

DECODE_TILE_N = 16  # key/value positions per loop iteration, as in mini/attention/triton_paged.py


# ---------------------------------------------------------------- the math of one tile


def online_softmax_update(
    running_max: torch.Tensor, running_sum: torch.Tensor, acc: torch.Tensor, scores: torch.Tensor,
    values: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold one tile of keys into the running softmax state; returns (new_max, new_sum, new_acc).

    running_max, running_sum: [G] (G query rows); acc: [G, D], the un-normalized weighted sum of values;
    scores: [G, N] (already scaled; -inf where a position is masked); values: [N, D].
    After the last tile, `acc / running_sum` is softmax(all scores) @ all values.
    """
    new_max = torch.maximum(running_max, scores.max(dim=1).values)
    safe_max = torch.where(new_max == float("-inf"), torch.zeros_like(new_max), new_max)  # nothing seen yet
    correction = torch.exp(running_max - safe_max)  # rescales what was summed under the old max
    probs = torch.exp(scores - safe_max[:, None])
    new_sum = running_sum * correction + probs.sum(dim=1)
    new_acc = acc * correction[:, None] + probs @ values
    return new_max, new_sum, new_acc


# ---------------------------------------------------------------- the plain-data model


@dataclass(slots=True)
class TileAccess:
    """One loop iteration of one program: the cache slots whose key AND value it read."""

    tile: int  # loop iteration, 0 = first
    positions: list[int]  # positions of the request (masked-in lanes only)
    block_ids: list[int]  # physical block of each position (through the block table)
    offsets: list[int]  # offset inside that block


@dataclass(slots=True)
class ProgramAccess:
    """One program of the grid: (request, KV head), serving the group of query heads that share it."""

    request: int
    kv_head: int
    query_heads: list[int]
    tiles: list[TileAccess] = field(default_factory=list)

    def slots(self, block_size: int) -> list[int]:
        """Every slot it read, in reading order (slot = block * block_size + offset)."""
        return [b * block_size + o for t in self.tiles for b, o in zip(t.block_ids, t.offsets, strict=False)]

    def blocks(self) -> list[int]:
        """The distinct physical blocks it read, in first-read order."""
        return list(dict.fromkeys(b for t in self.tiles for b in t.block_ids))


@dataclass(slots=True)
class KernelAccess:
    """What the decode kernel read: one ProgramAccess per program of the (requests, KV heads) grid."""

    source: str  # "interpreter" (recorded from a Triton run) or "replay" (the PyTorch model)
    block_size: int
    num_blocks: int
    num_kv_heads: int
    group_size: int  # query heads per KV head (GQA)
    tile_n: int
    seq_lens: list[int]
    block_tables: list[list[int]]  # per request, the blocks its seq_len needs
    programs: list[ProgramAccess]

    def program(self, request: int, kv_head: int) -> ProgramAccess:
        return next(p for p in self.programs if p.request == request and p.kv_head == kv_head)

    def steps(self) -> list[tuple[int, int]]:
        """(program index, tile index) in launch order: what the widget's slider walks through."""
        return [(i, t) for i, p in enumerate(self.programs) for t in range(len(p.tiles))]

    def same_reads(self, other: KernelAccess) -> bool:
        """True when both saw the same grid read the same slots in the same tiles."""
        def key(access: KernelAccess) -> list:
            return [(p.request, p.kv_head, p.query_heads, [(t.tile, t.block_ids, t.offsets) for t in p.tiles])
                    for p in access.programs]
        return key(self) == key(other)


def _shape_info(query: torch.Tensor, kv_cache: torch.Tensor, metadata: Any) -> dict[str, Any]:
    _, num_blocks, block_size, num_kv_heads, _ = kv_cache.shape
    seq_lens = [int(s) for s in metadata.seq_lens.tolist()]
    table = metadata.block_table.tolist()
    block_tables = [list(table[r][: -(-s // block_size)]) for r, s in enumerate(seq_lens)]
    return {"block_size": block_size, "num_blocks": num_blocks, "num_kv_heads": num_kv_heads,
            "group_size": query.shape[1] // num_kv_heads, "seq_lens": seq_lens, "block_tables": block_tables}


def _empty_programs(info: dict[str, Any], query_start_loc: list[int]) -> list[ProgramAccess]:
    """The grid, in launch order (request-major, as the interpreter runs it); skips requests with q_len != 1."""
    programs = []
    group = info["group_size"]
    for request in range(len(info["seq_lens"])):
        if query_start_loc[request + 1] - query_start_loc[request] != 1:
            continue
        for kv_head in range(info["num_kv_heads"]):
            programs.append(ProgramAccess(request, kv_head, list(range(kv_head * group, (kv_head + 1) * group))))
    return programs


# ---------------------------------------------------------------- the PyTorch replay


def replay_paged_decode(
    query: torch.Tensor, kv_cache: torch.Tensor, metadata: Any, scale: float, tile_n: int = DECODE_TILE_N,
    update: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None,
) -> tuple[torch.Tensor, KernelAccess]:
    """The decode kernel, program by program and tile by tile, in PyTorch: (output [B, Hq, D], access).

    Same arithmetic as `_paged_decode_kernel`: program (r, h) takes request r's single query token, the
    query heads of KV head h, and for each tile of `tile_n` positions reads keys and values through the
    block table, then folds them in with `update` (default: the reference `online_softmax_update`; phase
    07 passes the learner's).
    """
    update = online_softmax_update if update is None else update
    info = _shape_info(query, kv_cache, metadata)
    block_size, group = info["block_size"], info["group_size"]
    starts = [int(s) for s in metadata.query_start_loc.tolist()]
    programs = _empty_programs(info, starts)
    output = torch.zeros_like(query)
    for program in programs:
        request, kv_head = program.request, program.kv_head
        token, seq_len = starts[request], info["seq_lens"][request]
        table = metadata.block_table[request].long().cpu()
        q = query[token, program.query_heads].float() * scale  # [G, D]
        running_max = torch.full((group,), float("-inf"))
        running_sum = torch.zeros(group)
        acc = torch.zeros(group, query.shape[2])
        for tile, tile_start in enumerate(range(0, seq_len, tile_n)):
            positions = torch.arange(tile_start, min(tile_start + tile_n, seq_len))
            block_ids = table[positions // block_size]
            offsets = positions % block_size
            keys = kv_cache[0, block_ids, offsets, kv_head].float().cpu()  # [N, D]
            values = kv_cache[1, block_ids, offsets, kv_head].float().cpu()
            scores = q.cpu() @ keys.T  # [G, N]
            running_max, running_sum, acc = update(running_max, running_sum, acc, scores, values)
            program.tiles.append(TileAccess(tile, positions.tolist(), block_ids.tolist(), offsets.tolist()))
        out = acc / torch.where(running_sum > 0, running_sum, torch.ones_like(running_sum))[:, None]
        output[token, program.query_heads] = out.to(query.dtype).to(query.device)
    return output, KernelAccess("replay", tile_n=tile_n, programs=programs, **info)


# ---------------------------------------------------------------- recording an interpreter run


@contextlib.contextmanager
def _recording_loads(on_load: Callable[[tuple[int, int, int], Any, Any], None]) -> Iterator[None]:
    """Call on_load(program id, addresses, mask) for every tl.load the Triton interpreter executes."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    original = builder.create_masked_load

    def create_masked_load(ptrs, mask, *args, **kwargs):
        on_load(builder.grid_idx, ptrs.data, mask.data)
        return original(ptrs, mask, *args, **kwargs)

    builder.create_masked_load = create_masked_load
    try:
        yield
    finally:
        del builder.create_masked_load  # back to the class method


def record_paged_decode(
    query: torch.Tensor, kv_cache: torch.Tensor, metadata: Any, scale: float, decode: Callable | None = None
) -> tuple[torch.Tensor, KernelAccess]:
    """Run the Triton decode kernel under the interpreter and record which cache slots each program read.

    `decode` defaults to `mini.attention.triton_paged.paged_decode`'s single-pass kernel, one program per
    (request, KV head), the one phase 07 writes (any function with its signature works,
    e.g. your own). Every load whose addresses fall inside the KV cache is decoded back into
    (key/value, block, offset, KV head); tiles are counted per program from its key loads.
    Needs Triton in interpreter mode (CPU tensors); raises RuntimeError otherwise.
    """
    from mini.attention import triton_utils

    if not triton_utils.is_available():
        raise RuntimeError(triton_utils.unavailable_reason())
    from mini.attention import triton_paged  # imports Triton, in interpreter mode when there is no GPU

    if not triton_utils.use_interpreter() or kv_cache.is_cuda:
        raise RuntimeError("record_paged_decode needs TRITON_INTERPRET=1 and CPU tensors; "
                           "use replay_paged_decode on a GPU")
    if decode is None:
        decode = triton_paged.paged_decode
        if "num_segments" in inspect.signature(decode).parameters:   # the single-pass kernel (phase 07's),
            decode = functools.partial(decode, num_segments=0)      # not the engine's split decode
    info = _shape_info(query, kv_cache, metadata)
    base, item = kv_cache.data_ptr(), kv_cache.element_size()
    end = base + kv_cache.numel() * item
    strides = kv_cache.stride()
    loads: dict[tuple[int, int], list[list[tuple[int, int, int, int]]]] = {}  # program -> key loads, value loads

    lanes: list[int] = []  # positions per key/value load, masked lanes included: the kernel's tile size

    def on_load(grid_idx, addresses, mask) -> None:
        num_lanes = addresses.shape[0] if addresses.ndim == 2 else 1
        addresses, mask = addresses.reshape(-1), mask.reshape(-1)
        inside = mask & (addresses >= base) & (addresses < end)
        if not inside.any():
            return
        reads = []
        for address in addresses[inside].tolist():
            element = (address - base) // item
            side, element = divmod(element, strides[0])
            block, element = divmod(element, strides[1])
            offset, element = divmod(element, strides[2])
            head, dim = divmod(element, strides[3])
            if dim == 0:  # one entry per (slot, head): the first lane of the head_size vector
                reads.append((side, block, offset, head))
        lanes.append(num_lanes)
        per_side = loads.setdefault((grid_idx[0], grid_idx[1]), [[], []])
        per_side[reads[0][0]].append(reads)

    with _recording_loads(on_load):
        output = decode(query, kv_cache, metadata, scale)
    starts = [int(s) for s in metadata.query_start_loc.tolist()]
    programs = _empty_programs(info, starts)
    for program in programs:
        key_loads, value_loads = loads.get((program.request, program.kv_head), [[], []])
        if [[r[1:] for r in load] for load in key_loads] != [[r[1:] for r in load] for load in value_loads]:
            raise AssertionError(f"program {program.request, program.kv_head}: keys and values read different slots")
        table = info["block_tables"][program.request]
        for tile, reads in enumerate(key_loads):
            if any(head != program.kv_head for *_, head in reads):
                raise AssertionError(f"program {program.request, program.kv_head} read another KV head")
            block_ids = [block for _, block, _, _ in reads]
            offsets = [offset for _, _, offset, _ in reads]
            positions = [table.index(b) * info["block_size"] + o for b, o in zip(block_ids, offsets, strict=False)]
            program.tiles.append(TileAccess(tile, positions, block_ids, offsets))
    return output, KernelAccess("interpreter", tile_n=max(lanes, default=0), programs=programs, **info)


# ---------------------------------------------------------------- drawing


def _slot_owner(access: KernelAccess) -> dict[int, int]:
    """slot -> request that owns it (from the block tables, up to each seq_len)."""
    owner = {}
    for request, (table, seq_len) in enumerate(zip(access.block_tables, access.seq_lens, strict=False)):
        for position in range(seq_len):
            owner[table[position // access.block_size] * access.block_size + position % access.block_size] = request
    return owner


def render_kernel_access_html(access: KernelAccess, step: int | None = None) -> str:
    """The KV pool as rows of blocks (one cell per slot); `step` highlights what that (program, tile) read."""
    colors = request_colors([f"r{r}" for r in range(len(access.seq_lens))])
    owner = _slot_owner(access)
    steps = access.steps()
    highlight: set[int] = set()
    title = "all programs"
    if step is not None and steps:
        program_index, tile = steps[step]
        program = access.programs[program_index]
        read = program.tiles[tile]
        highlight = {b * access.block_size + o for b, o in zip(read.block_ids, read.offsets, strict=False)}
        title = (f"step {step}: program (request {program.request}, KV head {program.kv_head}) "
                 f"for query heads {program.query_heads}, tile {tile}: positions {read.positions[0]}.."
                 f"{read.positions[-1]} in blocks {list(dict.fromkeys(read.block_ids))}")
    rows = []
    for block in range(access.num_blocks):
        cells = []
        for offset in range(access.block_size):
            slot = block * access.block_size + offset
            request = owner.get(slot)
            color = NULL_COLOR if block == 0 else FREE_COLOR if request is None else colors[f"r{request}"]
            border = "3px solid #000" if slot in highlight else "1px solid #bbb"
            label = "" if request is None else f"r{request}"
            cells.append(f'<span title="slot {slot}" style="display:inline-block;width:26px;height:18px;'
                         f'background:{color};border:{border};font:9px monospace;color:#fff;'
                         f'text-align:center">{label}</span>')
        rows.append(f'<div><span style="font:10px monospace;display:inline-block;width:64px">block {block}'
                    f'</span>{"".join(cells)}</div>')
    return (f"<div style='font-family:sans-serif'><b>{html.escape(title)}</b> "
            f"(block_size={access.block_size}, tile={access.tile_n}, source: {access.source}){''.join(rows)}</div>")


def plot_kernel_access(access: KernelAccess, ax: Any = None) -> Any:
    """Static figure: one row per program, one column per cache slot; a mark where that program read it,
    its shade the tile (loop iteration) that read it. Returns the Axes."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgba

    num_slots = access.num_blocks * access.block_size
    colors = request_colors([f"r{r}" for r in range(len(access.seq_lens))])
    if ax is None:
        _, ax = plt.subplots(figsize=(max(6.0, num_slots * 0.16), 0.45 * len(access.programs) + 1.6))
    max_tiles = max((len(p.tiles) for p in access.programs), default=1)
    for row, program in enumerate(access.programs):
        base = to_rgba(colors[f"r{program.request}"])
        for tile in program.tiles:
            shade = 1.0 - 0.55 * tile.tile / max(1, max_tiles - 1) if max_tiles > 1 else 1.0
            for lane, (block, offset) in enumerate(zip(tile.block_ids, tile.offsets, strict=False)):
                slot = block * access.block_size + offset
                ax.add_patch(plt.Rectangle((slot, row), 1, 0.85, facecolor=(*base[:3], shade), edgecolor="white",
                                            linewidth=0.5))
                if lane == 0 or offset == 0:  # label where a tile starts and where it enters a new block
                    ax.text(slot + 0.5, row + 0.42, str(tile.tile), ha="center", va="center", fontsize=6,
                            color="white")
    for block in range(access.num_blocks + 1):
        ax.axvline(block * access.block_size, color="#999", linewidth=0.6)
    ax.set_xlim(0, num_slots)
    ax.set_ylim(len(access.programs), -0.2)
    ax.set_yticks([row + 0.42 for row in range(len(access.programs))])
    ax.set_yticklabels([f"r{p.request} kv{p.kv_head} (q{p.query_heads[0]}-{p.query_heads[-1]})"
                        for p in access.programs], fontsize=7)
    ax.set_xticks([b * access.block_size + access.block_size / 2 for b in range(access.num_blocks)])
    ax.set_xticklabels(["null"] + [str(b) for b in range(1, access.num_blocks)], fontsize=7)
    ax.set_xlabel("KV cache: physical block (each column is one slot); number = tile that read it")
    ax.set_title(f"paged decode: which program reads which slots ({access.source}, tile={access.tile_n}, "
                 f"block_size={access.block_size})", fontsize=9, loc="left")
    return ax


def kernel_access_widget(access: KernelAccess) -> Any:
    """A slider (with play button) over the kernel's (program, tile) steps, redrawing the HTML pool view.
    `text(k)` is step k as plain text (without ipywidgets, the widget is that text view alone)."""
    from labs.views.text_view import TextView, have_widgets, html_to_text, replay_text, view_box

    last = max(0, len(access.steps()) - 1)

    def page(step: int) -> str:
        return html_to_text(render_kernel_access_html(access, step if access.steps() else None))

    title = "the kernel-access widget"
    if not have_widgets():
        fallback = TextView(replay_text(title, 0, last, page))
        fallback.access = access
        return fallback
    import ipywidgets as widgets

    slider = widgets.IntSlider(value=0, min=0, max=last, description="step")
    play = widgets.Play(value=0, min=0, max=last, interval=700)
    widgets.jslink((play, "value"), (slider, "value"))
    board = widgets.HTML(render_kernel_access_html(access, 0 if access.steps() else None))

    def show(change: dict) -> None:
        board.value = render_kernel_access_html(access, change["new"])

    slider.observe(show, names="value")
    box = view_box([widgets.HBox([play, slider]), board], replay_text(title, 0, last, page, lambda: slider.value))
    box.access = access  # the plain data behind the widget
    return box


def decode_step_bytes(
    context_lens: list[int], num_layers: int, num_kv_heads: int, head_size: int, dtype_bytes: int
) -> int:
    """Bytes of K and V one decode step reads from the cache, all layers, all requests."""
    return 2 * num_layers * num_kv_heads * head_size * dtype_bytes * sum(context_lens)


def decode_step_flops(context_lens: list[int], num_layers: int, num_heads: int, head_size: int) -> int:
    """Attention FLOPs of one decode step: q.k and p.v, 2 FLOPs per multiply-add, every query head."""
    return 4 * num_layers * num_heads * head_size * sum(context_lens)


def arithmetic_intensity(num_heads: int, num_kv_heads: int, dtype_bytes: int) -> float:
    """FLOPs per byte of KV read in decode attention (independent of context length)."""
    return 4 * num_heads / (2 * num_kv_heads * dtype_bytes)


__all__ = [
    "DECODE_TILE_N", "KernelAccess", "ProgramAccess", "TileAccess", "arithmetic_intensity",
    "decode_step_bytes", "decode_step_flops", "kernel_access_widget", "online_softmax_update",
    "plot_kernel_access", "record_paged_decode", "render_kernel_access_html", "replay_paged_decode",
]
