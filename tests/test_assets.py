"""The shipped checkpoints in mini/assets load with transformers offline and behave as promised.

They are made by ``python -m scripts.train_shipped_model``; these tests pin what the README and the
later phases (GQA, speculative decoding with the draft model) rely on.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO_ROOT = Path(__file__).resolve().parents[1]
ASSETS = REPO_ROOT / "mini" / "assets"
MAIN_DIR = ASSETS / "tiny-llama"
DRAFT_DIR = ASSETS / "tiny-llama-draft"
EOS_TOKEN = "<|endoftext|>"
UNICODE_SAMPLE = "héllo 🙂 世界\n\tdef f(): pass"


def load_script():
    spec = importlib.util.spec_from_file_location("train_shipped_model",
                                                  REPO_ROOT / "scripts" / "train_shipped_model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def main_model():
    return AutoModelForCausalLM.from_pretrained(MAIN_DIR, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def draft_model():
    return AutoModelForCausalLM.from_pretrained(DRAFT_DIR, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(MAIN_DIR)


def greedy(model, tokenizer, prompt: str, max_new_tokens: int = 64) -> str:
    input_ids = torch.tensor([tokenizer.encode(prompt)])
    with torch.no_grad():
        output = model.generate(input_ids, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(output[0, input_ids.shape[1]:])


def test_folders_hold_safetensors_and_stay_small():
    for folder in (MAIN_DIR, DRAFT_DIR):
        names = {path.name for path in folder.iterdir()}
        assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                "generation_config.json", "training_log.json"} <= names, (folder, names)
        assert not any(name.endswith((".bin", ".pt")) for name in names), names
    total_bytes = sum(path.stat().st_size for path in ASSETS.rglob("*") if path.is_file())
    assert total_bytes < 25 * 2**20, total_bytes


def test_main_model_is_a_small_gqa_llama(main_model):
    config = main_model.config
    num_params = sum(parameter.numel() for parameter in main_model.parameters())
    assert config.model_type == "llama"
    assert 2_000_000 <= num_params <= 5_000_000, num_params
    assert config.num_key_value_heads < config.num_attention_heads
    assert config.num_attention_heads % config.num_key_value_heads == 0
    assert config.tie_word_embeddings


def test_draft_shares_vocab_and_is_shallow(main_model, draft_model, tokenizer):
    assert draft_model.config.model_type == "llama"
    assert 1 <= draft_model.config.num_hidden_layers <= 2
    assert draft_model.config.num_hidden_layers < main_model.config.num_hidden_layers
    assert draft_model.config.vocab_size == main_model.config.vocab_size == len(tokenizer)
    draft_tokenizer = AutoTokenizer.from_pretrained(DRAFT_DIR)
    assert draft_tokenizer.get_vocab() == tokenizer.get_vocab()


@pytest.mark.parametrize("folder", [MAIN_DIR, DRAFT_DIR], ids=["main", "draft"])
def test_byte_level_tokenizer_round_trips_any_unicode(folder):
    tokenizer = AutoTokenizer.from_pretrained(folder)
    token_ids = tokenizer.encode(UNICODE_SAMPLE)
    assert tokenizer.decode(token_ids) == UNICODE_SAMPLE
    assert tokenizer.unk_token_id not in token_ids or tokenizer.unk_token == EOS_TOKEN
    assert EOS_TOKEN not in tokenizer.decode(token_ids)


def test_eos_and_pad_are_defined_consistently(main_model, draft_model, tokenizer):
    assert tokenizer.eos_token == EOS_TOKEN
    assert tokenizer.pad_token == EOS_TOKEN
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    assert tokenizer.encode(EOS_TOKEN) == [eos_id]
    for model in (main_model, draft_model):
        assert model.config.eos_token_id == eos_id
        assert model.generation_config.eos_token_id == eos_id


def test_greedy_fibonacci_reads_like_python(main_model, tokenizer):
    """The body of `def fibonacci(n):` is indented and opens the way stdlib functions do.

    (A 3M-parameter model trained for minutes opens with a docstring, as most stdlib functions do,
    and then repeats itself; the next test checks that it also writes code.)
    """
    continuation = greedy(main_model, tokenizer, "def fibonacci(n):")
    body = re.match(r"\n([ \t]+)(\S+)", continuation)
    assert body, continuation  # the next line is indented
    assert body.group(2).startswith(('"""', "if", "return", "for", "while", "n", "a", "result")), continuation


def test_greedy_function_body_has_python_statements(main_model, tokenizer):
    continuation = greedy(main_model, tokenizer, "import os\n\ndef main():")
    statements = re.findall(r"^[ \t]+(if|return|for|while|try|with|raise)\b", continuation, re.MULTILINE)
    assert len(statements) >= 2, continuation
    indents = [len(line) - len(line.lstrip(" ")) for line in continuation.splitlines() if line.strip()]
    assert indents and all(indent % 4 == 0 for indent in indents), continuation  # PEP 8 block structure


def test_draft_often_agrees_with_main_model(main_model, draft_model, tokenizer):
    """Speculative decoding only pays off when the draft's greedy guesses match the main model's."""
    text = "import os\n\n\ndef main(argv):\n    for name in os.listdir(argv[1]):\n        print(name)\n"
    input_ids = torch.tensor([tokenizer.encode(text)])
    with torch.no_grad():
        main_guess = main_model(input_ids).logits.argmax(-1)
        draft_guess = draft_model(input_ids).logits.argmax(-1)
    agreement = (main_guess == draft_guess).float().mean().item()
    assert agreement >= 0.4, agreement


def test_training_log_matches_the_checkpoint(main_model, draft_model):
    for folder, model in ((MAIN_DIR, main_model), (DRAFT_DIR, draft_model)):
        log = json.loads((folder / "training_log.json").read_text())
        assert log["parameters"] == sum(parameter.numel() for parameter in model.parameters())
        assert log["vocab_size"] == model.config.vocab_size
        uniform_loss = math.log(model.config.vocab_size)   # what an untrained model scores
        assert log["final_eval_loss"] < 0.75 * uniform_loss, log["final_eval_loss"]
        for key in ("train_seconds", "size_on_disk_bytes", "final_train_loss", "corpus_bytes", "seed",
                    "command", "python_version"):
            assert key in log, key


def test_script_helpers_are_deterministic_and_validate_input():
    script = load_script()
    documents = ["def f(x):\n    return x + 1\n", "class A:\n    pass\n"] * 20 + ["héllo 🙂 世界\n"]
    train_docs, held_out = script.split_documents(documents, eval_every=10)
    assert len(train_docs) + len(held_out) == len(documents) and len(held_out) == 5
    first = script.train_tokenizer(documents, vocab_size=300)
    second = script.train_tokenizer(documents, vocab_size=300)
    assert first.get_vocab() == second.get_vocab()
    assert first.decode(first.encode(UNICODE_SAMPLE)) == UNICODE_SAMPLE
    stream = script.encode_documents(first, documents[:2])
    assert (stream == first.eos_token_id).sum().item() == 2 and stream[-1].item() == first.eos_token_id
    assert script.lr_at(0, 100, 1.0, warmup_steps=10) == pytest.approx(0.1)
    assert script.lr_at(10, 100, 1.0, warmup_steps=10) == pytest.approx(1.0)
    assert script.lr_at(100, 100, 1.0, warmup_steps=10) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="--batch-size"):
        script.parse_args(["--batch-size", "0"])
    with pytest.raises(ValueError, match="--vocab-size"):
        script.parse_args(["--vocab-size", "10"])
