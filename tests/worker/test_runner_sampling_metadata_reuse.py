"""The runner reuses the step's SamplingMetadata while the batch holds the same requests in the same rows (as
vLLM's persistent InputBatch keeps its sampling tensors), rebuilds it when a request joins, leaves or moves,
and penalties still see every new output token (the output lists are held by reference)."""

from __future__ import annotations

import pytest

from mini import LLM, SamplingParams
from mini.sample.metadata import SamplingMetadata
from mini.worker.model_runner import ModelRunner

# It looks inside the engine (scheduler, runner, observers): its engines run in-process in either suite mode.
pytestmark = pytest.mark.inprocess_engine


def test_metadata_is_built_once_per_batch_composition(monkeypatch):
    builds = []
    original = SamplingMetadata.build.__func__

    def counting_build(cls, *args, **kwargs):
        builds.append(len(kwargs["params"]))
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(SamplingMetadata, "build", classmethod(counting_build))
    llm = LLM()
    engine = llm.llm_engine
    long, short = SamplingParams(max_tokens=12, ignore_eos=True), SamplingParams(max_tokens=4, ignore_eos=True)
    engine.add_request("long", {"prompt_token_ids": [5, 6, 7]}, long)
    engine.add_request("short", {"prompt_token_ids": [8, 9]}, short)
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    assert steps == 12
    # two rows until "short" finishes, then one row: two compositions, so two builds (not one per step)
    assert builds == [2, 1]


def test_reuse_changes_no_token_under_penalties_and_seeds(monkeypatch):
    prompts = [{"prompt_token_ids": [5, 6, 7, 8]}, {"prompt_token_ids": [9, 10]}, {"prompt_token_ids": [11]}]
    params = [SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, repetition_penalty=2.0,
                             presence_penalty=1.5),
              SamplingParams(temperature=1.0, seed=7, max_tokens=9, ignore_eos=True, frequency_penalty=0.8),
              SamplingParams(temperature=0.7, seed=3, max_tokens=13, ignore_eos=True, min_p=0.05)]

    def run() -> list[list[int]]:
        return [o.outputs[0].token_ids for o in LLM().generate(prompts, params, use_tqdm=False)]

    reused = run()
    monkeypatch.setattr(ModelRunner, "_sampling_metadata", ModelRunner._build_sampling_metadata)
    assert run() == reused                                    # rebuilt every step: the same tokens
    assert len(set(reused[0])) > 4                            # the penalties acted (greedy alone repeats)
