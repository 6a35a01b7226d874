"""`compilation_config` (mini/compilation.py, as vLLM's): bad values are refused naming the modes; mode 3 compiles
the model's forward once for a symbolic token count, split at attention, and greedy output stays token-identical
to eager across steps of different batch sizes, without compiling again."""

from __future__ import annotations

import pytest
from torch._dynamo.utils import counters

from mini import LLM, SamplingParams
from mini.compilation import CompilationMode, parse_compilation_mode
from mini.config import EngineConfig


@pytest.mark.parametrize("bad", [1, 2, 4, "3", True, {"mode": 1}, {"level": 3}])
def test_bad_compilation_config_names_the_modes(bad):
    with pytest.raises(ValueError, match="compilation_config"):
        EngineConfig(compilation_config=bad)


@pytest.mark.parametrize(("value", "mode"), [(None, 0), (0, 0), (3, 3), ({"mode": 3}, 3), ({}, 0)])
def test_modes_as_vllm_numbers_them(value, mode):
    assert parse_compilation_mode(value) == CompilationMode(mode)
    assert EngineConfig(compilation_config=value).compilation_mode == mode


def test_compiled_greedy_output_is_token_identical_and_compiles_once():
    prompts = [{"prompt_token_ids": list(range(5, 5 + n))} for n in (3, 17, 40)]
    later = [{"prompt_token_ids": list(range(50, 50 + n))} for n in (9, 2, 33, 21, 60)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    eager = LLM(max_num_batched_tokens=32)          # chunked prefill: steps of many different sizes
    compiled = LLM(max_num_batched_tokens=32, compilation_config=3)
    expected = [o.outputs[0].token_ids for o in eager.generate(prompts, params, use_tqdm=False)]
    assert [o.outputs[0].token_ids for o in compiled.generate(prompts, params, use_tqdm=False)] == expected
    graphs_after_first_run = counters["stats"]["unique_graphs"]
    assert graphs_after_first_run > 0                 # it really compiled
    expected = [o.outputs[0].token_ids for o in eager.generate(later, params, use_tqdm=False)]
    assert [o.outputs[0].token_ids for o in compiled.generate(later, params, use_tqdm=False)] == expected
    assert counters["stats"]["unique_graphs"] == graphs_after_first_run, "a new batch size compiled again"
