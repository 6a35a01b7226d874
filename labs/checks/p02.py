"""Checks for phase 02 (slot_mapping and the flat batch), against mini.worker.prepare_inputs.

    check_query_start_loc(compute_query_start_loc)
    check_positions(compute_positions)
    check_slot_mapping(compute_slot_mapping)
    check_prepare_inputs(prepare_inputs)

The first case of each is the worked example of the phase: block_size 4, prompts of 5, 7 and 3
tokens in blocks [1, 2], [3, 4] and [5], then the decode step that follows, then a chunked-prefill step
(a request whose token list holds more tokens than it has computed and scheduled so far), then seeded
random steps (some of them chunked too). `prepare_inputs` and `compute_query_start_loc` also get an empty
batch. `compute_positions` and `compute_slot_mapping` must be vectorized: the Python lines they run may
not grow with the number of tokens (a per-token loop fails; a loop over requests is allowed for positions).
Every function must leave its arguments as they were (the runner reuses them: `positions` goes to the model
next), checked after each call. `check_slot_mapping` also runs the notebook's last traced rows (block_size 2,
a request whose blocks are 7 then 3), so a rule fitted to block_size 4 alone fails.

vLLM v0.33.0 builds these in `GPUModelRunner._prepare_inputs` (vllm/v1/worker/gpu_model_runner.py): its
positions logic (`GPUModelRunner._get_cumsum_and_arange` plus one gather) runs on the CPU and passes
check_positions (tests/course/vllm_answers/test_p02.py); its slot mapping is a Triton kernel
(`ComputeSlotMappingKernel.kernel` in vllm/v1/worker/block_table.py), also run against check_slot_mapping
there when Triton is installed; `query_start_loc` and the input-id gather are inline code, with no
function of their own to run.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch

from labs.checks.common import (  # expect_same_tokens: the plug cells of phases 02-04 import it from here
    _ENGINE_DIR,
    _LABS_DIR,
    _LIBRARY_DIRS,
    calling,
    expect_equal,
    expect_same_tokens,  # noqa: F401
    passed,
    step_cases,
)
from labs.checks.grading import graded
from labs.manifest import Exercise, Phase
from mini.worker import prepare_inputs as reference

EMPTY_STEP = {"token_ids": [], "block_ids": [], "block_size": 4, "num_computed_tokens": [],
              "num_scheduled_tokens": []}


class _CountLines:
    """Counts the Python lines executed in the learner's own code (not in torch, labs or mini) during a call."""

    def __init__(self) -> None:
        self.count = 0

    def _local(self, frame, event, arg):
        if event == "line":
            self.count += 1
        return self._local

    def _global(self, frame, event, arg):
        return None if frame.f_code.co_filename.startswith((_LABS_DIR, _ENGINE_DIR, *_LIBRARY_DIRS)) else self._local

    def __enter__(self) -> _CountLines:  # noqa: PYI034 - a private helper, never subclassed
        self._previous = sys.gettrace()
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc_info) -> None:
        sys.settrace(self._previous)


def _lines_run(function: Callable, *args: Any) -> int:
    with _CountLines() as counter:
        function(*args)
    return counter.count


def _expect_vectorized(name: str, few: int, many: int, sizes: tuple[int, int], hint: str) -> None:
    expect_equal(
        f"{name} is vectorized",
        {"requests": 3, "tokens": f"{sizes[0]} then {sizes[1]}",
         f"Python lines run with {sizes[0]} tokens": few},
        f"<= {few + 10} lines with {sizes[1]} tokens",
        f"{many} lines with {sizes[1]} tokens",
        hint,
        equal=lambda expected, got: many <= few + 10,
    )


def _list_difference(want: list, have: list) -> str:
    """Where two (nested) lists first differ: its coordinates, both values, and a window of 3 entries each side."""
    if not isinstance(have, list) or len(want) != len(have) and all(a == b for a, b in zip(want, have, strict=False)):
        return f"length {len(have) if isinstance(have, list) else '?'}, expected {len(want)}"
    for i, (a, b) in enumerate(zip(want, have, strict=False)):
        if a != b:
            if isinstance(a, list) and isinstance(b, list):
                inner = _list_difference(a, b)
                return f"row {i}: {inner}"
            if len(want) <= 16:
                return f"first difference at [{i}]: expected {a}, got {b}"
            lo = max(0, i - 3)
            return (f"first difference at [{i}]: expected {a}, got {b}; entries [{lo}:{i + 4}] expected "
                    f"{want[lo:i + 4]}, got {have[lo:i + 4]}")
    return f"length {len(have)}, expected {len(want)}"


def _expect_tensor(what: str, inputs: dict, expected: torch.Tensor, got: Any, hint: str) -> None:
    if not isinstance(got, torch.Tensor):
        raise AssertionError(  # noqa: TRY004 - a failed check, not a caller's type error
            f"{what}: expected a torch.Tensor, got {type(got).__name__}\n  inputs: {inputs}"
        )
    want, have = expected.tolist(), got.tolist()
    if want != have:
        inputs = {**inputs, "where it differs": _list_difference(want, have)}
    expect_equal(what, inputs, want, have, hint)
    expect_equal(
        f"{what} dtype",
        inputs,
        expected.dtype,
        got.dtype,
        "the values are right; the attention kernels also need this exact dtype",
    )


def _expect_unchanged(name: str, inputs: dict[str, Any], before: dict[str, Any], after: dict[str, Any],
                      why: str) -> None:
    """The learner's function must leave its arguments as they were: `before` holds untouched copies of what
    `after` held when it was passed."""
    __tracebackhide__ = True
    for key, original in before.items():
        now = after[key]
        if isinstance(original, torch.Tensor):
            same = isinstance(now, torch.Tensor) and now.shape == original.shape and torch.equal(now, original)
            shown_before, shown_after = original.tolist(), now.tolist() if isinstance(now, torch.Tensor) else now
        else:
            same, shown_before, shown_after = now == original, original, now
        if not same:
            where = _list_difference(shown_before, shown_after) if isinstance(shown_after, list) else ""
            raise AssertionError(
                f"{name} changed its input {key} in place\n"
                f"  inputs: {inputs}\n"
                f"  {key} before the call: {str(shown_before)[:300]}\n"
                f"  {key} after the call:  {str(shown_after)[:300]}\n"
                + (f"  {where.replace('expected', 'was').replace('got', 'now')}\n" if where else "")
                + f"  hint: the values you return may be right, but {why}; compute into new tensors (no in-place "
                "operator such as //=, %=, +=, no .append / .insert on the lists you are given)")


def _req_indices(num_scheduled_tokens: list[int]) -> torch.Tensor:
    counts = torch.as_tensor(num_scheduled_tokens)
    return torch.repeat_interleave(torch.arange(len(counts)), counts)


@graded
def check_query_start_loc(compute_query_start_loc: Callable, seeds: Iterable[int] = range(20)) -> None:
    cases = [*step_cases(seeds), EMPTY_STEP]
    for case in cases:
        inputs = {"num_scheduled_tokens": case["num_scheduled_tokens"]}
        expected = reference.compute_query_start_loc(case["num_scheduled_tokens"])
        given = list(case["num_scheduled_tokens"])
        with calling("compute_query_start_loc", inputs, expected=expected):
            got = compute_query_start_loc(given)
        _expect_tensor(
            "compute_query_start_loc",
            inputs,
            expected,
            got,
            "B + 1 entries: request i owns flat rows [query_start_loc[i], query_start_loc[i+1]); requests "
            "sit end to end from row 0, and the last entry is the total number of tokens",
        )
        _expect_unchanged("compute_query_start_loc", inputs, {"num_scheduled_tokens": case["num_scheduled_tokens"]},
                          {"num_scheduled_tokens": given}, "the list is the scheduler's, read again after this call")
    passed("check_query_start_loc", len(cases))


@graded
def check_positions(compute_positions: Callable, seeds: Iterable[int] = range(20)) -> None:
    cases = step_cases(seeds)
    for case in cases:
        inputs = {key: case[key] for key in ("num_computed_tokens", "num_scheduled_tokens")}
        expected = reference.compute_positions(**inputs)
        given = {key: list(value) for key, value in inputs.items()}
        with calling("compute_positions", inputs, expected=expected):
            got = compute_positions(**given)
        _expect_tensor(
            "compute_positions",
            inputs,
            expected,
            got,
            "request i's new tokens sit at num_computed[i], num_computed[i] + 1, ... (one per row)",
        )
        _expect_unchanged("compute_positions", inputs, inputs, given,
                          "the lists are the scheduler's, read again after this call")
    with calling("compute_positions", {"note": "3 requests of 4, then of 300 new tokens each"}):
        few = _lines_run(compute_positions, [0, 5, 9], [4, 4, 4])
        many = _lines_run(compute_positions, [0, 5, 9], [300, 300, 300])
    _expect_vectorized("compute_positions", few, many, (12, 900),
                       "no Python loop over tokens: repeat_interleave the per-request starts and subtract "
                       "each request's first flat row from one arange over all tokens")
    passed("check_positions", len(cases) + 1)


# The notebook's last traced rows: block_size 2, a request whose blocks are 7 then 3 (its slots go down).
TRACE_BLOCK_SIZE_2 = {"token_ids": [[3, 1, 4, 1]], "block_ids": [[7, 3]], "block_size": 2,
                      "num_computed_tokens": [0], "num_scheduled_tokens": [4]}


@graded
def check_slot_mapping(compute_slot_mapping: Callable, seeds: Iterable[int] = range(20)) -> None:
    cases = step_cases(seeds)
    cases.insert(3, TRACE_BLOCK_SIZE_2)
    for case in cases:
        block_table = reference.make_block_table(case["block_ids"])
        req_indices = _req_indices(case["num_scheduled_tokens"])
        positions = reference.compute_positions(case["num_computed_tokens"], case["num_scheduled_tokens"])
        inputs = {
            "block_table": block_table.tolist(),
            "req_indices": req_indices.tolist(),
            "positions": positions.tolist(),
            "block_size": case["block_size"],
        }
        expected = reference.compute_slot_mapping(block_table, req_indices, positions, case["block_size"])
        given = {"block_table": block_table.clone(), "req_indices": req_indices.clone(), "positions": positions.clone()}
        with calling("compute_slot_mapping", inputs, expected=expected,
                     hint=f"{_slot_hint(case['block_size'])}; an index error on block_table means a block index "
                          "past the end of the request's row"):
            got = compute_slot_mapping(given["block_table"], given["req_indices"], given["positions"],
                                       case["block_size"])
        _expect_tensor(
            "compute_slot_mapping",
            inputs,
            expected,
            got,
            _slot_hint(case["block_size"]),
        )
        _expect_unchanged("compute_slot_mapping", inputs,
                          {"block_table": block_table, "req_indices": req_indices, "positions": positions}, given,
                          "the runner hands the same positions tensor to the model after this call (rotary "
                          "embeddings read it) and keeps the block table for attention")
    with calling("compute_slot_mapping", {"note": "3 requests of 4, then of 300 new tokens each"}):
        few, many = (_slot_mapping_lines(compute_slot_mapping, n) for n in (4, 300))
    _expect_vectorized("compute_slot_mapping", few, many, (12, 900),
                       "no Python loop over tokens: index block_table with the two index tensors "
                       "(req_indices, positions // block_size) at once, then one multiply-add")
    passed("check_slot_mapping", len(cases) + 1)


def _slot_hint(block_size: int) -> str:
    return (f"a slot numbers one token place of the whole cache, block after block ({block_size} places a block "
            "here): find which entry of the request's block table row holds the position, and where inside that "
            "block it sits (the block ids come from block_table, the block size from the argument)")


def _slot_mapping_lines(compute_slot_mapping: Callable, tokens_per_request: int) -> int:
    block_size = 16
    blocks = -(-tokens_per_request // block_size)
    table = reference.make_block_table([[1 + r * blocks + b for b in range(blocks)] for r in range(3)])
    req_indices = torch.arange(3).repeat_interleave(tokens_per_request)
    positions = torch.arange(tokens_per_request).repeat(3)
    return _lines_run(compute_slot_mapping, table, req_indices, positions, block_size)


_PREPARE_HINTS = {
    "input_ids": "request i's tokens at positions num_computed_tokens[i] .. num_computed_tokens[i] + "
                 "num_scheduled_tokens[i] - 1 of token_ids[i], requests end to end (under chunked prefill "
                 "token_ids[i] holds more tokens than computed + scheduled: not the last ones)",
    "seq_lens": "int32, per request: the tokens in its cache once this step has run (those cached before and "
                "those computed now; under chunked prefill fewer than len(token_ids[i]))",
    "block_table": "make_block_table(block_ids): int32 [B, max_blocks], rows padded with 0",
    "logits_indices": "int64, each request's LAST flat row (its last new token predicts the next one): a row "
                      "inside the batch, below T",
}


@graded
def check_prepare_inputs(prepare_inputs: Callable, seeds: Iterable[int] = range(20)) -> None:
    cases = [*step_cases(seeds), EMPTY_STEP]
    for case in cases:
        inputs = {
            key: case[key]
            for key in ("token_ids", "num_computed_tokens", "num_scheduled_tokens", "block_ids", "block_size")
        }
        expected = reference.prepare_inputs(**inputs)
        given = copy.deepcopy(inputs)
        with calling("prepare_inputs", inputs, expected=expected):
            got = prepare_inputs(**given)
        if not isinstance(got, (reference.PreparedInputs, dict)):
            raise AssertionError(  # noqa: TRY004 - a failed check, not a caller's type error
                f"prepare_inputs: expected a PreparedInputs, got {type(got).__name__}\n  inputs: {inputs}\n"
                "  hint: return PreparedInputs(input_ids=..., positions=..., query_start_loc=..., seq_lens=..., "
                "slot_mapping=..., block_table=..., logits_indices=...)")
        for name in [f.name for f in dataclasses.fields(expected)]:
            value = got.get(name) if isinstance(got, dict) else getattr(got, name, None)
            _expect_tensor(
                f"prepare_inputs(...).{name}",
                inputs,
                expected[name],
                value,
                _PREPARE_HINTS.get(name, f"see the table in the phase: how {name} is built from the "
                                         "per-request lists (an empty batch gives empty tensors)"),
            )
        _expect_unchanged("prepare_inputs", inputs, inputs, given,
                          "the per-request lists are the runner's and the scheduler's, read again after this call")
    passed("check_prepare_inputs", len(cases))


# ---- "Plug it in" (phases 02-05): the engine's tokens against the reference's, with what differed
def expect_same_slot_mappings(mine: Any, reference_run: Any) -> None:
    """Two `record_run` recordings: raise at the first engine step whose slot_mapping differs (step, flat row,
    expected vs got)."""
    __tracebackhide__ = True
    want_steps = [s.batch.slot_mapping for s in reference_run.snapshots[1:]]
    have_steps = [s.batch.slot_mapping for s in mine.snapshots[1:]]
    for step, (want, have) in enumerate(zip(want_steps, have_steps, strict=False), start=1):
        if want != have:
            row = next((i for i, (a, b) in enumerate(zip(want, have, strict=False)) if a != b),
                       min(len(want), len(have)))
            raise AssertionError(
                f"engine step {step}: slot_mapping differs from flat row {row} on; expected {want}, got {have}"
            ) from None
    if len(want_steps) != len(have_steps):
        raise AssertionError(f"the engine ran {len(have_steps)} steps with your code, {len(want_steps)} with the "
                             "reference") from None


PHASE = Phase("02_slot_mapping", (
    Exercise("compute_query_start_loc", check_query_start_loc, points=2, grade_id="test-query-start-loc",
             part="compute_query_start_loc"),
    Exercise("compute_positions", check_positions, points=2, grade_id="test-positions", part="compute_positions"),
    Exercise("compute_slot_mapping", check_slot_mapping, points=3, grade_id="test-slot-mapping",
             part="compute_slot_mapping",
             design="the slot rule itself, derived from traced tokens (block size, block table row, position -> "
                    "slot), then vectorized"),
    Exercise("prepare_inputs", check_prepare_inputs, points=3, grade_id="test-prepare-inputs", part="prepare_inputs"),
))
