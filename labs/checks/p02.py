"""Checks for phase 02 (slot_mapping and the flat batch), against mini.worker.prepare_inputs.

    check_query_start_loc(compute_query_start_loc)
    check_positions(compute_positions)
    check_slot_mapping(compute_slot_mapping)
    check_prepare_inputs(prepare_inputs)

The first case of each is the worked example of the phase: block_size 4, prompts of 5, 7 and 3
tokens in blocks [1, 2], [3, 4] and [5], then the decode step that follows.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterable
from typing import Any

import torch

from labs.checks.common import calling, expect_equal, passed
from labs.manifest import Exercise, Phase
from mini.worker import prepare_inputs as reference

WORKED_EXAMPLE = {
    "token_ids": [[1, 2, 3, 4, 5], [1, 6, 5, 7, 8, 9, 10], [1, 12, 13]],
    "block_ids": [[1, 2], [3, 4], [5]],
    "block_size": 4,
}


def random_step(rng: random.Random, max_token_id: int = 1000) -> dict[str, Any]:
    """A random step: each request has some tokens cached and schedules a few more (decode = 1)."""
    block_size = rng.choice([1, 2, 4, 8, 16])
    num_reqs = rng.randint(1, 5)
    free_ids = list(range(1, 256))
    rng.shuffle(free_ids)
    token_ids, computed, scheduled, block_ids = [], [], [], []
    for _ in range(num_reqs):
        total = rng.randint(1, 40)
        num_scheduled = 1 if rng.random() < 0.4 else rng.randint(1, total)
        token_ids.append([rng.randrange(max_token_id) for _ in range(total)])
        computed.append(total - num_scheduled)
        scheduled.append(num_scheduled)
        num_blocks = -(-total // block_size)
        block_ids.append([free_ids.pop() for _ in range(num_blocks)])
    return {
        "token_ids": token_ids,
        "num_computed_tokens": computed,
        "num_scheduled_tokens": scheduled,
        "block_ids": block_ids,
        "block_size": block_size,
    }


def step_cases(seeds: Iterable[int], max_token_id: int = 1000) -> list[dict[str, Any]]:
    """The worked example's prefill and decode steps, then one random step per seed."""
    prefill = {**WORKED_EXAMPLE, "num_computed_tokens": [0, 0, 0], "num_scheduled_tokens": [5, 7, 3]}
    decode = {
        "token_ids": [t + [99] for t in WORKED_EXAMPLE["token_ids"]],
        "block_ids": [[1, 2], [3, 4], [5]],
        "block_size": 4,
        "num_computed_tokens": [5, 7, 3],
        "num_scheduled_tokens": [1, 1, 1],
    }
    return [prefill, decode, *(random_step(random.Random(seed), max_token_id) for seed in seeds)]


def _expect_tensor(what: str, inputs: dict, expected: torch.Tensor, got: Any, hint: str) -> None:
    if not isinstance(got, torch.Tensor):
        raise AssertionError(  # noqa: TRY004 - a failed check, not a caller's type error
            f"{what}: expected a torch.Tensor, got {type(got).__name__}\n  inputs: {inputs}"
        )
    expect_equal(what, inputs, expected.tolist(), got.tolist(), hint)
    expect_equal(
        f"{what} dtype",
        inputs,
        expected.dtype,
        got.dtype,
        "the values are right; the attention kernels also need this exact dtype",
    )


def _req_indices(num_scheduled_tokens: list[int]) -> torch.Tensor:
    counts = torch.as_tensor(num_scheduled_tokens)
    return torch.repeat_interleave(torch.arange(len(counts)), counts)


def check_query_start_loc(compute_query_start_loc: Callable, seeds: Iterable[int] = range(20)) -> None:
    cases = step_cases(seeds)
    for case in cases:
        inputs = {"num_scheduled_tokens": case["num_scheduled_tokens"]}
        expected = reference.compute_query_start_loc(case["num_scheduled_tokens"])
        with calling("compute_query_start_loc", inputs, expected=expected):
            got = compute_query_start_loc(case["num_scheduled_tokens"])
        _expect_tensor(
            "compute_query_start_loc",
            inputs,
            expected,
            got,
            "B + 1 entries: 0 then the running total (prefix sum) of scheduled tokens",
        )
    passed("check_query_start_loc", len(cases))


def check_positions(compute_positions: Callable, seeds: Iterable[int] = range(20)) -> None:
    cases = step_cases(seeds)
    for case in cases:
        inputs = {key: case[key] for key in ("num_computed_tokens", "num_scheduled_tokens")}
        expected = reference.compute_positions(**inputs)
        with calling("compute_positions", inputs, expected=expected):
            got = compute_positions(**inputs)
        _expect_tensor(
            "compute_positions",
            inputs,
            expected,
            got,
            "request i's new tokens sit at num_computed[i], num_computed[i] + 1, ... (one per row)",
        )
    passed("check_positions", len(cases))


def check_slot_mapping(compute_slot_mapping: Callable, seeds: Iterable[int] = range(20)) -> None:
    cases = step_cases(seeds)
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
        with calling("compute_slot_mapping", inputs, expected=expected):
            got = compute_slot_mapping(
                block_table.clone(), req_indices.clone(), positions.clone(), case["block_size"]
            )
        _expect_tensor(
            "compute_slot_mapping",
            inputs,
            expected,
            got,
            "slot = block_table[req, pos // block_size] * block_size + pos % block_size",
        )
    passed("check_slot_mapping", len(cases))


def check_prepare_inputs(prepare_inputs: Callable, seeds: Iterable[int] = range(20)) -> None:
    cases = step_cases(seeds)
    for case in cases:
        inputs = {
            key: case[key]
            for key in ("token_ids", "num_computed_tokens", "num_scheduled_tokens", "block_ids", "block_size")
        }
        expected = reference.prepare_inputs(**inputs)
        with calling("prepare_inputs", inputs, expected=expected):
            got = prepare_inputs(**inputs)
        for name in [f.name for f in dataclasses.fields(expected)]:
            try:
                value = got[name]
            except (KeyError, TypeError, AttributeError):
                value = getattr(got, name, None)
            _expect_tensor(
                f"prepare_inputs(...).{name}",
                inputs,
                expected[name],
                value,
                f"see the table in the phase: how {name} is built from the per-request lists",
            )
    passed("check_prepare_inputs", len(cases))


PHASE = Phase("02_slot_mapping", (
    Exercise("compute_query_start_loc", check_query_start_loc, points=2, grade_id="test-query-start-loc", seam="compute_query_start_loc"),
    Exercise("compute_positions", check_positions, points=2, grade_id="test-positions", seam="compute_positions"),
    Exercise("compute_slot_mapping", check_slot_mapping, points=3, grade_id="test-slot-mapping", seam="compute_slot_mapping"),
    Exercise("prepare_inputs", check_prepare_inputs, points=3, grade_id="test-prepare-inputs", seam="prepare_inputs"),
))
