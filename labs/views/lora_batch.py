"""One step of a batch that mixes LoRA adapters: which rows (requests, then tokens) use which adapter and slot.

Mirrors vllm/lora/punica_wrapper/punica_base.py (the step's token -> slot mapping every LoRA layer reads) and
vllm/lora/model_manager.py (the `max_loras` slots holding adapters); mini: mini/lora/punica_wrapper.py and
mini/lora/model_manager.py.

- `lora_batch(requests, lora_index_to_id, names=..., compute_token_lora_indices=...)` -> `LoRABatch`: plain data
  (unit-tested). `requests` is the step's rows in batch order, `(request id, adapter id or 0, scheduled tokens)`;
  the mapping is computed by mini's function, or by the learner's when given;
- `render_lora_batch_text(batch)`: the slots, the rows with their tokens, adapter and slot, and the token strip;
- `plot_lora_batch(batch)`: a static matplotlib figure: the step's tokens as one strip coloured by slot (grey: the
  base model), request boundaries marked, and for each slot the token rows its shrink and expand touch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from mini.lora.punica_wrapper import compute_token_lora_indices as mini_compute_token_lora_indices

BASE_COLOR = "#d0d0d0"
SLOT_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")


@dataclass(frozen=True, slots=True)
class BatchRow:
    """One request of the step: its adapter, its slot and its tokens' rows in the flat batch."""

    req_id: str
    lora_id: int          # 0: the base model
    adapter: str          # the adapter's name ("base" for id 0)
    slot: int             # -1: no adapter
    first_token: int
    num_tokens: int


@dataclass(frozen=True, slots=True)
class LoRABatch:
    rows: tuple[BatchRow, ...]
    slots: tuple[tuple[int, int | None, str], ...]   # (slot, adapter id or None, name) for every slot
    token_slots: tuple[int, ...]                      # the per-token mapping, as computed

    @property
    def num_tokens(self) -> int:
        return len(self.token_slots)

    def tokens_of_slot(self, slot: int) -> tuple[int, ...]:
        """The token rows whose shrink / expand use `slot` (-1: the rows left to the base model alone)."""
        return tuple(t for t, s in enumerate(self.token_slots) if s == slot)


def lora_batch(requests: Sequence[tuple[str, int, int]], lora_index_to_id: Sequence[int | None],
               names: Mapping[int, str] | None = None,
               compute_token_lora_indices: Callable | None = None) -> LoRABatch:
    """The step described row by row (requests in batch order) and slot by slot."""
    compute = compute_token_lora_indices or mini_compute_token_lora_indices
    names = dict(names or {})
    req_ids = torch.tensor([lora_id for _, lora_id, _ in requests], dtype=torch.int64)
    counts = torch.tensor([n for _, _, n in requests], dtype=torch.int64)
    token_slots = tuple(int(s) for s in compute(req_ids, counts, list(lora_index_to_id)).tolist())
    rows, start = [], 0
    for req_id, lora_id, n in requests:
        slot = lora_index_to_id.index(lora_id) if lora_id and lora_id in lora_index_to_id else -1
        rows.append(BatchRow(req_id, lora_id, "base" if lora_id == 0 else names.get(lora_id, f"id {lora_id}"), slot,
                             start, n))
        start += n
    slots = tuple((slot, lora_id, "(empty)" if lora_id is None else names.get(lora_id, f"id {lora_id}"))
                  for slot, lora_id in enumerate(lora_index_to_id))
    return LoRABatch(tuple(rows), slots, token_slots)


def render_lora_batch_text(batch: LoRABatch) -> str:
    """The slots, then one line per request, then the per-token strip (`.` for no adapter)."""
    lines = ["slots: " + ", ".join(f"{slot}: {name}" for slot, _, name in batch.slots),
             f"{'request':<10} {'adapter':<10} {'slot':>4} {'token rows':>12}"]
    for row in batch.rows:
        span = f"{row.first_token}..{row.first_token + row.num_tokens - 1}" if row.num_tokens else "-"
        lines.append(f"{row.req_id:<10} {row.adapter:<10} {row.slot:>4} {span:>12}")
    lines.append("token slots: " + " ".join("." if s < 0 else str(s) for s in batch.token_slots))
    for slot, _, name in batch.slots:
        rows = batch.tokens_of_slot(slot)
        if rows:
            lines.append(f"slot {slot} ({name}): shrink and expand read token rows {list(rows)}")
    base = batch.tokens_of_slot(-1)
    lines.append(f"no adapter: token rows {list(base)} (base projection only)" if base else "no base-model token")
    return "\n".join(lines)


def plot_lora_batch(batch: LoRABatch):
    """The token strip coloured by slot, request boundaries marked; below, one line per slot with its rows."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    def color(slot: int) -> str:
        return BASE_COLOR if slot < 0 else SLOT_COLORS[slot % len(SLOT_COLORS)]

    num_slots = len(batch.slots)
    size = (max(6.0, 0.45 * batch.num_tokens + 2), 2.2 + 0.4 * num_slots)
    figure, (strip, per_slot) = plt.subplots(2, 1, figsize=size,
                                             gridspec_kw={"height_ratios": [1, max(1, num_slots + 1) * 0.5]})
    for t, slot in enumerate(batch.token_slots):
        strip.add_patch(Rectangle((t, 0), 1, 1, facecolor=color(slot), edgecolor="white"))
        strip.text(t + 0.5, 0.5, "-" if slot < 0 else str(slot), ha="center", va="center", fontsize=8)
    for row in batch.rows:
        strip.axvline(row.first_token, color="black", linewidth=1.5)
        strip.text(row.first_token + row.num_tokens / 2, 1.15, f"{row.req_id}\n{row.adapter}", ha="center",
                   va="bottom", fontsize=8)
    strip.set_xlim(0, max(1, batch.num_tokens))
    strip.set_ylim(0, 2)
    strip.set_yticks([])
    strip.set_xlabel("token row of the step (the number is its slot, - for none)")
    for y, slot in enumerate([-1, *(slot for slot, _, _ in batch.slots)]):
        for t in batch.tokens_of_slot(slot):
            per_slot.add_patch(Rectangle((t, y), 1, 0.8, facecolor=color(slot), edgecolor="white"))
    per_slot.set_xlim(0, max(1, batch.num_tokens))
    per_slot.set_ylim(-0.2, num_slots + 1)
    per_slot.set_yticks([y + 0.4 for y in range(num_slots + 1)],
                        ["no adapter", *[f"slot {slot}: {name}" for slot, _, name in batch.slots]])
    per_slot.set_xlabel("token rows each slot's shrink and expand touch")
    figure.tight_layout()
    return figure


__all__ = ["BatchRow", "LoRABatch", "lora_batch", "plot_lora_batch", "render_lora_batch_text"]
