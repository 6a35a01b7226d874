"""A request's own chat template: refused unless trusted (vLLM's --trust-request-chat-template), and bounded.

Without the flag, `chat_template` (or `chat_template_kwargs.chat_template`) is a 400 naming `chat_template`,
before anything is rendered. With it, the template renders, on a step budget (`--chat-template-fuel`, vLLM's
VLLM_CHAT_TEMPLATE_FUEL): the issue's 3000 x 3000 nested loop, which froze the server for 34 s, is a 400
naming the budget, and the server answers the next request. The render's wait bound
(`--chat-template-render-timeout`) is tested on the renderer alone, with the step budget switched off.
"""

from __future__ import annotations

import asyncio

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from patience import HANG_GUARD_S

from mini.config import SHIPPED_MODEL_DIR
from mini.engine.async_llm import AsyncLLM
from mini.entrypoints.openai.api_server import build_app, serve_in_thread
from mini.entrypoints.openai.renderer import PromptRenderer, UntrustedChatTemplate
from mini.entrypoints.openai.serve_options import ServeOptions
from mini.entrypoints.template_fuel import TemplateFuelExhausted, run_with_fuel
from mini.tokenizer import load_tokenizer

# Run again with the engine core in-process by scripts/test.sh (`-m engine_modes`): both modes are tested.
pytestmark = pytest.mark.engine_modes

MODEL = "tiny-llama"
MESSAGES = [{"role": "user", "content": "Hi"}]
SHOUTING = "{% for m in messages %}{{ m['content'] | upper }}{% endfor %}"
LOOP_3000_BY_3000 = "{% for i in range(3000) %}{% for j in range(3000) %}x{% endfor %}{% endfor %}"


def chat(url: str, **fields) -> httpx.Response:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2, "temperature": 0.0, **fields}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=HANG_GUARD_S)


@pytest.fixture(scope="module", params=[False, True], ids=["untrusted", "trusted"])
def server(request):
    engine = AsyncLLM.from_engine_args(max_num_seqs=4, max_model_len=64)
    options = ServeOptions(trust_request_chat_template=request.param)
    with serve_in_thread(build_app(engine, MODEL, options=options)) as url:
        yield url, request.param


def test_request_templates_are_refused_unless_trusted(server):
    url, trusted = server
    for fields in ({"chat_template": SHOUTING}, {"chat_template_kwargs": {"chat_template": SHOUTING}}):
        response = chat(url, **fields)
        if trusted:
            assert response.status_code == 200, response.text
            assert response.json()["usage"]["prompt_tokens"] == len(
                load_tokenizer(SHIPPED_MODEL_DIR).encode("HI", add_special_tokens=False))
        else:
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["param"] == "chat_template" and "--trust-request-chat-template" in error["message"]
    assert chat(url).status_code == 200   # the server's own template is always used


def test_a_runaway_request_template_runs_out_of_fuel(server):
    url, trusted = server
    response = chat(url, chat_template=LOOP_3000_BY_3000)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "chat_template"
    assert ("template steps" if trusted else "--trust-request-chat-template") in error["message"]
    assert chat(url).status_code == 200


def test_fuel_counts_template_lines_only():
    assert run_with_fuel(lambda: sum(range(10**5)), fuel=1) == sum(range(10**5))   # plain Python is not counted
    tokenizer = load_tokenizer(SHIPPED_MODEL_DIR)
    with pytest.raises(TemplateFuelExhausted):
        run_with_fuel(lambda: tokenizer.apply_chat_template(MESSAGES, chat_template=LOOP_3000_BY_3000,
                                                            tokenize=False), fuel=1000)


def test_the_render_wait_is_bounded_and_later_renders_do_not_queue_behind():
    tokenizer = load_tokenizer(SHIPPED_MODEL_DIR)
    # fuel off, a wait bound far below the loop's run time: the render is given up, the next one runs at once
    options = ServeOptions(trust_request_chat_template=True, chat_template_fuel=0,
                           chat_template_render_timeout_s=0.01)
    renderer = PromptRenderer(tokenizer, options)
    slow = "{% for i in range(100) %}{% for j in range(3000) %}x{% endfor %}{% endfor %}"

    async def scenario() -> str:
        with pytest.raises(TimeoutError, match="--chat-template-render-timeout"):
            await renderer.render_chat(MESSAGES, slow, True, False, None)
        text, _ = await renderer.render_chat(MESSAGES, None, True, False, None)
        return text

    try:
        assert asyncio.run(scenario()) == "user: Hi\nassistant:"
    finally:
        renderer.shutdown()
    with pytest.raises(UntrustedChatTemplate):
        PromptRenderer(tokenizer, ServeOptions()).check_template_trust(None, {"chat_template": "x"})
