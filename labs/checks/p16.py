"""Checks for phase 16 (many LoRA adapters in one batch), against mini.lora.

    check_token_lora_indices(compute_token_lora_indices)  vs mini.lora.punica_wrapper.compute_token_lora_indices
    check_lora_shrink(lora_shrink)                        vs mini.lora.ops.torch_ops.lora_shrink
    check_lora_expand(lora_expand)                        vs mini.lora.ops.torch_ops.lora_expand
    check_lora_admission(admit_waiting_loras)             vs the rule of mini.core.sched.scheduler.Scheduler.schedule
                                                             (its waiting-queue walk, as `admission_reference`)

Each runs fixed cases first, each built to expose one classic mistake (a base request between two adapter
requests with an adapter in slot 0, adapter ids that are not slot numbers, a prefill next to decodes, a base
token whose buffer row is not zero, a slice that is not the first one, an output that already holds the base
layer's result), then seeded random ones, small first. On a mismatch the message names the token row (and the
request it belongs to), its slot, the column or output slice, expected vs got, and the likely mistake when the
answer equals a known wrong variant there.

vLLM v0.33.0's torch punica ops (vllm/lora/ops/torch_ops/lora_ops.py: `bgmv_shrink`, `bgmv_expand_slice`, and
`sgmv_shrink` / `sgmv_expand_slice`, which take per-request indices and token counts) pass `check_lora_shrink` and
`check_lora_expand`, adapted only in their call shape (tests/course/vllm_answers/test_p16.py).

`write_lora_adapter` writes a PEFT LoRA adapter folder (what `peft_model.save_pretrained` writes) with seeded
random weights for a base model: what the notebook's "Plug it in" serves.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from labs.checks.common import calling, passed
from labs.checks.grading import graded
from labs.manifest import Exercise, Phase
from mini.lora.ops import torch_ops
from mini.lora.punica_wrapper import compute_token_lora_indices

ATOL, RTOL = 1e-5, 1e-5


def _fail(what: str, inputs: dict[str, Any], message: str, hint: str) -> None:
    __tracebackhide__ = True
    lines = [f"{what}: wrong result on this case", "  inputs:"]
    lines += [f"    {name} = {value}" for name, value in inputs.items()]
    lines += [f"  {message}", f"  hint: {hint}"]
    raise AssertionError("\n".join(lines))


def _shown(tensor: torch.Tensor, what: str) -> Any:
    if tensor.numel() <= 24:
        return [round(v, 4) for v in tensor.tolist()] if tensor.dim() == 1 else \
            [[round(v, 4) for v in row] for row in tensor.tolist()] if tensor.dim() == 2 else tensor.tolist()
    return f"{what} of shape {list(tensor.shape)} (seeded torch.randn)"


def _row(values: torch.Tensor) -> str:
    shown = [round(float(v), 4) for v in values[:8]]
    return str(shown)[:-1] + (", ...]" if values.numel() > 8 else "]")


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a.double(), b.double(), rtol=RTOL, atol=ATOL))


def _expect_tensor(what: str, inputs: dict[str, Any], got: Any, shape: tuple[int, ...], name: str,
                   dtypes: tuple[torch.dtype, ...], hint: str) -> torch.Tensor:
    __tracebackhide__ = True
    if not isinstance(got, torch.Tensor):
        _fail(what, inputs, f"{name} is a {type(got).__name__}, not a torch.Tensor", hint)
    if tuple(got.shape) != shape:
        _fail(what, inputs, f"{name} has shape {list(got.shape)}, expected {list(shape)}", hint)
    if got.dtype not in dtypes:
        _fail(what, inputs, f"{name} has dtype {got.dtype}, expected {' or '.join(str(d) for d in dtypes)}", hint)
    return got


def _unchanged(what: str, inputs: dict[str, Any], **pairs: tuple[torch.Tensor, torch.Tensor]) -> None:
    __tracebackhide__ = True
    for name, (before, after) in pairs.items():
        if not torch.equal(before, after):
            _fail(what, inputs, f"your function changed its input `{name}` in place",
                  f"`{name}` is shared by every layer of the step (or is an adapter's weights): read it, never "
                  f"write it")


# ---------------------------------------------------------------- the token -> adapter-slot mapping
def _mapping_cases(seeds: Iterable[int]) -> list[tuple[list[int], list[int], list[int | None]]]:
    cases: list[tuple[list[int], list[int], list[int | None]]] = [
        # a prefill of 4, a base request between adapter requests, adapter id 5 in slot 0, ids are not slots
        ([3, 0, 5, 3], [4, 1, 2, 1], [5, None, 3]),
        # decode only (one token each); ids 1 and 2 sit in slots 1 and 0
        ([1, 2, 0, 1], [1, 1, 1, 1], [2, 1]),
        # only base requests: no token has an adapter
        ([0, 0], [2, 3], [None, None]),
        # an id larger than max_loras, a slot held by an adapter no request of this step uses, base in the middle
        ([12, 0, 12], [1, 5, 2], [None, 7, 12, None]),
    ]
    for seed in seeds:
        rng = random.Random(seed)
        max_loras = rng.randint(1, 4)
        ids = rng.sample(range(1, 40), max_loras)
        table: list[int | None] = [i if rng.random() < 0.8 else None for i in ids]
        present = [i for i in table if i is not None]
        num_reqs = rng.randint(1, 3 + seed % 6)
        req_ids = [rng.choice(present) if present and rng.random() < 0.7 else 0 for _ in range(num_reqs)]
        tokens = [rng.choice([1, 1, 1, 2, 3, 7]) for _ in range(num_reqs)]
        cases.append((req_ids, tokens, table))
    return cases


def _request_of_token(tokens: list[int], t: int) -> tuple[int, int]:
    start = 0
    for r, n in enumerate(tokens):
        if t < start + n:
            return r, t - start
        start += n
    return len(tokens) - 1, t - start


def _mapping_hint(req_ids: list[int], tokens: list[int], table: list[int | None], expected: torch.Tensor,
                  got: torch.Tensor, t: int) -> str:
    r, k = _request_of_token(tokens, t)
    lora_id, want, have = req_ids[r], int(expected[t]), int(got[t])
    starts = [sum(tokens[:i]) for i in range(len(tokens))]
    boundary = (f"off by one at a request boundary: token row {t} is request {r}'s token {k} of {tokens[r]}, but "
                f"the slots come out shifted by one row. Request {r}'s tokens are the {tokens[r]} consecutive rows "
                f"starting at row {starts[r]} (the tokens of the requests before it come first)")
    n = expected.shape[0]
    if n > 1 and (torch.equal(got[1:], expected[:-1]) or torch.equal(got[:-1], expected[1:])):
        return boundary
    if lora_id == 0 and have >= 0:
        return ("a request with adapter id 0 runs the BASE model: its tokens get -1 (no adapter), not a slot. A slot "
                "number there would add that slot's adapter to a base request's output")
    if have == lora_id and want != lora_id:
        return ("that is the adapter's ID, not its SLOT: the slot is where the id sits in `lora_index_to_id` (the "
                "layers' stacked weights are indexed by slot, and ids can be any positive number)")
    if have == lora_id - 1 and want != have:
        return ("adapter id - 1 is not its slot: slots are handed out as adapters arrive, so look the id up in "
                "`lora_index_to_id`")
    neighbours = {}
    if r > 0:
        neighbours[r - 1] = -1 if req_ids[r - 1] == 0 else table.index(req_ids[r - 1])
    if r + 1 < len(req_ids):
        neighbours[r + 1] = -1 if req_ids[r + 1] == 0 else table.index(req_ids[r + 1])
    for other, slot in neighbours.items():
        if have == slot and (k == 0 or k == tokens[r] - 1):
            return (f"off by one at a request boundary: token row {t} is request {r}'s "
                    f"{'first' if k == 0 else 'last'} token but got request {other}'s slot. Request {r}'s tokens are "
                    f"the {tokens[r]} consecutive rows starting at row {starts[r]} (the tokens of the requests "
                    f"before it come first)")
    return (f"every one of request {r}'s {tokens[r]} tokens gets the slot of request {r}'s adapter; the requests' "
            f"tokens follow each other in batch order")


@graded
def check_token_lora_indices(candidate: Callable, seeds: Iterable[int] = range(8)) -> None:
    reference = compute_token_lora_indices
    what = "compute_token_lora_indices(req_lora_ids, num_scheduled_tokens, lora_index_to_id)"
    num_cases = 0
    for req_ids, tokens, table in _mapping_cases(seeds):
        req_lora_ids = torch.tensor(req_ids, dtype=torch.int64)
        num_scheduled_tokens = torch.tensor(tokens, dtype=torch.int64)
        expected = reference(req_lora_ids, num_scheduled_tokens, list(table))
        inputs = {"req_lora_ids": req_ids, "num_scheduled_tokens": tokens, "lora_index_to_id": table}
        args = (req_lora_ids.clone(), num_scheduled_tokens.clone(), list(table))
        with calling("compute_token_lora_indices", inputs, expected=expected.tolist(),
                     hint="lora_index_to_id is a list (slot -> adapter id, None for an empty slot); the two others "
                          "are int64 tensors with one entry per request"):
            got = candidate(*args)
        total = sum(tokens)
        if isinstance(got, torch.Tensor) and got.dim() == 1 and got.shape[0] == len(req_ids) != total:
            _fail(what, inputs, f"got {got.shape[0]} entries (one per request), expected {total} (one per token)",
                  "the layers see one row per TOKEN of the step: every token needs its own entry, a request's "
                  "entry repeated once per token it has in this step")
        got = _expect_tensor(what, inputs, got, (total,), "the result", (torch.int64,),
                             "return an int64 tensor with one slot per token of the step (the sum of "
                             "num_scheduled_tokens)")
        if list(table) != args[2] or not torch.equal(args[0], req_lora_ids) or \
                not torch.equal(args[1], num_scheduled_tokens):
            _fail(what, inputs, "your function changed one of its inputs in place",
                  "the slot table and the batch's per-request arrays belong to the model runner: read them only")
        if not torch.equal(got, expected):
            t = int((got != expected).nonzero()[0])
            r, k = _request_of_token(tokens, t)
            lora_id = req_ids[r]
            runs = "the base model (id 0)" if lora_id == 0 else f"adapter id {lora_id} (in slot {table.index(lora_id)})"
            _fail(what, inputs,
                  f"token row {t} (request {r}'s token {k} of {tokens[r]}; request {r} runs {runs}): expected slot "
                  f"{int(expected[t])}, got {int(got[t])}\n  expected: {expected.tolist()}\n  got:      "
                  f"{got.tolist()}", _mapping_hint(req_ids, tokens, table, expected, got, t))
        num_cases += 1
    passed("check_token_lora_indices", num_cases)


# ---------------------------------------------------------------- shrink
def _slot_cases(seeds: Iterable[int], fixed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    cases = list(fixed)
    for seed in seeds:
        rng = random.Random(seed)
        g = torch.Generator().manual_seed(seed)
        max_loras, rank = rng.randint(1, 4), rng.choice([1, 2, 4, 8])
        num_tokens, hidden = rng.randint(1, 4 + 2 * (seed % 5)), rng.choice([8, 16, 32])
        indices = torch.tensor([rng.randint(-1, max_loras - 1) for _ in range(num_tokens)], dtype=torch.int64)
        cases.append({"x": torch.randn(num_tokens, hidden, generator=g),
                      "lora_a": torch.randn(max_loras, rank, hidden, generator=g),
                      "indices": indices, "scaling": rng.choice([1.0, 0.5, 2.0, 0.25])})
    return cases


def _shrink_cases(seeds: Iterable[int]) -> list[dict[str, Any]]:
    x = torch.tensor([[1.0, 2.0, 0.0, -1.0], [0.5, 0.0, 1.0, 1.0], [2.0, -1.0, 1.0, 0.0], [0.0, 1.0, 1.0, 1.0],
                      [1.0, 1.0, 1.0, 1.0]])
    lora_a = torch.tensor([[[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]],      # slot 0
                           [[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]],      # slot 1
                           [[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, -1.0]]])    # slot 2
    square = torch.tensor([[[1.0, 2.0, 0.0], [0.0, 1.0, 0.0], [3.0, 0.0, 1.0]]])   # in == rank: A or A^T both fit
    fixed = [
        # slot 0 in use and base rows (-1) beside it; scaling 0.5
        {"x": x, "lora_a": lora_a, "indices": torch.tensor([0, -1, 2, 2, 0]), "scaling": 0.5},
        # every token of one adapter, in slot 1, scaling 2
        {"x": x[:3], "lora_a": lora_a, "indices": torch.tensor([1, 1, 1]), "scaling": 2.0},
        # no token has an adapter
        {"x": x[:2], "lora_a": lora_a, "indices": torch.tensor([-1, -1]), "scaling": 1.0},
        # hidden size == rank: the transpose of A has the same shape as A
        {"x": torch.tensor([[1.0, 2.0, 3.0], [1.0, 0.0, -1.0]]), "lora_a": square,
         "indices": torch.tensor([0, 0]), "scaling": 1.0},
    ]
    return _slot_cases(seeds, fixed)


def _shrink_hint(case: dict[str, Any], got_row: torch.Tensor, t: int) -> str:
    x, lora_a, indices, scaling = case["x"][t], case["lora_a"], case["indices"], case["scaling"]
    slot = int(indices[t])
    if slot < 0:
        if _close(got_row, scaling * lora_a[0] @ x) or _close(got_row, scaling * lora_a[-1] @ x):
            return ("a token with slot -1 runs no adapter, but this row went through a real slot's A (index -1 reads "
                    "the LAST slot, and a clamp to 0 reads slot 0): its row of the buffer must be zero")
        return "a token with slot -1 has no adapter: its row of the buffer must be all zeros"
    own = lora_a[slot] @ x
    if not _close(got_row, scaling * own) and _close(got_row, own) and scaling != 1.0:
        return f"the scaling ({scaling}) is missing: the shrink multiplies every adapter row by it"
    if _close(got_row, scaling * scaling * own) and scaling != 1.0:
        return f"the scaling ({scaling}) is applied twice"
    if _close(got_row, own / scaling) and scaling != 1.0:
        return f"multiply by the scaling ({scaling}), do not divide by it"
    if lora_a.shape[1] == lora_a.shape[2] and _close(got_row, scaling * lora_a[slot].T @ x):
        return ("A is stored [rank, hidden] (one row per rank direction): each rank output is the dot product of "
                "the token with one ROW of A; here the product used A's columns")
    for other in range(lora_a.shape[0]):
        if other != slot and _close(got_row, scaling * lora_a[other] @ x):
            return (f"this row used slot {other}'s A, but token row {t}'s slot is {slot}: each token takes the A of "
                    f"ITS OWN slot (token_lora_indices[t]), not of its position or of another token")
    return f"row t of the buffer is scaling times (A of slot token_lora_indices[t]) applied to x[t]; here slot {slot}"


@graded
def check_lora_shrink(candidate: Callable, seeds: Iterable[int] = range(8)) -> None:
    reference = torch_ops.lora_shrink
    what = "lora_shrink(x, lora_a, token_lora_indices, scaling)"
    num_cases = 0
    for case in _shrink_cases(seeds):
        x, lora_a, indices, scaling = case["x"], case["lora_a"], case["indices"], case["scaling"]
        expected = reference(x, lora_a, indices, scaling)
        inputs = {"x": _shown(x, "x"), "lora_a": _shown(lora_a, "lora_a"), "token_lora_indices": indices.tolist(),
                  "scaling": scaling}
        args = (x.clone(), lora_a.clone(), indices.clone())
        with calling("lora_shrink", inputs, expected=expected,
                     hint="x is [T, hidden], lora_a [max_loras, rank, hidden], token_lora_indices int64 [T] "
                          "(-1: no adapter); return a [T, rank] tensor"):
            got = candidate(*args, scaling)
        got = _expect_tensor(what, inputs, got, tuple(expected.shape), "the buffer", (torch.float32, torch.float64),
                             "one row of `rank` values per token: [T, rank], in x's float dtype")
        _unchanged(what, inputs, x=(x, args[0]), lora_a=(lora_a, args[1]), token_lora_indices=(indices, args[2]))
        if not _close(got, expected):
            wrong = ~torch.isclose(got.double(), expected.double(), rtol=RTOL, atol=ATOL)
            t, col = (int(i) for i in wrong.nonzero()[0])
            slot = int(indices[t])
            _fail(what, inputs,
                  f"token row {t} (slot {slot}{', no adapter' if slot < 0 else ''}), rank column {col}: expected "
                  f"{float(expected[t, col]):.6g}, got {float(got[t, col]):.6g}\n  expected row {t}: "
                  f"{_row(expected[t])}\n  got row {t}:      {_row(got[t])}",
                  _shrink_hint(case, got[t].to(expected.dtype), t))
        num_cases += 1
    passed("check_lora_shrink", num_cases)


# ---------------------------------------------------------------- expand
def _expand_cases(seeds: Iterable[int]) -> list[dict[str, Any]]:
    buffer = torch.tensor([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5], [-1.0, 1.0]])
    lora_b = torch.tensor([[[1.0, 0.0], [0.0, 1.0]],        # slot 0: [n=2, rank=2]
                           [[2.0, 1.0], [1.0, -1.0]]])      # slot 1
    out = torch.arange(24, dtype=torch.float32).reshape(4, 6) / 4 + 1.0   # the base layer's output, not zeros
    fixed = [
        # the middle slice of three (columns 2..3); token row 1 has no adapter but a non-zero buffer row
        {"out": out, "buffer": buffer, "lora_b": lora_b, "indices": torch.tensor([1, -1, 0, 1]), "slice_offset": 2},
        # one slice covering the whole output, slot 0 only
        {"out": out[:, :2].clone(), "buffer": buffer, "lora_b": lora_b, "indices": torch.tensor([0, 0, -1, 0]),
         "slice_offset": 0},
        # the last slice
        {"out": out, "buffer": buffer, "lora_b": lora_b, "indices": torch.tensor([0, 1, 1, -1]), "slice_offset": 4},
    ]
    cases = list(fixed)
    for seed in seeds:
        rng = random.Random(seed)
        g = torch.Generator().manual_seed(seed)
        max_loras, rank, n = rng.randint(1, 4), rng.choice([1, 2, 4, 8]), rng.choice([4, 8])
        num_slices, num_tokens = rng.randint(1, 3), rng.randint(1, 4 + 2 * (seed % 5))
        cases.append({"out": torch.randn(num_tokens, n * num_slices, generator=g),
                      "buffer": torch.randn(num_tokens, rank, generator=g),
                      "lora_b": torch.randn(max_loras, n, rank, generator=g),
                      "indices": torch.tensor([rng.randint(-1, max_loras - 1) for _ in range(num_tokens)]),
                      "slice_offset": n * rng.randint(0, num_slices - 1)})
    return cases


def _expand_hint(case: dict[str, Any], got: torch.Tensor, t: int, col: int) -> str:
    out, buffer, lora_b, indices, offset = (case["out"], case["buffer"], case["lora_b"], case["indices"],
                                            case["slice_offset"])
    n = lora_b.shape[1]
    slot = int(indices[t])
    if slot < 0:
        return ("token row t has no adapter (slot -1): leave its row of `out` exactly as it is, whatever its buffer "
                "row holds (the shrink of another implementation, or padding, may leave values there)")
    if not offset <= col < offset + n:
        return (f"column {col} is outside this projection's slice (columns {offset}..{offset + n - 1}): the adapter "
                f"writes only its own slice, which starts at slice_offset = {offset} and is lora_b.shape[1] = {n} "
                f"wide; the other columns belong to other projections")
    got_slice, base = got[t, offset:offset + n].double(), out[t, offset:offset + n].double()
    delta = (lora_b[slot] @ buffer[t]).double()
    if _close(got_slice, delta):
        return "ADD into out (+=): it already holds the base layer's output, which must be kept"
    if _close(got_slice, base + 2 * delta):
        return "the adapter's part was added twice"
    if lora_b.shape[1] == lora_b.shape[2] and _close(got_slice, base + (lora_b[slot].T @ buffer[t]).double()):
        return ("B is stored [n, rank]: each output column is the dot product of the buffer row with one ROW of B; "
                "here the product used B's columns")
    for other in range(lora_b.shape[0]):
        if other != slot and _close(got_slice, base + (lora_b[other] @ buffer[t]).double()):
            return (f"this row used slot {other}'s B, but token row {t}'s slot is {slot}: each token takes its own "
                    f"slot's B")
    if offset > 0 and _close(got[t, :n].double(), out[t, :n].double() + delta):
        return f"the adapter's part went into columns 0..{n - 1}: it belongs at slice_offset = {offset}"
    return "out[t, slice] += (B of slot token_lora_indices[t]) applied to buffer[t], for every token with a slot"


@graded
def check_lora_expand(candidate: Callable, seeds: Iterable[int] = range(8)) -> None:
    reference = torch_ops.lora_expand
    what = "lora_expand(out, buffer, lora_b, token_lora_indices, slice_offset)"
    num_cases = 0
    for case in _expand_cases(seeds):
        out, buffer, lora_b, indices, offset = (case["out"], case["buffer"], case["lora_b"], case["indices"],
                                                case["slice_offset"])
        expected = reference(out.clone(), buffer, lora_b, indices, offset)
        inputs = {"out (before)": _shown(out, "out"), "buffer": _shown(buffer, "buffer"),
                  "lora_b": _shown(lora_b, "lora_b"), "token_lora_indices": indices.tolist(), "slice_offset": offset}
        mine = out.clone()
        args = (buffer.clone(), lora_b.clone(), indices.clone())
        with calling("lora_expand", inputs, expected=expected,
                     hint="out is [T, total width] (updated in place), buffer [T, rank], lora_b [max_loras, n, rank], "
                          "token_lora_indices int64 [T]; slice_offset an int"):
            returned = candidate(mine, *args, offset)
        _unchanged(what, inputs, buffer=(buffer, args[0]), lora_b=(lora_b, args[1]),
                   token_lora_indices=(indices, args[2]))
        if torch.equal(mine, out) and not torch.equal(expected, out):
            if isinstance(returned, torch.Tensor) and returned.shape == expected.shape and _close(returned, expected):
                _fail(what, inputs, "`out` was not changed: your function returned the right values in a new tensor",
                      "update `out` IN PLACE (an in-place add into it, or an indexed assignment): the layer's output "
                      "tensor is what the rest of the model reads; a new tensor is lost")
            _fail(what, inputs, "`out` was not changed at all",
                  "every token with a slot adds its adapter's part into its row of `out`, in place")
        if not _close(mine, expected):
            wrong = ~torch.isclose(mine.double(), expected.double(), rtol=RTOL, atol=ATOL)
            t, col = (int(i) for i in wrong.nonzero()[0])
            slot = int(indices[t])
            n = lora_b.shape[1]
            _fail(what, inputs,
                  f"token row {t} (slot {slot}{', no adapter' if slot < 0 else ''}), column {col} (this projection's "
                  f"slice is columns {offset}..{offset + n - 1}): expected {float(expected[t, col]):.6g}, got "
                  f"{float(mine[t, col]):.6g} (it was {float(out[t, col]):.6g} before the call)\n  expected row {t}: "
                  f"{_row(expected[t])}\n  got row {t}:      {_row(mine[t])}",
                  _expand_hint(case, mine, t, col))
        num_cases += 1
    passed("check_lora_expand", num_cases)


# ---------------------------------------------------------------- the scheduler's max_loras rule
def admission_reference(running_lora_ids: list[int], waiting_lora_ids: list[int], max_loras: int,
                        num_free_seats: int) -> list[int]:
    """The waiting-queue walk of mini's `Scheduler.schedule` (vLLM's `scheduled_loras` rule), reduced to adapters:
    the positions in `waiting_lora_ids` admitted this step, in order."""
    in_use = {lora_id for lora_id in running_lora_ids if lora_id > 0}
    admitted: list[int] = []
    for index, lora_id in enumerate(waiting_lora_ids):
        if len(admitted) == num_free_seats:
            break
        if lora_id > 0 and lora_id not in in_use and len(in_use) >= max_loras:
            continue   # skipped this step; it keeps its place in the queue
        admitted.append(index)
        if lora_id > 0:
            in_use.add(lora_id)
    return admitted


def _admission_cases(seeds: Iterable[int]) -> list[tuple[list[int], list[int], int, int]]:
    cases = [
        # adapter 1 already running; 3 would be a third adapter: skipped, and the walk goes on to the next 2
        ([1, 0], [2, 0, 1, 3, 2], 2, 5),
        # one slot, nothing running: 5 takes it, 6 waits, the base requests around it are admitted
        ([0, 0], [0, 5, 6, 0], 1, 4),
        # both slots held by running requests (one of them not even scheduled this step): 9 waits, 4 runs
        ([4, 7, 7], [9, 4, 0], 2, 3),
        # room for two requests only
        ([], [1, 2, 3], 3, 2),
    ]
    for seed in seeds:
        rng = random.Random(seed)
        pool = rng.sample(range(1, 12), 5)
        max_loras = rng.randint(1, 3)
        running = [rng.choice([0, *pool[:max_loras]]) for _ in range(rng.randint(0, 4))]
        waiting = [rng.choice([0, 0, *pool]) for _ in range(rng.randint(1, 9))]
        cases.append((running, waiting, max_loras, rng.randint(1, len(waiting) + 1)))
    return cases


def _admission_hint(running: list[int], waiting: list[int], max_loras: int, seats: int, expected: list[int],
                    got: list[int], index: int) -> str:
    lora_id = waiting[index]
    if index in expected and index not in got:
        if lora_id == 0:
            return ("a request without an adapter (id 0) uses no slot: the limit never holds it back, however many "
                    "adapters are in use")
        earlier_skip = [i for i in range(index) if i not in expected and waiting[i] > 0]
        if earlier_skip and len(got) < len(expected):
            return ("a request whose adapter does not fit is SKIPPED this step and keeps its place in the queue, but "
                    f"the walk goes on: waiting request {earlier_skip[-1]} was skipped, and the ones after it may "
                    f"still fit (base requests, or adapters already in use)")
        if lora_id in running:
            return f"adapter {lora_id} is already in use by a running request: one more request of it needs no new slot"
        return (f"counting the adapters in use must give {max_loras} slots' worth: does your count include the base "
                f"model (id 0), or stop one adapter short of max_loras = {max_loras}?")
    if len(got) > seats:
        return f"only {seats} requests can be admitted this step (num_free_seats): stop the walk there"
    if lora_id > 0 and lora_id not in running:
        running_ids = sorted({i for i in running if i > 0})
        in_use = set(running_ids) | {waiting[i] for i in expected if i < index and waiting[i] > 0}
        return ("the adapters in use are those of EVERY running request (scheduled this step or not: they hold slots "
                f"until they finish; here {running_ids or 'none'}) plus each adapter admitted earlier in this walk: "
                f"when request {index} comes, {sorted(in_use)} are in use, {len(in_use)} of max_loras = {max_loras}, "
                f"so a request of a new adapter must wait")
    return f"waiting request {index} (adapter {lora_id}) must wait: its adapter would be one more than max_loras"


@graded
def check_lora_admission(candidate: Callable, seeds: Iterable[int] = range(12)) -> None:
    what = "admit_waiting_loras(running_lora_ids, waiting_lora_ids, max_loras, num_free_seats)"
    num_cases = 0
    for running, waiting, max_loras, seats in _admission_cases(seeds):
        expected = admission_reference(running, waiting, max_loras, seats)
        inputs = {"running_lora_ids": running, "waiting_lora_ids": waiting, "max_loras": max_loras,
                  "num_free_seats": seats}
        args = (list(running), list(waiting))
        with calling("admit_waiting_loras", inputs, expected=expected,
                     hint="the two id lists are plain Python lists (0: no adapter); return a list of positions in "
                          "waiting_lora_ids"):
            got = candidate(*args, max_loras, seats)
        if args != (running, waiting):
            _fail(what, inputs, "your function changed one of its input lists",
                  "the queue and the running list belong to the scheduler: read them only")
        if not isinstance(got, list | tuple) or not all(isinstance(i, int) for i in got):
            _fail(what, inputs, f"got {got!r}", "return a list of ints: the positions in waiting_lora_ids admitted")
        got = list(got)
        if any(not 0 <= i < len(waiting) for i in got) or got != sorted(set(got)):
            _fail(what, inputs, f"got {got}: positions must be valid indices into waiting_lora_ids ({len(waiting)} "
                  f"requests), each once, in queue order", "walk the queue front to back and record each admitted "
                                                           "request's position")
        if got != expected:
            k = next((k for k, (e, g) in enumerate(zip(expected, got, strict=False)) if e != g), None)
            if k is not None:   # the first position where the two walks part: the earlier of the two requests
                index = min(expected[k], got[k])
            else:               # one is a prefix of the other: the first request only the longer one admits
                index = expected[len(got)] if len(expected) > len(got) else got[len(expected)]
            state = "admitted" if index in expected else "left waiting"
            _fail(what, inputs,
                  f"waiting request {index} (adapter {waiting[index]}{' = base model' if waiting[index] == 0 else ''}) "
                  f"should be {state}\n  expected admitted: {expected}\n  got admitted:      {got}",
                  _admission_hint(running, waiting, max_loras, seats, expected, got, index))
        num_cases += 1
    passed("check_lora_admission", num_cases)


# ---------------------------------------------------------------- adapters for "Plug it in"
PROJECTIONS = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
               "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def write_lora_adapter(base_dir: str | Path, out_dir: str | Path, *, r: int = 8, alpha: float = 16.0,
                       seed: int = 0, std: float = 0.05, targets: Iterable[str] = tuple(PROJECTIONS)) -> Path:
    """A PEFT LoRA adapter folder for the model at `base_dir` (`adapter_config.json` + `adapter_model.safetensors`,
    PEFT's names and shapes: A `[r, in]`, B `[out, r]`), seeded random A and B, written without `peft`."""
    from safetensors.torch import save_file

    base_dir, out_dir = Path(base_dir), Path(out_dir)
    config = json.loads((base_dir / "config.json").read_text())
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    kv = config.get("num_key_value_heads", config["num_attention_heads"]) * head_dim
    q = config["num_attention_heads"] * head_dim
    shapes = {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden),
              "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    targets = list(targets)
    for layer in range(config["num_hidden_layers"]):
        for proj in targets:
            in_features, out_features = shapes[proj]
            prefix = f"base_model.model.model.layers.{layer}.{PROJECTIONS[proj]}.{proj}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(r, in_features, generator=generator) / math.sqrt(
                in_features)
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_features, r, generator=generator) * std
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "adapter_model.safetensors"))
    (out_dir / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(base_dir), "r": r,
        "lora_alpha": alpha, "lora_dropout": 0.0, "target_modules": targets, "bias": "none",
        "use_rslora": False, "use_dora": False, "modules_to_save": None, "fan_in_fan_out": False,
        "rank_pattern": {}, "alpha_pattern": {}}, indent=2))
    return out_dir


PHASE = Phase("16_lora", (
    Exercise("compute_token_lora_indices", check_token_lora_indices, points=3,
             grade_id="test-token-lora-indices", part="compute_token_lora_indices",
             design="the mapping from the step's requests to its tokens: how to find each adapter id's slot in the "
                    "slot table, what a base request's tokens get, and how to give every token its request's slot "
                    "without a Python loop over tokens, from the contract and a traced step"),
    Exercise("lora_shrink", check_lora_shrink, points=2, grade_id="test-lora-shrink", part="lora_shrink"),
    Exercise("lora_expand", check_lora_expand, points=3, grade_id="test-lora-expand", part="lora_expand"),
    Exercise("admit_waiting_loras", check_lora_admission, points=2, grade_id="test-lora-admission"),
))
