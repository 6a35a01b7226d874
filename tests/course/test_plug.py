"""labs.plug: a learner's function, class or kernel becomes a part of the engine BUILT inside the `with`
block (mini/roles.py), with no monkeypatching; an engine built outside keeps the reference; unknown names
are refused; every part belongs to one exercise of a phase table, and every exercise's part exists."""

from __future__ import annotations

import pytest

import mini.worker.prepare_inputs as prep
from labs import lab_names, plug
from labs.manifest import all_phases, part_exercises
from mini import LLM, SamplingParams, roles
from mini.core import kv_cache_utils


def test_every_part_belongs_to_one_exercise_and_every_exercise_part_exists():
    claimed = part_exercises()
    assert sorted(claimed) == lab_names() == roles.part_names(), "each engine part is written by one exercise"
    for phase in all_phases():
        for exercise in phase.exercises:
            if exercise.part is not None:
                assert exercise.part in roles.part_names(), exercise


def test_unknown_name_lists_the_allowed_ones():
    with pytest.raises(ValueError, match="allowed names") as error, plug(no_such_lab=lambda: None):
        pass
    assert "compute_slot_mapping" in str(error.value) and "allocate_slots" in str(error.value)


def test_non_callable_is_a_type_error():
    with pytest.raises(TypeError, match="compute_slot_mapping"), plug(compute_slot_mapping=42):
        pass


def test_nothing_is_patched_and_the_choice_is_undone_even_after_an_error():
    module_function = prep.compute_slot_mapping

    def fake(*args):
        return "fake"

    with pytest.raises(RuntimeError), plug(compute_slot_mapping=fake):
        assert prep.compute_slot_mapping is module_function   # the module is untouched
        assert roles.pending() == {"compute_slot_mapping": fake}   # what an engine built now would take
        raise RuntimeError("boom")
    assert roles.pending() == {}


def _small_llm(model_dir):
    return LLM(model=str(model_dir), skip_tokenizer_init=True, block_size=4, max_model_len=64,
               num_gpu_blocks_override=32)


def test_an_engine_built_inside_uses_the_class_and_one_built_outside_keeps_its_own(tiny_llama_dir):
    class MyQueue(kv_cache_utils.FreeKVCacheBlockQueue):
        pass

    before = _small_llm(tiny_llama_dir)
    with plug(FreeKVCacheBlockQueue=MyQueue):
        inside = _small_llm(tiny_llama_dir)
        assert type(before.llm_engine.scheduler.kv_cache_manager.block_pool.free_block_queue) is not MyQueue
    after = _small_llm(tiny_llama_dir)
    assert type(inside.llm_engine.scheduler.kv_cache_manager.block_pool.free_block_queue) is MyQueue
    assert type(after.llm_engine.scheduler.kv_cache_manager.block_pool.free_block_queue) is not MyQueue
    assert inside.llm_engine.config.parts == {"FreeKVCacheBlockQueue": MyQueue}   # the choice is a config field
    assert before.llm_engine.config.parts == after.llm_engine.config.parts == {}


def test_a_plugged_function_runs_inside_the_engine_built_with_it(tiny_llama_dir):
    calls = []
    reference = roles.reference("compute_slot_mapping")

    def spy(*args, **kwargs):
        calls.append(1)
        return reference(*args, **kwargs)

    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    expected = _small_llm(tiny_llama_dir).generate([{"prompt_token_ids": [1, 2, 3]}], params)
    with plug(compute_slot_mapping=spy):
        llm = _small_llm(tiny_llama_dir)
    got = llm.generate([{"prompt_token_ids": [1, 2, 3]}], params)   # after the block: the engine kept it
    assert len(calls) == 3   # the prefill, then two decode steps
    assert got[0].outputs[0].token_ids == expected[0].outputs[0].token_ids


@pytest.mark.parametrize("part", ["apply_temperature", "store_kv", "compute_positions", "rms_norm"])
def test_a_plugged_part_turns_its_roles_fast_path_off_when_the_engine_is_built(tiny_llama_dir, part):
    """The fast path is the role's default: a replaced part is decided at construction, not per call."""
    with plug(**{part: roles.reference(part)}):
        llm = _small_llm(tiny_llama_dir)
    role = roles.role_of(part).name
    assert roles.replaced(llm.llm_engine.config, role) == (part,)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    reference = _small_llm(tiny_llama_dir).generate([{"prompt_token_ids": [5, 6, 7]}], params)
    assert llm.generate([{"prompt_token_ids": [5, 6, 7]}], params)[0].outputs[0].token_ids == \
        reference[0].outputs[0].token_ids
