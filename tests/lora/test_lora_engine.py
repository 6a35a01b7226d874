"""Many LoRA adapters in one batch, end to end (issue 42), in the suite's engine mode (a child process by default).

Exactness: each request's greedy output equals transformers with ITS adapter merged by peft (`merge_and_unload`)
on the same tiny random Llama, in a batch mixing three adapters and the base model, with `max_loras=2` and
`max_cpu_loras=2` (so the scheduler holds requests back and slots and the CPU cache evict), with prefix caching
on and the same prompt under every adapter (a block cached for one adapter must not serve another).
Bad input: refused before anything is queued, with the adapter and the field named; the engine goes on.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from mini import LLM, LoRARequest, SamplingParams
from tests.lora.adapters import merged_greedy

MAX_TOKENS = 8
pytestmark = pytest.mark.engine_modes


def _prompts(vocab_size: int = 211) -> list[list[int]]:
    generator = torch.Generator().manual_seed(7)
    shared = torch.randint(0, vocab_size, (21,), generator=generator).tolist()   # > one block of 16
    others = [torch.randint(0, vocab_size, (n,), generator=generator).tolist() for n in (3, 9, 17, 5)]
    return [shared, *others]


@pytest.fixture(scope="module")
def lora_llm(tiny_llama_dir):
    llm = LLM(model=str(tiny_llama_dir), enable_lora=True, max_loras=2, max_lora_rank=8, max_cpu_loras=2,
              skip_tokenizer_init=True, enable_prefix_caching=True, max_num_seqs=8)
    yield llm
    llm.llm_engine.shutdown()


def test_mixed_batch_matches_peft_merged_transformers(lora_llm, tiny_llama_dir, lora_adapters):
    prompts = _prompts()
    requests = {name: LoRARequest(name, index + 1, str(path))
                for index, (name, path) in enumerate(lora_adapters.items())}
    names = [None, "a", "b", "c"]
    # every prompt under every adapter and the base, interleaved so one batch mixes them all
    batch = [(prompt_index, name) for prompt_index in range(len(prompts)) for name in names]
    expected = {name: merged_greedy(tiny_llama_dir, None if name is None else lora_adapters[name], prompts, MAX_TOKENS)
                for name in names}
    assert len({tuple(expected[name][0]) for name in names}) == len(names), "the adapters must change the output"
    outputs = lora_llm.generate([{"prompt_token_ids": prompts[p]} for p, _ in batch],
                                SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
                                lora_request=[None if name is None else requests[name] for _, name in batch],
                                use_tqdm=False)
    for (prompt_index, name), output in zip(batch, outputs, strict=True):
        assert list(output.outputs[0].token_ids) == expected[name][prompt_index], (
            f"prompt {prompt_index} with adapter {name!r}: mini {list(output.outputs[0].token_ids)}, "
            f"peft-merged transformers {expected[name][prompt_index]}")
    # once more, the shared prompt's blocks now cached under each adapter: hits must stay per adapter
    again = lora_llm.generate([{"prompt_token_ids": prompts[0]}] * 4, SamplingParams(temperature=0.0, max_tokens=4),
                              lora_request=[None if name is None else requests[name] for name in names], use_tqdm=False)
    for name, output in zip(names, again, strict=True):
        assert list(output.outputs[0].token_ids) == expected[name][0][:4], f"adapter {name!r} after cache hits"


def test_each_output_names_its_lora_request(lora_llm, lora_adapters):
    """vLLM's RequestOutput.lora_request (vllm/outputs.py): the adapter the request ran with, None for the base."""
    a, b = (LoRARequest(name, index + 1, str(lora_adapters[name])) for index, name in enumerate(("a", "b")))
    chosen = [a, None, b, a]
    outputs = lora_llm.generate([{"prompt_token_ids": [5, 6, 7]}] * 4, SamplingParams(max_tokens=2),
                                lora_request=chosen, use_tqdm=False)
    assert [output.lora_request for output in outputs] == chosen
    assert "lora_request=LoRARequest(lora_name='a'" in repr(outputs[0])
    # the engine loop's outputs carry it too
    lora_llm.llm_engine.add_request("lora-out", {"prompt_token_ids": [1, 2]}, SamplingParams(max_tokens=2),
                                    lora_request=b)
    finished = []
    while lora_llm.llm_engine.has_unfinished_requests():
        finished += [output for output in lora_llm.llm_engine.step() if output.finished]
    assert [(output.request_id, output.lora_request) for output in finished] == [("lora-out", b)]


def _copy(adapter, tmp_path, name):
    target = tmp_path / name
    shutil.copytree(adapter, target)
    return target


def test_bad_adapters_are_refused_before_anything_is_queued(lora_llm, lora_adapters, tmp_path):
    good = LoRARequest("a", 1, str(lora_adapters["a"]))
    no_weights = _copy(lora_adapters["a"], tmp_path, "no-weights")
    (no_weights / "adapter_model.safetensors").unlink()
    bad_json = _copy(lora_adapters["a"], tmp_path, "bad-json")
    (bad_json / "adapter_config.json").write_text("{not json")
    high_rank = _copy(lora_adapters["a"], tmp_path, "high-rank")
    config = json.loads((high_rank / "adapter_config.json").read_text())
    (high_rank / "adapter_config.json").write_text(json.dumps({**config, "r": 16}))
    other_base = _copy(lora_adapters["a"], tmp_path, "other-base")
    from safetensors.torch import load_file, save_file
    tensors = load_file(other_base / "adapter_model.safetensors")
    key = next(k for k in tensors if k.endswith("q_proj.lora_B.weight"))
    tensors[key] = torch.zeros(tensors[key].shape[0] * 2, tensors[key].shape[1])   # a wider model's q_proj
    save_file(tensors, other_base / "adapter_model.safetensors")
    cases = [
        (LoRARequest("missing", 11, str(tmp_path / "nowhere")), "'missing'.*not a folder"),
        (LoRARequest("no-weights", 12, str(no_weights)), "'no-weights'.*missing adapter_model.safetensors"),
        (LoRARequest("bad-json", 13, str(bad_json)), "'bad-json'.*adapter_config.json is not valid JSON"),
        (LoRARequest("high-rank", 14, str(high_rank)), "'high-rank'.*rank 16 is greater than max_lora_rank 8"),
        (LoRARequest("other-base", 15, str(other_base)), "'other-base'.*q_proj.lora_B.weight.*expected \\[64, 4\\]"),
        (LoRARequest("a-again", 1, str(lora_adapters["b"])), "lora_int_id 1 already names adapter 'a'"),
        ("a", "lora_request must be a mini.lora.LoRARequest"),
    ]
    params = SamplingParams(temperature=0.0, max_tokens=3)
    for bad, message in cases:
        with pytest.raises((ValueError, TypeError), match=message):
            lora_llm.generate([{"prompt_token_ids": [1, 2, 3]}] * 2, params, lora_request=[good, bad], use_tqdm=False)
        assert not lora_llm.llm_engine.has_unfinished_requests(), f"{bad!r}: a request was queued"
    outputs = lora_llm.generate([{"prompt_token_ids": [1, 2, 3]}] * 2, params, lora_request=[good, None],
                                use_tqdm=False)
    assert all(len(output.outputs[0].token_ids) == 3 for output in outputs)
    with pytest.raises(ValueError, match="lora_int_id must be an int >= 1"):
        LoRARequest("zero", 0, str(lora_adapters["a"]))


def test_lora_request_without_enable_lora_is_refused(tiny_llama_dir, lora_adapters):
    llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True)
    try:
        with pytest.raises(ValueError, match="LoRA is not enabled: start the engine with enable_lora=True"):
            llm.generate([{"prompt_token_ids": [1, 2]}], lora_request=LoRARequest("a", 1, str(lora_adapters["a"])),
                         use_tqdm=False)
        assert not llm.llm_engine.has_unfinished_requests()
        assert len(llm.generate([{"prompt_token_ids": [1, 2]}], SamplingParams(max_tokens=2), use_tqdm=False)) == 1
    finally:
        llm.llm_engine.shutdown()


@pytest.mark.parametrize("args, message", [
    ({"max_loras": 0}, "max_loras must be a positive int"),
    ({"max_loras": 3, "max_cpu_loras": 2}, r"max_cpu_loras \(2\) must be >= max_loras \(3\)"),
    ({"tensor_parallel_size": 2}, "enable_lora=True cannot be combined with tensor_parallel_size"),
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}},
     "enable_lora=True cannot be combined with speculative_config"),
])
def test_lora_config_is_checked(args, message):
    from mini.config import EngineConfig

    with pytest.raises(ValueError, match=message):
        EngineConfig(enable_lora=True, **args)
    assert EngineConfig(enable_lora=True, max_loras=3).max_cpu_loras == 3
