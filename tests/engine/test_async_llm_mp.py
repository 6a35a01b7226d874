"""AsyncLLM in multiprocess mode (mini/engine/async_llm.py over an AsyncMPClient), vLLM's design: an output-handler
task, no engine thread. Greedy streams match the in-process client's (the core stepped on a thread) token for token;
bad input is refused before anything is queued; a dead core fails every open stream with EngineDeadError.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading

import httpx
import pytest
from patience import HANG_GUARD_S

from mini.engine.async_llm import AsyncLLM, EngineDeadError
from mini.engine.core_client import AsyncInprocClient, AsyncMPClient
from mini.entrypoints.openai.api_server import build_app, serve_in_thread
from mini.sampling_params import RequestOutputKind, SamplingParams

MODEL = "tiny-llama"
SAFETY_S = HANG_GUARD_S
PROMPTS = [f"{start} {i}" for i, start in enumerate(["Once upon a time", "The little dog", "A cat sat on the",
                                                      "Tom and Sue went"] * 4)]   # 16 requests
MAX_TOKENS = 10


def greedy(max_tokens: int = MAX_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                          output_kind=RequestOutputKind.DELTA)


async def _tokens(engine: AsyncLLM) -> list[list[int]]:
    async def one(i: int, prompt: str) -> list[int]:
        return [t async for out in engine.generate(prompt, greedy(), f"r{i}") for t in out.outputs[0].token_ids]

    return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(PROMPTS))))


def _streams(engine: AsyncLLM) -> list[list[int]]:
    try:
        return asyncio.run(asyncio.wait_for(_tokens(engine), SAFETY_S))
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def inproc_tokens() -> list[list[int]]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "0")
        engine = AsyncLLM(None)
        assert isinstance(engine.engine_core, AsyncInprocClient)   # the core stepped on a thread here
        return _streams(engine)


def test_16_streams_match_the_inproc_design_token_for_token(monkeypatch, inproc_tokens):
    monkeypatch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "1")
    engine = AsyncLLM(None)
    assert isinstance(engine.engine_core, AsyncMPClient)
    assert all(len(tokens) == MAX_TOKENS for tokens in inproc_tokens)
    assert _streams(engine) == inproc_tokens
    assert engine.output_handler is not None   # the task that read every output


def test_server_runs_the_output_handler_design(monkeypatch, inproc_tokens):
    """The OpenAI server's engine: no engine thread, an AsyncMPClient; its 16 streams give the inproc text."""
    monkeypatch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "1")
    engine = AsyncLLM.from_engine_args(max_num_seqs=16)
    assert isinstance(engine.engine_core, AsyncMPClient)
    tokenizer = engine.tokenizer

    async def stream(client: httpx.AsyncClient, prompt: str) -> str:
        text = ""
        body = {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0,
                "ignore_eos": True, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    text += json.loads(line.removeprefix("data: "))["choices"][0]["text"]
        return text

    async def main(url: str) -> list[str]:
        async with httpx.AsyncClient(base_url=url, timeout=SAFETY_S) as client:
            return list(await asyncio.gather(*(stream(client, p) for p in PROMPTS)))

    with serve_in_thread(build_app(engine, MODEL)) as url:
        texts = asyncio.run(main(url))
        assert not [t for t in threading.enumerate() if t.name == "mini-engine-loop"]   # no engine thread
        assert engine.output_handler is not None and not engine.output_handler.done()
        stats = asyncio.run(engine.get_scheduler_stats())   # a utility call to the core, from another loop
        assert stats.num_running_reqs == 0 and stats.kv_cache_usage == 0.0
    assert not engine.is_running
    assert texts == [tokenizer.decode(tokens) for tokens in inproc_tokens]


def test_bad_input_is_refused_before_anything_is_queued(monkeypatch):
    monkeypatch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "1")
    engine = AsyncLLM(None)

    async def main() -> None:
        with pytest.raises(ValueError, match="max_model_len"):
            async for _ in engine.generate({"prompt_token_ids": [1] * 100_000}, greedy(), "too-long"):
                pass
        with pytest.raises(TypeError, match="sampling_params"):
            async for _ in engine.generate("Hi", {"max_tokens": 3}, "bad-params"):
                pass
        assert not engine.output_processor.has_request("too-long")
        assert (await engine.get_scheduler_stats()).num_waiting_reqs == 0

    try:
        asyncio.run(asyncio.wait_for(main(), SAFETY_S))
    finally:
        engine.shutdown()


def test_a_dead_core_fails_every_open_stream(monkeypatch):
    monkeypatch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "1")
    engine = AsyncLLM(None)
    pid = engine.engine_core.pid

    async def main() -> list[BaseException | None]:
        started = asyncio.Event()

        async def one(i: int) -> BaseException | None:
            try:
                async for _ in engine.generate(PROMPTS[i], greedy(max_tokens=10_000), f"d{i}"):
                    started.set()
            except EngineDeadError as error:
                return error
            return None

        tasks = [asyncio.create_task(one(i)) for i in range(4)]
        await started.wait()
        os.kill(pid, signal.SIGKILL)
        return list(await asyncio.gather(*tasks))

    try:
        errors = asyncio.run(asyncio.wait_for(main(), SAFETY_S))
        assert all(isinstance(error, EngineDeadError) for error in errors), errors
        assert engine.errored and not engine.is_running
    finally:
        engine.shutdown()
