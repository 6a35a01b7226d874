"""`python -m mini serve --enable-lora --lora-modules name=path ...`: adapters served as models of their own.

An adapter is the request's `model`; `/v1/models` lists it with its base model as `parent` (vLLM's ModelCard);
its completions equal transformers with that adapter merged by peft; an unknown model is a 404 in OpenAI's
error shape; a bad `--lora-modules` entry or adapter folder is refused at start-up, naming it.
"""

from __future__ import annotations

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("peft")

from patience import HANG_GUARD_S

from mini.config import SHIPPED_MODEL_DIR
from mini.engine.async_llm import AsyncLLM
from mini.entrypoints.openai.api_server import build_app, parse_lora_modules, serve_in_thread
from tests.lora.adapters import make_adapter, merged_greedy

pytestmark = pytest.mark.engine_modes
MODEL = "tiny-llama"
PROMPT_IDS = [5, 17, 42, 99, 7]
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("served-adapters")
    return {"sql": make_adapter(SHIPPED_MODEL_DIR, root / "sql", r=4, seed=11, std=0.2),
            "poems": make_adapter(SHIPPED_MODEL_DIR, root / "poems", r=8, seed=12, std=0.2,
                                  targets=["v_proj", "up_proj"])}


@pytest.fixture(scope="module")
def server(adapters):
    engine = AsyncLLM.from_engine_args(enable_lora=True, max_loras=2, max_lora_rank=8)
    modules = parse_lora_modules([f"{name}={path}" for name, path in adapters.items()])
    with serve_in_thread(build_app(engine, MODEL, lora_modules=modules)) as url:
        yield url, engine


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0, timeout=HANG_GUARD_S)


def test_models_lists_the_adapters(client, adapters):
    cards = {card.id: card for card in client.models.list().data}
    assert list(cards) == [MODEL, "sql", "poems"]
    assert cards["sql"].parent == MODEL and cards["sql"].root == str(adapters["sql"])


def test_adapter_as_model_matches_peft_merged(client, server, adapters):
    tokenizer = server[1].tokenizer
    texts = {}
    for name in (MODEL, "sql", "poems"):
        completion = client.completions.create(model=name, prompt=PROMPT_IDS, temperature=0.0, max_tokens=MAX_TOKENS,
                                               extra_body={"ignore_eos": True})
        expected = merged_greedy(SHIPPED_MODEL_DIR, adapters.get(name), [PROMPT_IDS], MAX_TOKENS)[0]
        assert completion.choices[0].text == tokenizer.decode(expected), name
        texts[name] = completion.choices[0].text
    assert len(set(texts.values())) == 3, f"the adapters must change the output: {texts}"


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as error:
        client.completions.create(model="no-such-adapter", prompt=PROMPT_IDS, max_tokens=2)
    assert error.value.status_code == 404 and "no-such-adapter" in error.value.message
    assert error.value.body["type"] == "NotFoundError" and error.value.body["param"] == "model"
    assert client.completions.create(model="sql", prompt=PROMPT_IDS, max_tokens=2).choices[0].text is not None


def test_bad_lora_modules_are_refused_at_start_up(tmp_path):
    for value, message in [("sql", "name=path pairs"), ("=x", "name=path pairs")]:
        with pytest.raises(ValueError, match=message):
            parse_lora_modules([value])
    with pytest.raises(ValueError, match="names 'a' twice"):
        parse_lora_modules(["a=/x", "a=/y"])
    engine = AsyncLLM.from_engine_args(enable_lora=True)
    try:
        with pytest.raises(ValueError, match="LoRA adapter 'gone'.*not a folder"):
            build_app(engine, MODEL, lora_modules=parse_lora_modules([f"gone={tmp_path / 'gone'}"]))
    finally:
        engine.shutdown()
