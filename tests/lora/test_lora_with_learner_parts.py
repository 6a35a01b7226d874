"""A LoRA engine with a learner's runner parts in place (the capstone plugs every phase's answers at once): the
adapters must still apply. Phase 04's `update_states` was written before LoRA existed, so the runner keeps each
request's adapter outside it (`ModelRunner._update_lora_requests`)."""

from __future__ import annotations

from pathlib import Path

from labs import plug
from labs.course.answers import load_answers
from mini import LLM, LoRARequest, SamplingParams

PHASE_04 = Path(__file__).resolve().parents[2] / "solutions" / "04_model_runner" / "04_model_runner.ipynb"


def _tokens(llm: LLM, prompts: list[list[int]], adapters: list) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0.0, max_tokens=6),
                           lora_request=adapters, use_tqdm=False)
    return [list(out.outputs[0].token_ids) for out in outputs]


def test_adapters_apply_with_phase_04s_update_states(tiny_llama_dir, lora_adapters):
    update_states = load_answers(PHASE_04).get("update_states")
    assert update_states is not None, f"{PHASE_04} defines no update_states"
    adapter = LoRARequest("a", 1, str(lora_adapters["a"]))
    prompts = [[5, 6, 7, 8, 9]] * 2
    args = dict(model=str(tiny_llama_dir), enable_lora=True, max_loras=1, max_lora_rank=8, skip_tokenizer_init=True)
    expected = _tokens(LLM(**args), prompts, [adapter, None])
    assert expected[0] != expected[1], "the adapter must change the tokens"
    with plug(update_states=update_states):
        llm = LLM(**args)
    assert _tokens(llm, prompts, [adapter, None]) == expected
