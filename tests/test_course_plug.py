"""mini.labs.plug: swaps reference functions (module functions, methods, staticmethods, classes and
their `from x import name` aliases), restores them, rejects unknown names, and reaches the engine."""

from __future__ import annotations

import importlib

import pytest

import mini.core.block_pool as block_pool_module
import mini.worker.prepare_inputs as prep
from mini import LLM, SamplingParams
from mini.core import kv_cache_utils
from mini.core.block_pool import BlockPool
from mini.engine.llm_engine import LLMEngine
from mini.labs import LAB_TARGETS, lab_names, plug


def test_every_lab_target_exists():
    for name, (module_name, path) in LAB_TARGETS.items():
        owner = importlib.import_module(module_name)
        for part in path.split("."):
            owner = getattr(owner, part)
        assert callable(owner), name


def test_unknown_name_lists_the_allowed_ones():
    with pytest.raises(ValueError, match="allowed names") as error, plug(no_such_lab=lambda: None):
        pass
    assert "slot_mapping" in str(error.value) and "allocate_slots" in str(error.value)


def test_non_callable_is_a_type_error():
    with pytest.raises(TypeError, match="compute_slot_mapping"), plug(compute_slot_mapping=42):
        pass


def test_module_function_is_swapped_and_restored_even_after_an_error():
    original = prep.compute_slot_mapping

    def fake(*args):
        return "fake"

    with pytest.raises(RuntimeError), plug(compute_slot_mapping=fake):
        assert prep.compute_slot_mapping is fake
        raise RuntimeError("boom")
    assert prep.compute_slot_mapping is original


def test_class_and_its_import_alias_are_swapped():
    original = kv_cache_utils.FreeKVCacheBlockQueue

    class MyQueue(original):
        pass

    with plug(FreeKVCacheBlockQueue=MyQueue):
        assert kv_cache_utils.FreeKVCacheBlockQueue is MyQueue
        assert block_pool_module.FreeKVCacheBlockQueue is MyQueue  # `from ... import` in block_pool.py
        assert isinstance(BlockPool(4).free_block_queue, MyQueue)
    assert block_pool_module.FreeKVCacheBlockQueue is original
    assert type(BlockPool(4).free_block_queue) is original


def test_methods_and_staticmethods_keep_their_kind():
    calls = []

    def get_new_blocks(self, num_blocks):
        calls.append(num_blocks)
        return []

    def kv_bytes_per_block(config, hf_config):
        return 123

    with plug(get_new_blocks=get_new_blocks, kv_bytes_per_block=kv_bytes_per_block):
        assert BlockPool(4).get_new_blocks(2) == [] and calls == [2]
        assert LLMEngine.kv_bytes_per_block(None, None) == 123
    assert isinstance(vars(LLMEngine)["kv_bytes_per_block"], staticmethod)
    assert len(BlockPool(4).get_new_blocks(2)) == 2


def test_plugged_function_runs_inside_the_engine(tiny_llama_dir):
    calls = []
    reference = prep.compute_slot_mapping

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
    assert "compute_slot_mapping" in lab_names()
