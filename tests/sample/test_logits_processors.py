"""Logits processors and BatchUpdate handling (vLLM tests/v1/logits_processors/test_correctness.py idea):
a random persistent batch evolves for many steps; after every update each row's processed logits must
equal those of the request now in that row processed alone, and untouched rows stay bit-identical."""

from __future__ import annotations

import random
import sys
import types

import pytest
import torch

from mini.sample.logits_processor import (
    BatchUpdate,
    BatchUpdateBuilder,
    LogitBiasLogitsProcessor,
    LogitsProcessor,
    LogitsProcessorConfig,
    MinPLogitsProcessor,
    MinTokensLogitsProcessor,
    MoveDirectionality,
    build_logitsprocs,
    process_dict_updates,
)
from mini.sampling_params import SamplingParams

VOCAB = 24
CONFIG = LogitsProcessorConfig(vocab_size=VOCAB)
SWAP, UNIDIRECTIONAL = MoveDirectionality.SWAP, MoveDirectionality.UNIDIRECTIONAL


class BanTokenZeroForTaggedRequests(LogitsProcessor):
    """A custom processor in vLLM's style: rows whose extra_args has "ban_zero" never emit token 0."""

    def __init__(self, vllm_config, device, is_pin_memory):
        self.rows: dict[int, bool] = {}

    def is_argmax_invariant(self):
        return False

    def update_state(self, batch_update):
        process_dict_updates(self.rows, batch_update,
                             lambda params, _p, _o: (params.extra_args or {}).get("ban_zero") or None)

    def apply(self, logits):
        if self.rows:
            logits[list(self.rows), 0] = -float("inf")
        return logits


PROCESSOR_CLASSES = [MinPLogitsProcessor, LogitBiasLogitsProcessor, MinTokensLogitsProcessor,
                     BanTokenZeroForTaggedRequests]


def random_params(rng: random.Random) -> SamplingParams:
    params = SamplingParams(
        temperature=1.0,
        min_p=rng.choice([0.0, 0.0, 0.2, 0.5]),
        logit_bias=rng.choice([None, {rng.randrange(VOCAB): rng.uniform(-5, 5), rng.randrange(VOCAB): 3.0}]),
        min_tokens=rng.choice([0, 0, 2, 5]),
        stop_token_ids=rng.choice([[], [rng.randrange(VOCAB)]]),
        extra_args={"ban_zero": rng.random() < 0.4},
    )
    params.update_from_eos(rng.randrange(VOCAB))
    return params


class Request:
    def __init__(self, rng: random.Random, name: int):
        self.name = name
        self.params = random_params(rng)
        self.prompt = [rng.randrange(VOCAB) for _ in range(3)]
        self.output: list[int] = [rng.randrange(VOCAB) for _ in range(rng.choice([0, 0, 1, 4]))]


def standalone(cls, request: Request, logits_row: torch.Tensor) -> torch.Tensor:
    processor = cls(CONFIG, torch.device("cpu"), False)
    processor.update_state(BatchUpdate(1, [], [(0, request.params, request.prompt, request.output)], []))
    return processor.apply(logits_row.unsqueeze(0).clone())[0]


def step_batch(rng: random.Random, rows: list[Request], builder: BatchUpdateBuilder,
               next_name: list[int]) -> None:
    """One step of persistent-batch bookkeeping with vLLM's rules, recorded in `builder`."""
    for index in range(len(rows)):
        if rows[index] is not None and rng.random() < 0.25:
            rows[index] = None
            builder.removed_append(index)
    for _ in range(rng.choice([0, 1, 2, 3])):
        request = Request(rng, next_name[0])
        next_name[0] += 1
        index = builder.pop_removed()
        if index is None:
            index = len(rows)
            rows.append(None)
        rows[index] = request
        builder.added_append((index, request.params, request.prompt, request.output))
    # Condense: the highest occupied row moves into the lowest hole.
    while None in rows:
        hole = rows.index(None)
        last = max((i for i, r in enumerate(rows) if r is not None), default=-1)
        if last < hole:
            del rows[hole:]
            break
        rows[hole], rows[last] = rows[last], None
        builder.moved_append((last, hole, UNIDIRECTIONAL))
    for _ in range(rng.choice([0, 0, 1, 2])):
        if len(rows) >= 2:
            a, b = rng.sample(range(len(rows)), 2)
            rows[a], rows[b] = rows[b], rows[a]
            builder.moved_append((a, b, SWAP))


@pytest.mark.parametrize("cls", PROCESSOR_CLASSES, ids=lambda c: c.__name__)
def test_processor_follows_a_random_batch_for_60_steps(cls):
    rng = random.Random(sum(map(ord, cls.__name__)))
    processor = cls(CONFIG, torch.device("cpu"), False)
    builder = BatchUpdateBuilder()
    rows: list[Request] = []
    next_name = [0]
    saw = {"removed": 0, "moved": 0, "swap": 0, "none": 0}
    for _ in range(60):
        step_batch(rng, rows, builder, next_name)
        update = builder.get_and_reset(len(rows))
        if update is None:
            saw["none"] += 1
        else:
            saw["removed"] += len(update.removed)
            saw["moved"] += sum(m[2] is UNIDIRECTIONAL for m in update.moved)
            saw["swap"] += sum(m[2] is SWAP for m in update.moved)
        processor.update_state(update)
        if not rows:
            continue
        logits = torch.randn(len(rows), VOCAB, generator=torch.Generator().manual_seed(rng.randrange(10**6)))
        processed = processor.apply(logits.clone())
        for index, request in enumerate(rows):
            expected = standalone(cls, request, logits[index])
            assert torch.equal(processed[index], expected), (index, request.name)
        for request in rows:  # every live request generates a token (seen through the by-reference list)
            request.output.append(rng.randrange(VOCAB))
    assert saw["removed"] and saw["moved"] and saw["swap"], saw


def test_untouched_rows_stay_bit_identical():
    procs = build_logitsprocs([BanTokenZeroForTaggedRequests], VOCAB)
    plain = SamplingParams()
    used = SamplingParams(min_p=0.5, logit_bias={3: 2.0}, min_tokens=3, stop_token_ids=[5],
                          extra_args={"ban_zero": True})
    added = [(0, plain, [], []), (1, used, [], []), (2, plain, [], [])]
    procs.update_state(BatchUpdate(3, [], added, []))
    logits = torch.randn(3, VOCAB)
    out = logits.clone()
    for processor in procs.all:
        out = processor.apply(out)
    assert torch.equal(out[[0, 2]], logits[[0, 2]])
    assert out[1, 0] == -float("inf") and out[1, 5] == -float("inf") and not torch.equal(out[1], logits[1])


def test_removes_then_adds_then_moves_order_and_unidirectional_overwrite():
    processor = LogitBiasLogitsProcessor(CONFIG, torch.device("cpu"), False)
    a, b, c, d = (SamplingParams(logit_bias={i: 1.0}) for i in range(4))
    processor.update_state(BatchUpdate(3, [], [(0, a, [], []), (1, b, [], []), (2, c, [], [])], []))
    # Remove row 0, add d at row 1 (replacing b), then move row 2 -> 0 (one-way) and swap 0 <-> 1.
    processor.update_state(BatchUpdate(2, [0], [(1, d, [], [])], [(2, 0, UNIDIRECTIONAL), (0, 1, SWAP)]))
    assert processor.bias_by_row == {0: {3: 1.0}, 1: {2: 1.0}}
    # A one-way move onto an occupied row discards that row's request.
    processor.update_state(BatchUpdate(1, [], [], [(1, 0, UNIDIRECTIONAL)]))
    assert processor.bias_by_row == {0: {2: 1.0}}


def test_min_tokens_releases_rows_as_outputs_grow_by_reference():
    processor = MinTokensLogitsProcessor(CONFIG, torch.device("cpu"), False)
    params = SamplingParams(min_tokens=2, stop_token_ids=[7])
    output: list[int] = []
    processor.update_state(BatchUpdate(1, [], [(0, params, [1], output)], []))
    assert processor.apply(torch.zeros(1, VOCAB))[0, 7] == -float("inf")
    output.extend([1, 2])
    processor.update_state(None)
    assert processor.apply(torch.zeros(1, VOCAB))[0, 7] == 0.0


def test_batch_update_builder_records_and_resets():
    builder = BatchUpdateBuilder()
    assert builder.get_and_reset(0) is None
    builder.removed_append(4)
    builder.removed_append(1)
    assert builder.peek_removed() == 1 and builder.pop_removed() == 1 and builder.has_removed()
    params = SamplingParams()
    builder.added_append((1, params, [], []))
    builder.moved_append((3, 2, UNIDIRECTIONAL))
    update = builder.get_and_reset(3)
    assert update == BatchUpdate(3, [4], [(1, params, [], [])], [(3, 2, UNIDIRECTIONAL)])
    assert builder.get_and_reset(3) is None
    with pytest.raises(TypeError, match="MoveDirectionality"):
        builder.moved_append((0, 1, "swap"))


def test_build_logitsprocs_splits_by_argmax_invariance_and_loads_custom_classes(monkeypatch):
    module = types.ModuleType("my_custom_procs")
    module.Ban = BanTokenZeroForTaggedRequests
    monkeypatch.setitem(sys.modules, "my_custom_procs", module)
    procs = build_logitsprocs(
        [BanTokenZeroForTaggedRequests, "my_custom_procs:Ban", "my_custom_procs.Ban"], VOCAB)
    assert [type(p) for p in procs.argmax_invariant] == [MinPLogitsProcessor]
    assert [type(p).__name__ for p in procs.non_argmax_invariant] == [
        "LogitBiasLogitsProcessor", "MinTokensLogitsProcessor"] + ["BanTokenZeroForTaggedRequests"] * 3
    with pytest.raises(TypeError, match="LogitsProcessor subclasses"):
        build_logitsprocs([dict], VOCAB)
    with pytest.raises(ValueError, match="package.module:ClassName"):
        build_logitsprocs(["nomodule"], VOCAB)
    with pytest.raises(ValueError, match="vocab_size"):
        build_logitsprocs(None, 0)


def test_logit_bias_out_of_range_token_raises():
    processor = LogitBiasLogitsProcessor(CONFIG, torch.device("cpu"), False)
    with pytest.raises(ValueError, match="logit_bias token ids"):
        processor.update_state(BatchUpdate(1, [], [(0, SamplingParams(logit_bias={VOCAB: 1.0}), [], [])], []))


def test_a_resolved_container_builds_the_chosen_min_tokens_class_and_hands_out_process_dict_updates():
    """The logits-processor parts of the sampler role (mini/roles.py) live on `LogitsProcessors`: an engine
    built with them replaced instantiates its min-tokens class, and its built-ins follow rows with its
    `process_dict_updates`; one built without them keeps the references."""
    from mini.config import EngineConfig

    calls = []

    def counting_process_dict_updates(entries, batch_update, new_state):
        calls.append(batch_update)
        return process_dict_updates(entries, batch_update, new_state)

    class MyMinTokens(MinTokensLogitsProcessor):
        pass

    config = EngineConfig(parts={"process_dict_updates": counting_process_dict_updates,
                                 "MinTokensLogitsProcessor": MyMinTokens})
    container = build_logitsprocs(None, VOCAB, engine_config=config)
    assert [type(p) for p in container.all] == [MinPLogitsProcessor, LogitBiasLogitsProcessor, MyMinTokens]
    update = BatchUpdate(batch_size=1, removed=[], added=[(0, SamplingParams(min_p=0.1, min_tokens=2), [1], [])],
                         moved=[])
    container.update_state(update)
    assert calls == [update] * 3          # every built-in (MyMinTokens inherits the reference's update_state)
    plain = build_logitsprocs(None, VOCAB)
    assert [type(p) for p in plain.all] == [MinPLogitsProcessor, LogitBiasLogitsProcessor, MinTokensLogitsProcessor]
    plain.update_state(update)
    assert len(calls) == 3
