"""Checks for phase 15 (quantized weights), against mini.model.quantization.quant_utils.

    check_quantize_int8_per_channel(quantize_int8_per_channel)  vs quant_utils.quantize_int8_per_channel
    check_quantize_int4_groups(quantize_int4_groups)            vs quant_utils.quantize_int4_groups
    check_pack_int4_rows(pack_int4_rows)                        vs quant_utils.pack_int4_rows
    check_unpack_int4_rows(unpack_int4_rows)                    vs quant_utils.unpack_int4_rows
    check_dequantize_int4_groups(dequantize_int4_groups)        vs quant_utils.dequantize_int4_groups

Each runs a fixed case chosen to expose one classic mistake (a row whose largest magnitude is negative, a
group whose top weight rounds to 16, eight distinct nibbles in one word), then seeded random ones, small first.
On a mismatch the message names the row, group, column or packed word and nibble where the answer parts from
the reference, with a hint naming the likely mistake when the answer equals a known wrong variant.

vLLM v0.33.0's `pack_rows` and `unpack_cols` (vllm/model_executor/layers/quantization/utils/quant_utils.py), adapted
only in their call shape, pass `check_pack_int4_rows` and `check_unpack_int4_rows`
(tests/course/vllm_answers/test_p15.py).

`write_gptq_checkpoint` writes a float checkpoint as a GPTQ one (AutoGPTQ's v1 layout) with the quantizer and the
packer it is given: what the notebook's "Plug it in" loads.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from labs.checks.common import calling, expect_same, passed
from labs.checks.grading import graded
from labs.manifest import Exercise, Phase
from mini.model.quantization import quant_utils

ROW_COLUMN = ("row", "column")


def _fail(what: str, inputs: dict[str, Any], message: str, hint: str) -> None:
    __tracebackhide__ = True
    lines = [f"{what}: wrong result on this case", "  inputs:"]
    lines += [f"    {name} = {value}" for name, value in inputs.items()]
    lines += [f"  {message}", f"  hint: {hint}"]
    raise AssertionError("\n".join(lines))


def _shape_of(weight: torch.Tensor) -> str:
    return f"float32 tensor of shape {list(weight.shape)}"


def _weight_inputs(weight: torch.Tensor, **extra: Any) -> dict[str, Any]:
    shown = weight.tolist() if weight.numel() <= 32 else _shape_of(weight) + " (seeded torch.randn)"
    return {"weight": shown, **extra}


def _expect_tuple(what: str, inputs: dict[str, Any], got: Any, names: tuple[str, ...]) -> tuple:
    __tracebackhide__ = True
    if not isinstance(got, tuple | list) or len(got) != len(names):
        _fail(what, inputs, f"expected a tuple ({', '.join(names)}), got {type(got).__name__}"
              + (f" of length {len(got)}" if isinstance(got, tuple | list) else ""),
              f"return the {len(names)} tensors ({', '.join(names)}), in that order")
    for name, value in zip(names, got, strict=True):
        if not isinstance(value, torch.Tensor):
            _fail(what, inputs, f"{name} is a {type(value).__name__}, not a torch.Tensor",
                  f"return {name} as a tensor")
    return tuple(got)


def _expect_layout(what: str, inputs: dict[str, Any], name: str, got: torch.Tensor, shape: tuple[int, ...],
                   dtypes: tuple[torch.dtype, ...], hint: str) -> None:
    __tracebackhide__ = True
    if tuple(got.shape) != shape:
        _fail(what, inputs, f"{name} has shape {list(got.shape)}, expected {list(shape)}", hint)
    if got.dtype not in dtypes:
        _fail(what, inputs, f"{name} has dtype {got.dtype}, expected {' or '.join(str(d) for d in dtypes)}",
              f"{name} is stored as {dtypes[0]}: the kernels and the checkpoint read exactly that type")


def _tie_accepted(exact: torch.Tensor, got: torch.Tensor, low: int, high: int,
                  tolerance: float = 1e-4) -> torch.Tensor:
    """Where rounding is a tie up to float error, either neighbour is accepted, if it is a valid code."""
    tie = ((exact - exact.floor()) - 0.5).abs() < tolerance
    got = got.to(torch.float64)
    return tie & ((got - exact).abs() <= 0.5 + tolerance) & (got >= low) & (got <= high)


# ---------------------------------------------------------------- quantize_int8_per_channel
def _int8_cases(seeds: Iterable[int]) -> list[torch.Tensor]:
    cases = [
        torch.tensor([[0.5, -1.0, 0.25, 0.0], [2.54, 1.27, -0.635, 0.01]]),   # row 0: largest magnitude is negative
        torch.tensor([[0.0, 0.0, 0.0, 0.0], [3.0, -3.0, 1.5, 0.7]]),          # an all-zero row
    ]
    for seed in seeds:
        g = torch.Generator().manual_seed(seed)
        rows, cols = random.Random(seed).choice([(3, 8), (8, 16), (16, 64)])
        cases.append(torch.randn(rows, cols, generator=g) * (0.02 + seed % 3))
    return cases


def _int8_hint(weight: torch.Tensor, scales: torch.Tensor, got_scales: torch.Tensor, row: int) -> str:
    w = weight[row].float()
    variants = [
        (w.max() / 127.0, "this row's scale comes from its largest value, not its largest MAGNITUDE: a row whose "
                          "extreme is negative then overflows -127"),
        (w.abs().max() / 128.0, "divide the largest magnitude by 127, the largest int8 code used on both sides "
                                "(symmetric: -127..127), not 128"),
        (w.abs().max() / 255.0, "a symmetric int8 code spans -127..127: the largest magnitude maps to 127, not 255"),
        ((w.max() - w.min()) / 255.0, "this scheme is symmetric (no zero point): the scale comes from the largest "
                                      "magnitude alone, not from the range max - min"),
    ]
    got = float(got_scales[row])
    for value, hint in variants:
        if abs(float(value) - got) <= 1e-6 * max(1.0, abs(got)) and abs(float(value) - float(scales[row])) > 1e-9:
            return hint
    return "one scale per output row, from that row alone, such that its largest magnitude lands on the code 127"


@graded
def check_quantize_int8_per_channel(candidate: Callable, seeds: Iterable[int] = range(5)) -> None:
    reference = quant_utils.quantize_int8_per_channel
    what = "quantize_int8_per_channel(weight)"
    num_cases = 0
    for weight in _int8_cases(seeds):
        expected_q, expected_scales = reference(weight)
        inputs = _weight_inputs(weight)
        with calling("quantize_int8_per_channel", inputs, expected=(expected_q, expected_scales),
                     hint="one scale per OUTPUT row (shape [out]); each row is divided by its own scale, so the "
                          "scales broadcast as a column"):
            got = candidate(weight.clone())
        q, scales = _expect_tuple(what, inputs, got, ("q", "scales"))
        rows, cols = weight.shape
        _expect_layout(what, inputs, "scales", scales, (rows,), (torch.float32, torch.float64),
                       "one scale per OUTPUT row (dim 0 of the [out, in] weight)")
        _expect_layout(what, inputs, "q", q, (rows, cols), (torch.int8,), "q has the weight's shape")
        wrong_rows = ~torch.isclose(scales.float(), expected_scales, rtol=1e-5, atol=1e-12)
        if bool(wrong_rows.any()):
            row = int(wrong_rows.nonzero()[0])
            _fail(what, inputs, f"row {row}: expected scale {float(expected_scales[row]):.6g}, got "
                  f"{float(scales[row]):.6g} (row {row} is {_row_text(weight[row])})",
                  _int8_hint(weight, expected_scales, scales, row))
        exact = weight.float() / expected_scales[:, None]
        differs = (q.to(torch.int32) != expected_q.to(torch.int32)) & ~_tie_accepted(exact, q, -127, 127)
        if bool(differs.any()):
            row, col = (int(i) for i in differs.nonzero()[0])
            hint = _rounding_hint(exact[row, col], int(expected_q[row, col]), int(q[row, col]), low=-127, high=127)
            _fail(what, inputs, f"row {row}, column {col}: weight {float(weight[row, col]):.6g} / scale "
                  f"{float(expected_scales[row]):.6g} = {float(exact[row, col]):.4f}: expected code "
                  f"{int(expected_q[row, col])}, got {int(q[row, col])}", hint)
        num_cases += 1
    passed("check_quantize_int8_per_channel", num_cases)


def _row_text(row: torch.Tensor) -> str:
    values = [round(float(v), 4) for v in row[:8]]
    return str(values)[:-1] + (", ...]" if row.numel() > 8 else "]")


def _rounding_hint(exact: torch.Tensor, expected: int, got: int, low: int, high: int) -> str:
    value = float(exact)
    truncated, floored = int(torch.tensor(value).trunc()), int(torch.tensor(value).floor())
    if got == truncated == floored and got != expected:
        return ("round to NEAREST, not toward zero or down: truncating (what converting to an integer type does) "
                "or flooring leaves up to a whole step of error instead of half a step")
    if got == truncated and got != expected:
        return ("round to NEAREST: converting to an integer type truncates toward zero, which biases every "
                "code toward 0 (up to a whole step of error instead of half a step)")
    if got == floored and got != expected:
        return "round to NEAREST, not down (floor): the error must stay within half a step"
    if got < low or got > high:
        return (f"the codes must stay in {low}..{high}: clamp after rounding (a value can round one step past "
                f"the end of the range)")
    return "each code is the nearest integer to weight / scale (plus the zero point, where there is one)"


# ---------------------------------------------------------------- quantize_int4_groups
def _int4_cases(seeds: Iterable[int]) -> list[tuple[torch.Tensor, int]]:
    cases = [
        # group 0: scale 1 exactly, zero point 1.5 rounds (half to even) to 2, so 13.5 rounds to 16 -> clamp
        (torch.tensor([[-1.5, 13.5, 0.0, 1.0, 0.3, 0.6, 0.9, 1.5]]), 4),
        # an all-positive group (the range still includes 0: zero point 0) and an all-negative one (zero 15)
        (torch.tensor([[0.2, 0.4, 0.6, 0.8, -0.1, -0.3, -0.5, -0.75]]), 4),
        # 2 rows x 8 inputs, groups of 4, rows that differ: groups run along the inputs of one row
        (torch.tensor([[-1.0, -0.5, 0.25, 2.0, 0.1, 0.2, -0.3, 0.4],
                       [3.0, -0.2, 0.7, 0.1, -2.0, 1.0, 0.5, -0.6]]), 4),
    ]
    for seed in seeds:
        g = torch.Generator().manual_seed(seed)
        rows, cols, group = random.Random(seed).choice([(4, 16, 8), (8, 64, 32), (16, 128, 32), (8, 64, 64)])
        cases.append((torch.randn(rows, cols, generator=g) * 0.05, group))
    return cases


def _int4_scale_hint(weight: torch.Tensor, group_size: int, got_scales: torch.Tensor, row: int, group: int) -> str:
    w = weight[row, group * group_size:(group + 1) * group_size].float()
    lo, hi = min(float(w.min()), 0.0), max(float(w.max()), 0.0)
    got = float(got_scales[row, group])
    variants = [
        ((float(w.max()) - float(w.min())) / 15.0, "the range of a group must include 0.0 (a zero weight must be "
                                                   "exactly representable): extend it to 0 before the scale"),
        ((hi - lo) / 16.0, "16 codes make 15 steps: the scale is the range over 15, not 16"),
        (float(w.abs().max()) / 7.0, "this scheme is asymmetric: the scale comes from the group's range (with "
                                     "0 in it), and a zero point places 0.0, not from the largest magnitude"),
    ]
    for value, hint in variants:
        if abs(value - got) <= 1e-6 * max(1.0, abs(got)):
            return hint
    return "one scale per run of group_size inputs of one row: the group's range (0.0 included) over 15 steps"


@graded
def check_quantize_int4_groups(candidate: Callable, seeds: Iterable[int] = range(5)) -> None:
    reference = quant_utils.quantize_int4_groups
    what = "quantize_int4_groups(weight, group_size)"
    num_cases = 0
    for weight, group_size in _int4_cases(seeds):
        expected_q, expected_scales, expected_zeros = reference(weight, group_size)
        inputs = _weight_inputs(weight, group_size=group_size)
        with calling("quantize_int4_groups", inputs, expected=(expected_q, expected_scales, expected_zeros),
                     hint="split each row into runs of group_size consecutive inputs (a [out, in / group_size, "
                          "group_size] view): groups run along dim 1"):
            got = candidate(weight.clone(), group_size)
        q, scales, zeros = _expect_tuple(what, inputs, got, ("q", "scales", "zeros"))
        rows, cols = weight.shape
        groups = (rows, cols // group_size)
        axis_hint = ("one scale and zero per row per run of group_size INPUTS: [out, in / group_size] (groups "
                     "run along dim 1, the inputs one output row sums over)")
        _expect_layout(what, inputs, "scales", scales, groups, (torch.float32, torch.float64), axis_hint)
        _expect_layout(what, inputs, "zeros", zeros, groups, (torch.int32,), axis_hint)
        _expect_layout(what, inputs, "q", q, (rows, cols), (torch.int32,), "q has the weight's shape")
        wrong = ~torch.isclose(scales.float(), expected_scales, rtol=1e-5, atol=1e-12)
        if bool(wrong.any()):
            row, group = (int(i) for i in wrong.nonzero()[0])
            first, last = group * group_size, (group + 1) * group_size - 1
            _fail(what, inputs, f"row {row}, group {group} (inputs {first}..{last})"
                  f": expected scale {float(expected_scales[row, group]):.6g}, got {float(scales[row, group]):.6g}",
                  _int4_scale_hint(weight, group_size, scales, row, group))
        if not torch.equal(zeros.to(torch.int32), expected_zeros):
            row, group = (int(i) for i in (zeros.to(torch.int32) != expected_zeros).nonzero()[0])
            e, g_ = int(expected_zeros[row, group]), int(zeros[row, group])
            low = min(float(weight[row, group * group_size:(group + 1) * group_size].min()), 0.0)
            hint = ("the zero point is off by one: it is the CODE that 0.0 maps to, the nearest integer to "
                    "-min / scale (nothing added or subtracted)" if abs(e - g_) == 1 else
                    "the zero point is the code 0.0 maps to: the group's minimum (at most 0) sits on code 0")
            _fail(what, inputs, f"row {row}, group {group}: group minimum (0 included) {low:.6g}, scale "
                  f"{float(expected_scales[row, group]):.6g}: expected zero point {e}, got {g_}", hint)
        exact = (weight.float().reshape(rows, -1, group_size) / expected_scales[..., None]
                 + expected_zeros[..., None].float()).reshape(rows, cols)
        differs = (q.to(torch.int32) != expected_q) & ~_tie_accepted(exact, q, 0, 15)
        if bool(differs.any()):
            row, col = (int(i) for i in differs.nonzero()[0])
            group = col // group_size
            hint = _rounding_hint(exact[row, col], int(expected_q[row, col]), int(q[row, col]), low=0, high=15)
            _fail(what, inputs, f"row {row}, group {group}, column {col}: weight {float(weight[row, col]):.6g}, scale "
                  f"{float(expected_scales[row, group]):.6g}, zero point {int(expected_zeros[row, group])} -> "
                  f"{float(exact[row, col]):.4f}: expected code {int(expected_q[row, col])}, got {int(q[row, col])}",
                  hint)
        num_cases += 1
    passed("check_quantize_int4_groups", num_cases)


# ---------------------------------------------------------------- pack_int4_rows / unpack_int4_rows
def _pack_cases(seeds: Iterable[int]) -> list[torch.Tensor]:
    cases = [
        torch.arange(1, 9, dtype=torch.int32)[:, None],                       # one word: nibbles 1..8
        torch.tensor([[15], [15], [15], [15], [15], [15], [15], [15]], dtype=torch.int32),   # the sign bit set
        torch.arange(32, dtype=torch.int32).reshape(16, 2) % 16,             # two words per column, two columns
    ]
    for seed in seeds:
        g = torch.Generator().manual_seed(seed)
        rows, cols = random.Random(seed).choice([(8, 3), (16, 5), (64, 16), (32, 48)])
        cases.append(torch.randint(0, 16, (rows, cols), generator=g, dtype=torch.int32))
    return cases


def _nibbles(word: int) -> list[int]:
    return [(word >> (4 * j)) & 0xF for j in range(8)]


def _pack_hint(values: torch.Tensor, got: torch.Tensor, row: int, col: int) -> str:
    column = values[row * 8:(row + 1) * 8, col].tolist()
    word = int(got[row, col]) & 0xFFFFFFFF
    nibbles = _nibbles(word)
    if nibbles == column[::-1]:
        return ("the eight values are in reverse order: value 8i + j of the column goes into bits 4j..4j+3 "
                "(the first value in the LOWEST nibble), as AutoGPTQ writes and vLLM's kernels read")
    if values.shape[0] >= 16:
        stride = values.shape[0] // 8
        strided = [int(values[row + j * stride, col]) for j in range(8)]
        if nibbles == strided:
            return ("one word holds eight CONSECUTIVE rows (8i .. 8i+7), not rows i, i + R/8, i + 2R/8, ...")
    if sorted(nibbles) == sorted(column):
        return "the right values in the wrong nibbles: value 8i + j goes into bits 4j..4j+3"
    return "word i of a column packs rows 8i..8i+7 of that column, four bits each, the first in the lowest bits"


@graded
def check_pack_int4_rows(candidate: Callable, seeds: Iterable[int] = range(5)) -> None:
    reference = quant_utils.pack_int4_rows
    what = "pack_int4_rows(values)"
    num_cases = 0
    for values in _pack_cases(seeds):
        expected = reference(values)
        inputs = {"values": values.tolist() if values.numel() <= 32 else
                  f"int32 tensor of shape {list(values.shape)} in 0..15 (seeded)"}
        with calling("pack_int4_rows", inputs, expected=expected,
                     hint="eight 4-bit values per int32 along the ROWS: the result is [rows / 8, columns]"):
            got = candidate(values.clone())
        if not isinstance(got, torch.Tensor):
            _fail(what, inputs, f"got a {type(got).__name__}, not a torch.Tensor", "return an int32 tensor")
        _expect_layout(what, inputs, "the packed tensor", got, tuple(expected.shape), (torch.int32,),
                       "eight 4-bit values per int32: [rows / 8, columns]")
        if not torch.equal(got, expected):
            row, col = (int(i) for i in (got != expected).nonzero()[0])
            e_word, g_word = int(expected[row, col]) & 0xFFFFFFFF, int(got[row, col]) & 0xFFFFFFFF
            e_nib, g_nib = _nibbles(e_word), _nibbles(g_word)
            nibble = next(j for j in range(8) if e_nib[j] != g_nib[j])
            _fail(what, inputs, f"packed word [{row}, {col}] (rows {8 * row}..{8 * row + 7} of column {col}: "
                  f"{values[8 * row:8 * row + 8, col].tolist()}): expected 0x{e_word:08x}, got 0x{g_word:08x}; "
                  f"first wrong nibble: {nibble} (bits {4 * nibble}..{4 * nibble + 3}), expected {e_nib[nibble]}, "
                  f"got {g_nib[nibble]}", _pack_hint(values, got, row, col))
        num_cases += 1
    passed("check_pack_int4_rows", num_cases)


def _unpack_hint(packed: torch.Tensor, got: torch.Tensor) -> str:
    if bool((got < 0).any()) or bool((got > 15).any()):
        return ("every unpacked value is 0..15: keep only the four bits of each (a right shift of a negative "
                "int32 copies its sign bit into the top)")
    rows, cols = packed.shape
    reversed_order = quant_utils.unpack_int4_rows(packed).reshape(rows, 8, cols).flip(1).reshape(rows * 8, cols)
    if torch.equal(got.to(torch.int32), reversed_order):
        return "nibble j (bits 4j..4j+3) is row 8i + j: the LOWEST nibble is the first of the eight rows"
    strided = quant_utils.unpack_int4_rows(packed).reshape(rows, 8, cols).transpose(0, 1).reshape(rows * 8, cols)
    if torch.equal(got.to(torch.int32), strided):
        return ("word i's eight values are rows 8i..8i+7 (consecutive), not rows i, i + R, i + 2R, ...: "
                "mind the order of the axes before you flatten")
    return "the inverse of pack_int4_rows: nibble j of word [i, c] is value [8i + j, c]"


@graded
def check_unpack_int4_rows(candidate: Callable, seeds: Iterable[int] = range(5)) -> None:
    reference = quant_utils.unpack_int4_rows
    what = "unpack_int4_rows(packed)"
    num_cases = 0
    for values in _pack_cases(seeds):
        packed = quant_utils.pack_int4_rows(values)
        expected = reference(packed)
        inputs = {"packed": [f"0x{int(w) & 0xFFFFFFFF:08x}" for w in packed.flatten()] if packed.numel() <= 8 else
                  f"int32 tensor of shape {list(packed.shape)} (seeded)"}
        with calling("unpack_int4_rows", inputs, expected=expected):
            got = candidate(packed.clone())
        if not isinstance(got, torch.Tensor):
            _fail(what, inputs, f"got a {type(got).__name__}, not a torch.Tensor", "return an int32 tensor")
        _expect_layout(what, inputs, "the unpacked tensor", got, tuple(expected.shape), (torch.int32,),
                       "each int32 gives back eight rows: [rows * 8, columns]")
        if not torch.equal(got, expected):
            expect_same(what, inputs, expected, got, _unpack_hint(packed, got), axis_names=ROW_COLUMN)
        num_cases += 1
    passed("check_unpack_int4_rows", num_cases)


# ---------------------------------------------------------------- dequantize_int4_groups
def _dequant_hint(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
                  got: torch.Tensor) -> str:
    s = scales.repeat_interleave(group_size, dim=1)
    z = zeros.float().repeat_interleave(group_size, dim=1)
    variants = [
        (q.float() * s, "subtract the zero point before scaling: code z stands for 0.0"),
        ((q.float() + z) * s, "the zero point is SUBTRACTED from the code (code z stands for 0.0), not added"),
        (q.float() * s - z, "subtract the zero point from the code, then scale: (code - zero) x scale"),
        ((q.float() - z) * scales.repeat(1, group_size), "group g covers inputs g x group_size .. (g + 1) x "
                                                         "group_size - 1: each scale repeats over CONSECUTIVE inputs"),
    ]
    for value, hint in variants:
        if value.shape == got.shape and torch.allclose(value, got.float(), rtol=1e-5, atol=1e-7):
            return hint
    return "each weight is (its code - its group's zero point) x its group's scale"


@graded
def check_dequantize_int4_groups(candidate: Callable, seeds: Iterable[int] = range(5)) -> None:
    reference = quant_utils.dequantize_int4_groups
    what = "dequantize_int4_groups(q, scales, zeros, group_size)"
    num_cases = 0
    for weight, group_size in _int4_cases(seeds):
        q, scales, zeros = quant_utils.quantize_int4_groups(weight, group_size)
        expected = reference(q, scales, zeros, group_size)
        inputs = ({"q": q.tolist(), "scales": scales.tolist(), "zeros": zeros.tolist(), "group_size": group_size}
                  if q.numel() <= 16 else {"q, scales, zeros": f"quantize_int4_groups of a seeded {list(q.shape)} "
                                                              f"weight", "group_size": group_size})
        with calling("dequantize_int4_groups", inputs, expected=expected):
            got = candidate(q.clone(), scales.clone(), zeros.clone(), group_size)
        if not isinstance(got, torch.Tensor):
            _fail(what, inputs, f"got a {type(got).__name__}, not a torch.Tensor", "return a float32 tensor")
        _expect_layout(what, inputs, "the weight", got, tuple(expected.shape), (torch.float32,),
                       "the float weight has q's shape [out, in], in float32")
        if not torch.allclose(got, expected, rtol=1e-5, atol=1e-7):
            expect_same(what, inputs, expected, got, _dequant_hint(q, scales, zeros, group_size, got),
                        axis_names=ROW_COLUMN, rtol=1e-5, atol=1e-7)
        num_cases += 1
    passed("check_dequantize_int4_groups", num_cases)


# ---------------------------------------------------------------- a GPTQ checkpoint, for "Plug it in"
def write_gptq_checkpoint(float_dir: str | Path, out_dir: str | Path, group_size: int = 32, *,
                          quantize_int4_groups: Callable = quant_utils.quantize_int4_groups,
                          pack_int4_rows: Callable = quant_utils.pack_int4_rows) -> Path:
    """The float checkpoint in `float_dir` as a GPTQ one (AutoGPTQ v1: `qweight`, `qzeros` holding zero - 1,
    float16 `scales`, `g_idx`) for every `*_proj` layer, with the quantizer and packer given."""
    from safetensors.torch import load_file, save_file

    float_dir, out_dir = Path(float_dir), Path(out_dir)
    tensors = load_file(str(float_dir / "model.safetensors"))
    packed: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if not name.endswith("_proj.weight"):
            packed[name] = tensor
            continue
        prefix = name.removesuffix(".weight")
        q, scales, zeros = quantize_int4_groups(tensor.float(), group_size)
        packed[f"{prefix}.qweight"] = pack_int4_rows(q.t().contiguous())
        stored_zeros = ((zeros.to(torch.int32) - 1) & 0xF).contiguous()          # [N, K/g], v1 stores zero - 1
        packed[f"{prefix}.qzeros"] = pack_int4_rows(stored_zeros).t().contiguous()   # [K/g, N/8]
        packed[f"{prefix}.scales"] = scales.t().contiguous().to(torch.float16)
        packed[f"{prefix}.g_idx"] = torch.arange(tensor.shape[1], dtype=torch.int32) // group_size
    config = json.loads((float_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": group_size,
                                     "desc_act": False, "sym": False, "lm_head": False}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config))
    save_file(packed, str(out_dir / "model.safetensors"))
    for extra in float_dir.iterdir():   # the tokenizer files
        if extra.is_file() and extra.suffix != ".safetensors" and extra.name != "config.json":
            (out_dir / extra.name).write_bytes(extra.read_bytes())
    return out_dir


PHASE = Phase("15_quantization", (
    Exercise("quantize_int8_per_channel", check_quantize_int8_per_channel, points=2,
             grade_id="test-quantize-int8-per-channel", part="quantize_int8_per_channel"),
    Exercise("quantize_int4_groups", check_quantize_int4_groups, points=3, grade_id="test-quantize-int4-groups",
             design="the 4-bit grid of a group: where its scale and integer zero point come from so that 0.0 is "
                    "exactly representable and every weight lands on a code in 0..15, from a traced group"),
    Exercise("pack_int4_rows", check_pack_int4_rows, points=2, grade_id="test-pack-int4-rows"),
    Exercise("unpack_int4_rows", check_unpack_int4_rows, points=2, grade_id="test-unpack-int4-rows",
             part="unpack_int4_rows"),
    Exercise("dequantize_int4_groups", check_dequantize_int4_groups, points=1,
             grade_id="test-dequantize-int4-groups"),
))
