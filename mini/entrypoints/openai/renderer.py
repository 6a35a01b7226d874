"""Tokenizing prompts and rendering chat templates for the server, on a worker thread, never on the event loop.

Mirrors vllm/renderers/hf.py (`HfRenderer`: its executor of `renderer_num_workers` threads, default 1, and
`_render_with_timeout`, which bounds a render by VLLM_CHAT_TEMPLATE_RENDER_TIMEOUT and replaces the executor
when a render overstays, so later renders do not queue behind it). Tokenizing a 5 MB prompt takes seconds
(Hugging Face's tokenizers release the GIL meanwhile), a chat template may loop: on the event loop either
would freeze every stream and /health.

A request's own `chat_template` (or `chat_template_kwargs["chat_template"]`) is refused unless the server
trusts request templates (vLLM's `--trust-request-chat-template`, vllm/entrypoints/pooling/base/io_processor.py
`_validate_chat_template`); a trusted one also runs on a step budget (mini/entrypoints/template_fuel.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from mini.entrypoints.chat_utils import apply_chat_template
from mini.entrypoints.openai.serve_options import ServeOptions
from mini.entrypoints.template_fuel import run_with_fuel

T = TypeVar("T")


class UntrustedChatTemplate(ValueError):
    """A request brought its own chat template and the server does not run request templates."""


class PromptRenderer:
    """One worker thread that tokenizes and renders for the server's handlers."""

    def __init__(self, tokenizer: Any, options: ServeOptions) -> None:
        self.tokenizer = tokenizer
        self.options = options
        self._executor = self._new_executor()

    @staticmethod
    def _new_executor() -> concurrent.futures.ThreadPoolExecutor:
        return concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mini-renderer")

    async def _run(self, work: Callable[[], T], timeout_s: float | None = None) -> T:
        future = asyncio.get_running_loop().run_in_executor(self._executor, work)
        if not timeout_s:
            return await future
        try:
            return await asyncio.wait_for(future, timeout_s)
        except asyncio.TimeoutError:
            stuck, self._executor = self._executor, self._new_executor()   # later work does not wait behind it
            stuck.shutdown(wait=False, cancel_futures=True)
            raise TimeoutError(f"the chat template did not render within {timeout_s:g} s "
                               "(see --chat-template-render-timeout)") from None

    async def encode(self, text: str) -> list[int]:
        """The prompt's token ids (with the tokenizer's special tokens, as the engine adds them)."""
        return await self._run(lambda: list(self.tokenizer.encode(text)))

    def check_template_trust(self, chat_template: str | None, chat_template_kwargs: dict[str, Any] | None) -> None:
        brought = chat_template is not None or bool(chat_template_kwargs and
                                                     chat_template_kwargs.get("chat_template") is not None)
        if brought and not self.options.trust_request_chat_template:
            raise UntrustedChatTemplate(
                "the request brings its own chat_template, and this server does not run request templates: "
                "start it with --trust-request-chat-template to allow them")

    async def render_chat(self, conversation: list[dict[str, str]], chat_template: str | None,
                          add_generation_prompt: bool, continue_final_message: bool,
                          chat_template_kwargs: dict[str, Any] | None) -> tuple[str, list[int]]:
        """-> (prompt text, its token ids). A request's own template runs on the step budget."""
        self.check_template_trust(chat_template, chat_template_kwargs)
        kwargs = dict(chat_template_kwargs or {})
        request_template = chat_template if chat_template is not None else kwargs.pop("chat_template", None)
        render = functools.partial(apply_chat_template, self.tokenizer, conversation, chat_template=request_template,
                                   add_generation_prompt=add_generation_prompt,
                                   continue_final_message=continue_final_message, chat_template_kwargs=kwargs)
        fuel = self.options.chat_template_fuel if request_template is not None else 0

        def work() -> tuple[str, list[int]]:
            text = run_with_fuel(render, fuel)
            return text, list(self.tokenizer.encode(text, add_special_tokens=False))

        return await self._run(work, self.options.chat_template_render_timeout_s)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
