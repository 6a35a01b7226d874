"""One group of a 4-bit weight: its floats, its codes, its scale and zero point, its packed words, its error.

Mirrors vllm/model_executor/layers/quantization/utils/quant_utils.py (quantizing, `pack_rows`) and the layout
vllm/model_executor/layers/quantization/auto_gptq.py loads; mini: mini/model/quantization/quant_utils.py.

- `quant_group(weight, group_size, row, group, quantize=...)` -> `QuantGroup`: plain data (unit-tested). The
  quantizer is looked up at call time (mini's by default; pass the learner's to draw theirs);
- `render_quant_group_text(group)`: the group as text: scale, zero point, every weight with its code, its
  dequantized value and its error, then the packed int32 words in hex with their eight nibbles;
- `plot_quant_group(group)`: a static matplotlib figure: the weights against the 16-level grid the scale and
  zero point define (0.0 on the zero point's level), and the error of each weight under it, within half a step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from mini.model.quantization import quant_utils


@dataclass(frozen=True, slots=True)
class QuantGroup:
    """One group of one output row, quantized."""

    row: int
    group: int
    columns: tuple[int, int]      # [start, end) of the inputs this group covers
    weights: tuple[float, ...]
    codes: tuple[int, ...]        # 0..15
    scale: float
    zero: int
    dequantized: tuple[float, ...]
    errors: tuple[float, ...]     # dequantized - weight
    packed_words: tuple[int, ...]  # the int32 words (as unsigned) holding the codes, eight per word

    @property
    def levels(self) -> tuple[float, ...]:
        """The 16 values a code can stand for: (code - zero) * scale."""
        return tuple((code - self.zero) * self.scale for code in range(16))

    @property
    def max_abs_error(self) -> float:
        return max(abs(e) for e in self.errors)


def quant_group(weight: torch.Tensor, group_size: int, row: int = 0, group: int = 0,
                quantize: Callable | None = None, pack: Callable | None = None) -> QuantGroup:
    """Quantize `weight` ([out, in]) in groups of `group_size` inputs and describe group `group` of row `row`."""
    quantize = quantize or quant_utils.quantize_int4_groups
    pack = pack or quant_utils.pack_int4_rows
    q, scales, zeros = quantize(weight.float(), group_size)
    start, end = group * group_size, (group + 1) * group_size
    codes = q[row, start:end].to(torch.int32)
    scale, zero = float(scales[row, group]), int(zeros[row, group])
    dequantized = (codes.float() - zero) * scale
    weights = weight[row, start:end].float()
    padded = torch.nn.functional.pad(codes, (0, (-codes.numel()) % 8))
    words = pack(padded[:, None].contiguous())[:, 0]
    return QuantGroup(row, group, (start, end), tuple(weights.tolist()), tuple(int(c) for c in codes),
                      scale, zero, tuple(dequantized.tolist()), tuple((dequantized - weights).tolist()),
                      tuple(int(w) & 0xFFFFFFFF for w in words))


def render_quant_group_text(group: QuantGroup, max_rows: int = 16) -> str:
    """The group as a table, then its packed words with their nibbles (lowest first)."""
    lines = [f"row {group.row}, group {group.group} (inputs {group.columns[0]}..{group.columns[1] - 1}): "
             f"scale {group.scale:.6g}, zero point {group.zero} (0.0 is code {group.zero}); "
             f"max |error| {group.max_abs_error:.3g} (half a step: {group.scale / 2:.3g})",
             f"{'input':>6} {'weight':>10} {'code':>5} {'dequantized':>12} {'error':>10}"]
    for i, (w, c, d, e) in enumerate(zip(group.weights, group.codes, group.dequantized, group.errors,
                                          strict=True)):
        if i == max_rows:
            lines.append(f"   ... {len(group.codes) - max_rows} more")
            break
        lines.append(f"{group.columns[0] + i:>6} {w:>10.5f} {c:>5} {d:>12.5f} {e:>+10.2e}")
    for index, word in enumerate(group.packed_words):
        nibbles = " ".join(f"{(word >> (4 * j)) & 0xF:>2}" for j in range(8))
        lines.append(f"word {index}: 0x{word:08x}  nibbles 0..7 (bits 0-3 first): {nibbles}")
    return "\n".join(lines)


def plot_quant_group(group: QuantGroup):
    """Weights on the group's 16-level grid (top) and each weight's error (bottom)."""
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True,
                                         gridspec_kw={"height_ratios": [3, 2]})
    xs = list(range(group.columns[0], group.columns[1]))
    for code, level in enumerate(group.levels):
        top.axhline(level, color="#d33" if code == group.zero else "#ccc", linewidth=1.2 if code == group.zero
                    else 0.6, zorder=0)
    top.scatter(xs, group.weights, s=18, color="#1f77b4", label="float weight", zorder=2)
    top.scatter(xs, group.dequantized, s=30, marker="_", color="#ff7f0e", label="dequantized (code - zero) x scale",
                zorder=3)
    top.set_ylabel("value")
    top.set_title(f"row {group.row}, group {group.group}: scale {group.scale:.4g}, zero point {group.zero} "
                  f"(red line: 0.0); grey lines: the 16 levels")
    top.legend(loc="upper right", fontsize=8)
    bottom.bar(xs, group.errors, color="#2ca02c")
    for bound in (group.scale / 2, -group.scale / 2):
        bottom.axhline(bound, color="#888", linestyle="--", linewidth=0.8)
    bottom.set_ylabel("error")
    bottom.set_xlabel("input (column of the weight)")
    figure.tight_layout()
    return figure


__all__ = ["QuantGroup", "plot_quant_group", "quant_group", "render_quant_group_text"]
