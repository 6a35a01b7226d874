"""End to end on the model shipped inside the package: text in, text out, the CLI, stop strings."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from patience import RUN_GUARD_S

from mini import LLM, SamplingParams
from mini.config import SHIPPED_MODEL_DIR

pytestmark = pytest.mark.skipif(not (SHIPPED_MODEL_DIR / "config.json").exists(), reason="no shipped model")
pytestmark = [pytestmark, pytest.mark.inprocess_engine]  # it looks inside the engine: in-process engines


@pytest.fixture(scope="module")
def llm():
    return LLM()


def test_default_llm_is_the_shipped_model_and_matches_transformers(llm):
    import torch
    from transformers import AutoModelForCausalLM

    prompt = "def fibonacci(n):"
    out = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True), use_tqdm=False)[0]
    hf = AutoModelForCausalLM.from_pretrained(SHIPPED_MODEL_DIR, dtype=torch.float32).eval()
    ids = torch.tensor([out.prompt_token_ids])
    with torch.inference_mode():
        expected = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=48, min_new_tokens=48,
                               do_sample=False,
                               pad_token_id=hf.generation_config.eos_token_id)[0, ids.shape[1]:].tolist()
    assert list(out.outputs[0].token_ids) == expected
    text = out.outputs[0].text
    assert text == llm.get_tokenizer().decode(expected)
    assert re.match(r"\n[ \t]+\S", text), text  # an indented body follows the def


def test_stop_string_is_cut_from_text_unless_included(llm):
    prompt = "def fibonacci(n):"
    base = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0].text
    stop = base.strip()[:3] if base.strip() else "\n"
    cut = base.index(stop)
    out = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=40, stop=[stop]), use_tqdm=False)[0]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop
    assert out.outputs[0].text == base[:cut]
    kept = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=40, stop=[stop],
                                               include_stop_str_in_output=True), use_tqdm=False)[0]
    assert kept.outputs[0].text == base[: cut + len(stop)]
    pool = llm.llm_engine.scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1


def test_multibyte_prompt_round_trips(llm):
    prompt = "s = '日本語 🙂 café'\nprint(s"
    out = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True), use_tqdm=False)[0]
    tokenizer = llm.get_tokenizer()
    assert tokenizer.decode(out.prompt_token_ids) == prompt
    assert out.outputs[0].text == tokenizer.decode(out.outputs[0].token_ids)


def test_cli_generate_runs_offline():
    result = subprocess.run(
        [sys.executable, "-m", "mini", "generate", "def fibonacci(n):", "--max-tokens", "16"],
        check=False, capture_output=True, text=True, timeout=RUN_GUARD_S, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert "def fibonacci(n):" in result.stdout and "finish_reason=" in result.stdout


def test_cli_rejects_bad_sampling_flag():
    result = subprocess.run(
        [sys.executable, "-m", "mini", "generate", "x", "--temperature", "-2"],
        check=False, capture_output=True, text=True, timeout=RUN_GUARD_S,
    )
    assert result.returncode == 2 and "temperature" in result.stderr
