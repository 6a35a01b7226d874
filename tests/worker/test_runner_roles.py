"""The runner's, the model's and the attention backend's roles (mini/roles.py), chosen when the engine is built.

An engine built inside `plug(...)` runs the replaced parts at every step and keeps them; one built outside keeps
the reference. A replaced runner part builds the role's reference runner (`ReferenceModelRunner`: the inputs
composed by `prepare_inputs` from the per-request lists) with the part in place; an engine with none replaced
builds the fast `ModelRunner`, which never asks what was replaced.
"""

from __future__ import annotations

import pytest

from labs import plug
from mini import LLM, SamplingParams, roles
from mini.attention.cpu_paged import CpuAttentionBackend
from mini.attention.reference import ReferenceAttentionBackend
from mini.model.llama import LlamaForCausalLM
from mini.sample.sampler import ReferenceSampler, Sampler
from mini.structured_output.bitmask import BitmaskApplier, TorchBitmaskApplier
from mini.worker.input_batch import InputBatch
from mini.worker.model_runner import ModelRunner, ReferenceModelRunner

# It looks inside the engine (scheduler, runner, observers): its engines run in-process in either suite mode.
pytestmark = pytest.mark.inprocess_engine

PROMPTS = [{"prompt_token_ids": ids} for ids in ([1, 2, 3, 4, 5], [1, 6, 5, 7, 8, 9, 10], list(range(20, 34)))]
PARAMS = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)


def build(model_dir, **kwargs) -> LLM:
    return LLM(model=str(model_dir), skip_tokenizer_init=True, block_size=4, num_gpu_blocks_override=32,
               max_model_len=64, max_num_batched_tokens=12, **kwargs)


def tokens(llm: LLM) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]


def counting(calls: dict[str, int], name: str):
    reference = roles.reference(name)

    def wrapped(*args, **kwargs):
        calls[name] = calls.get(name, 0) + 1
        return reference(*args, **kwargs)

    return wrapped


@pytest.fixture(scope="module")
def expected(tiny_llama_dir) -> list[list[int]]:
    return tokens(build(tiny_llama_dir))


def test_an_engine_built_without_parts_uses_the_home_classes(tiny_llama_dir):
    engine = build(tiny_llama_dir).llm_engine
    assert type(engine.model_runner) is ModelRunner and engine.config.parts == {}
    assert type(engine.model_runner.input_batch) is InputBatch
    assert type(engine.model) is LlamaForCausalLM
    assert type(engine.model.attention_backend) is CpuAttentionBackend   # the CPU default


def test_the_default_engine_builds_the_fast_classes_and_a_plugged_one_the_reference_classes(tiny_llama_dir):
    """No fast path asks what was replaced: the engine picks the fast class or the role's reference class (with
    the part bound in) once, when it is built (mini/roles.py `Role.reference_classes`)."""
    runner = build(tiny_llama_dir).llm_engine.model_runner
    assert (type(runner), type(runner.sampler), type(runner.bitmask_applier)) == (ModelRunner, Sampler, BitmaskApplier)
    replacements = {name: roles.reference(name) for name in ("compute_slot_mapping", "random_sample",
                                                               "apply_token_bitmask_inplace")}
    with plug(**replacements):
        plugged = build(tiny_llama_dir).llm_engine.model_runner
    for component, reference_class, part in ((plugged, ReferenceModelRunner, "compute_slot_mapping"),
                                              (plugged.sampler, ReferenceSampler, "random_sample"),
                                              (plugged.bitmask_applier, TorchBitmaskApplier,
                                               "apply_token_bitmask_inplace")):
        assert type(component).__bases__ == (reference_class,), (part, type(component))
        assert getattr(type(component), part) is replacements[part]
    assert plugged.bitmask_applier.op is replacements["apply_token_bitmask_inplace"]


def test_a_replaced_input_helper_runs_inside_the_reference_composition(tiny_llama_dir, expected):
    calls: dict[str, int] = {}
    with plug(compute_positions=counting(calls, "compute_positions"), condense=counting(calls, "condense")):
        llm = build(tiny_llama_dir)
    runner = llm.llm_engine.model_runner
    assert isinstance(runner, ReferenceModelRunner)
    assert type(runner).compute_positions is not ModelRunner.compute_positions
    assert type(runner.input_batch).__bases__ == (InputBatch,) and type(runner.input_batch).condense is not \
        InputBatch.condense
    assert tokens(llm) == expected
    assert calls["compute_positions"] == calls["condense"] > 0   # once per step each
    calls.clear()
    assert tokens(build(tiny_llama_dir)) == expected and calls == {}   # built outside: the reference


def test_a_replaced_prepare_inputs_is_called_with_the_exercise_signature(tiny_llama_dir, expected):
    seen = []

    def my_prepare_inputs(token_ids, num_computed_tokens, num_scheduled_tokens, block_ids, block_size):
        seen.append(list(num_scheduled_tokens))
        return roles.reference("prepare_inputs")(token_ids, num_computed_tokens, num_scheduled_tokens, block_ids,
                                                 block_size)

    with plug(prepare_inputs=my_prepare_inputs):
        llm = build(tiny_llama_dir)
    assert tokens(llm) == expected
    assert seen[0] == [5, 7] and all(sum(step) <= 12 for step in seen)


def test_other_runner_parts_run_in_the_reference_runner(tiny_llama_dir, expected):
    calls: dict[str, int] = {}
    with plug(run_model=counting(calls, "run_model"), update_states=counting(calls, "update_states"),
              build_attention_metadata=counting(calls, "build_attention_metadata")):
        llm = build(tiny_llama_dir)
    assert isinstance(llm.llm_engine.model_runner, ReferenceModelRunner)
    assert tokens(llm) == expected
    assert calls["run_model"] == calls["update_states"] == calls["build_attention_metadata"] > 0


def test_model_and_attention_parts_reach_every_layer(tiny_llama_dir, expected):
    calls: dict[str, int] = {}
    with plug(**{name: counting(calls, name) for name in ("rms_norm", "apply_rotary", "store_kv", "gather_kv")}):
        llm = build(tiny_llama_dir)
    model = llm.llm_engine.model
    assert type(model).__bases__ == (LlamaForCausalLM,) and type(model).rms_norm is not LlamaForCausalLM.rms_norm
    # "torch_fast" asked for, a reference part replaced: the engine built the reference backend holding it
    assert isinstance(model.attention_backend, ReferenceAttentionBackend)
    assert type(model.attention_backend).__bases__ == (ReferenceAttentionBackend,)
    assert all(layer.self_attn.backend is model.attention_backend for layer in model.model.layers)
    assert tokens(llm) == expected
    layers = model.config.num_hidden_layers
    assert calls["store_kv"] % layers == 0 and calls["apply_rotary"] == 2 * calls["store_kv"]
    assert calls["gather_kv"] > 0   # the reference paged_attention's prefill loop reads through it
