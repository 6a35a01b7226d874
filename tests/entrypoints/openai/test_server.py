"""The OpenAI-compatible server, called with the real `openai` client on 127.0.0.1 (shipped tiny model)."""

from __future__ import annotations

import asyncio
import json

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from patience import HANG_GUARD_S

from mini.engine.async_llm import AsyncLLM
from mini.entrypoints.openai.api_server import build_app, serve_in_thread

# Run again with the engine core in-process by scripts/test.sh (`-m engine_modes`): both modes are tested.
pytestmark = pytest.mark.engine_modes

MODEL = "tiny-llama"
PROMPT = "Once upon a time"
GREEDY = {"temperature": 0.0, "max_tokens": 12, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def server():
    engine = AsyncLLM.from_engine_args(max_num_seqs=16)
    with serve_in_thread(build_app(engine, MODEL)) as url:
        yield url, engine
    assert not engine.is_running  # the app's shutdown stopped the engine loop


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0, timeout=HANG_GUARD_S)


def test_health_and_models(server, client):
    assert httpx.get(f"{server[0]}/health", timeout=HANG_GUARD_S).status_code == 200
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_completion_streamed_equals_whole_with_usage(client):
    whole = client.completions.create(model=MODEL, prompt=PROMPT, **GREEDY)
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 12
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 12 and whole.usage.prompt_tokens > 0
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, stream=True,
                                            stream_options={"include_usage": True}, **GREEDY))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text and len(text) > 0
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_chat_streamed_equals_whole(client):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Tell a story."}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, **GREEDY)
    assert whole.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and len(text) > 0
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 12
    # the documented fallback template: one "role: content" line per message, then "assistant:"
    assert whole.usage.prompt_tokens == len(client_tokenize("system: You are terse.\nuser: Tell a story.\nassistant:"))


def client_tokenize(text: str) -> list[int]:
    from mini.config import SHIPPED_MODEL_DIR
    from mini.tokenizer import load_tokenizer

    return load_tokenizer(SHIPPED_MODEL_DIR).encode(text, add_special_tokens=False)


def test_n_seed_stop_and_batched_prompts(client):
    sampled = client.completions.create(model=MODEL, prompt=PROMPT, n=2, seed=7, temperature=1.0, max_tokens=8)
    again = client.completions.create(model=MODEL, prompt=PROMPT, n=2, seed=7, temperature=1.0, max_tokens=8)
    assert [c.index for c in sampled.choices] == [0, 1]
    assert [c.text for c in sampled.choices] == [c.text for c in again.choices]
    whole = client.completions.create(model=MODEL, prompt=PROMPT, **GREEDY).choices[0].text
    stop = whole.strip()[:3]
    stopped = client.completions.create(model=MODEL, prompt=PROMPT, stop=[stop], **GREEDY).choices[0]
    assert stopped.finish_reason == "stop" and stopped.text == whole[:whole.index(stop)]
    batch = client.completions.create(model=MODEL, prompt=[PROMPT, "The little dog"], **GREEDY)
    assert [c.index for c in batch.choices] == [0, 1] and batch.choices[0].text == whole
    ids = client.completions.create(model=MODEL, prompt=[[5, 6, 7], [8, 9]], **GREEDY)
    assert [c.index for c in ids.choices] == [0, 1] and ids.usage.prompt_tokens == 5


def test_logprobs(client):
    completion = client.completions.create(model=MODEL, prompt=PROMPT, logprobs=2, **GREEDY).choices[0]
    assert len(completion.logprobs.tokens) == 12 == len(completion.logprobs.token_logprobs)
    assert "".join(completion.logprobs.tokens) == completion.text
    assert all(len(top) >= 1 for top in completion.logprobs.top_logprobs)
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                          logprobs=True, top_logprobs=3, **GREEDY).choices[0]
    assert len(chat.logprobs.content) == 12
    assert all(len(entry.top_logprobs) == 3 and entry.logprob <= 0 for entry in chat.logprobs.content)
    # greedy: the sampled token is the most likely one
    assert all(entry.top_logprobs[0].logprob == pytest.approx(entry.logprob) for entry in chat.logprobs.content)


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(server, client):
    with pytest.raises(openai.NotFoundError) as not_found:
        client.completions.create(model="no-such-model", prompt=PROMPT)
    assert not_found.value.status_code == 404 and "no-such-model" in not_found.value.message
    bad = [{"temperature": -1.0}, {"top_p": 0.0}, {"n": 0}, {"max_tokens": 0},
           {"prompt": [10**6]}, {"prompt": []}, {"extra_body": {"top_k": -5}}]
    for fields in bad:
        request = {"model": MODEL, "prompt": PROMPT, **fields}
        with pytest.raises(openai.BadRequestError) as error:
            client.completions.create(**request)
        assert error.value.status_code == 400, fields
    with pytest.raises(openai.BadRequestError, match="role"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "wizard", "content": "x"}])
    raw = httpx.post(f"{server[0]}/v1/completions", content=b"{not json", timeout=HANG_GUARD_S,
                     headers={"content-type": "application/json"})
    assert raw.status_code == 400
    body = raw.json()["error"]
    assert set(body) >= {"message", "type", "code"} and body["code"] == 400
    missing = httpx.post(f"{server[0]}/v1/chat/completions", json={"model": MODEL}, timeout=HANG_GUARD_S)
    assert missing.status_code == 400 and "messages" in missing.json()["error"]["message"]
    assert client.completions.create(model=MODEL, prompt=PROMPT, **GREEDY).choices[0].text


def test_response_format_json_object(client):
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Give JSON"}], max_tokens=64, temperature=0.0,
        response_format={"type": "json_object"})
    choice = reply.choices[0]
    if choice.finish_reason == "stop":
        json.loads(choice.message.content)
    else:
        assert choice.finish_reason == "length" and choice.message.content.lstrip()[:1] in "{[\"-0123456789tfn"


def test_structured_outputs_choice_and_json_schema(client):
    choice = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0.0,
                                       extra_body={"structured_outputs": {"choice": ["yes", "no", "maybe"]}})
    assert choice.choices[0].text in ("yes", "no", "maybe")
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "JSON please"}], max_tokens=32, temperature=0.0,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}})
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content)["ok"], bool)
    with pytest.raises(openai.BadRequestError, match="either response_format or structured_outputs"):
        client.completions.create(model=MODEL, prompt=PROMPT, extra_body={
            "response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a+"}})
    with pytest.raises(openai.BadRequestError, match="structured_outputs"):
        client.completions.create(model=MODEL, prompt=PROMPT, extra_body={"structured_outputs": {}})


def test_metrics_after_traffic(server, client):
    client.completions.create(model=MODEL, prompt=PROMPT, **GREEDY)
    text = httpx.get(f"{server[0]}/metrics", timeout=HANG_GUARD_S).text
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    label = f'{{model_name="{MODEL}"}}'
    assert values[f"mini:generation_tokens_total{label}"] >= 12
    assert values[f"mini:prompt_tokens_total{label}"] > 0
    assert values[f"mini:time_to_first_token_seconds_count{label}"] >= 1
    assert values[f"mini:inter_token_latency_seconds_count{label}"] >= 11
    assert values[f"mini:e2e_request_latency_seconds_count{label}"] >= 1
    assert values[f"mini:num_requests_running{label}"] == 0
    assert f"mini:kv_cache_usage_perc{label}" in values
    assert values[f'mini:request_success_total{{finished_reason="length",model_name="{MODEL}"}}'] >= 1
    stats = asyncio.run(server[1].get_scheduler_stats())
    assert stats.kv_cache_usage == 0.0   # every usable block is free again
