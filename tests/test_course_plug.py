"""labs.plug: installs a learner's function, class or kernel in an engine seam (mini/seams.py), with no
monkeypatching; restores the reference after the block, even after an error; rejects unknown names; and
reaches a running engine. Every seam belongs to one exercise of a phase table, and every plug target exists."""

from __future__ import annotations

import pytest

import mini.worker.prepare_inputs as prep
from labs import lab_names, plug
from labs.manifest import all_phases, seam_exercises
from mini import LLM, SamplingParams, seams
from mini.core import kv_cache_utils
from mini.core.block_pool import BlockPool
from mini.engine.llm_engine import LLMEngine


def test_every_seam_belongs_to_one_exercise_and_every_exercise_seam_exists():
    claimed = seam_exercises()
    assert sorted(claimed) == lab_names(), "each engine seam is filled by exactly one exercise"
    for phase in all_phases():
        for exercise in phase.exercises:
            if exercise.seam is not None:
                assert seams.reference(exercise.seam) is not None, exercise


def test_unknown_name_lists_the_allowed_ones():
    with pytest.raises(ValueError, match="allowed names") as error, plug(no_such_lab=lambda: None):
        pass
    assert "compute_slot_mapping" in str(error.value) and "allocate_slots" in str(error.value)


def test_non_callable_is_a_type_error():
    with pytest.raises(TypeError, match="compute_slot_mapping"), plug(compute_slot_mapping=42):
        pass


def test_nothing_is_patched_and_the_reference_comes_back_even_after_an_error():
    module_function = prep.compute_slot_mapping

    def fake(*args):
        return "fake"

    with pytest.raises(RuntimeError), plug(compute_slot_mapping=fake):
        assert prep.compute_slot_mapping is module_function   # the module is untouched ...
        assert prep.compute_slot_mapping(None, None, None, 4) == "fake"   # ... the seam dispatches
        assert seams.is_overridden("compute_slot_mapping")
        raise RuntimeError("boom")
    assert not seams.is_overridden("compute_slot_mapping")
    assert seams.implementation("compute_slot_mapping") is seams.reference("compute_slot_mapping")


def test_nested_plugs_restore_the_outer_one():
    def outer(*args):
        return "outer"

    def inner(*args):
        return "inner"

    with plug(compute_positions=outer):
        with plug(compute_positions=inner):
            assert prep.compute_positions([0], [1]) == "inner"
        assert prep.compute_positions([0], [1]) == "outer"
    assert prep.compute_positions([0], [1]).tolist() == [0]


def test_a_class_seam_is_what_the_engine_builds():
    class MyQueue(kv_cache_utils.FreeKVCacheBlockQueue):
        pass

    with plug(FreeKVCacheBlockQueue=MyQueue):
        assert isinstance(BlockPool(4).free_block_queue, MyQueue)
    assert type(BlockPool(4).free_block_queue) is kv_cache_utils.FreeKVCacheBlockQueue


def test_methods_and_staticmethods_dispatch_with_their_arguments():
    calls = []

    def get_new_blocks(self, num_blocks):
        calls.append((type(self).__name__, num_blocks))
        return []

    def kv_bytes_per_block(config, hf_config):
        return 123

    with plug(get_new_blocks=get_new_blocks, kv_bytes_per_block=kv_bytes_per_block):
        assert BlockPool(4).get_new_blocks(2) == [] and calls == [("BlockPool", 2)]
        assert LLMEngine.kv_bytes_per_block(None, None) == 123
    assert isinstance(vars(LLMEngine)["kv_bytes_per_block"], staticmethod)
    assert len(BlockPool(4).get_new_blocks(2)) == 2


def test_plugged_function_runs_inside_the_engine(tiny_llama_dir):
    calls = []
    reference = seams.reference("compute_slot_mapping")

    def spy(block_table, req_indices, positions, block_size):
        calls.append(positions.tolist())
        return reference(block_table, req_indices, positions, block_size)

    llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, block_size=4, max_model_len=64)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    expected = llm.generate([{"prompt_token_ids": [1, 2, 3]}], params)[0].outputs[0].token_ids
    with plug(compute_slot_mapping=spy):
        got = llm.generate([{"prompt_token_ids": [1, 2, 3]}], params)[0].outputs[0].token_ids
    assert calls[:2] == [[0, 1, 2], [3]]  # the prefill, then the first decode step
    assert got == expected


def test_a_plugged_sampler_op_turns_the_fused_path_off():
    from mini.sample.sampler import FUSED_SEAMS, Sampler

    sampler = Sampler()
    assert sampler._fused_allowed()
    for name in FUSED_SEAMS:
        with plug(**{name: seams.reference(name)}):
            assert not sampler._fused_allowed(), name
    assert sampler._fused_allowed()
