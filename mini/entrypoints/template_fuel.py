"""Run a chat template with a budget of template steps ("fuel"), so a hostile template ends instead of spinning.

Mirrors the intent of vLLM's `VLLM_CHAT_TEMPLATE_FUEL` (vllm/envs.py: a request-supplied template may execute
at most 500,000 template instructions, in vLLM's Rust front end; the server's own template has no limit).
Jinja's sandbox (which transformers renders chat templates in) stops a template from touching Python objects,
not from looping: `{% for i in range(3000) %}{% for j in range(3000) %}...` is nine million legal steps.

mini counts the lines that template code executes: Jinja compiles a template to Python functions whose code
comes from the file `<template>`, so a trace function on the rendering thread counts those lines only and
raises `TemplateFuelExhausted` inside the template once the budget is spent. The exception unwinds the
template like any rendering error; nothing of the render is kept. Tracing costs time on the rendering thread
only (other threads are not traced), and only while a request's own template renders.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

JINJA_CODE_FILENAME = "<template>"
DEFAULT_TEMPLATE_FUEL = 500_000     # vLLM's VLLM_CHAT_TEMPLATE_FUEL default

T = TypeVar("T")


class TemplateFuelExhausted(RuntimeError):
    """A chat template ran more steps than its budget."""


def run_with_fuel(render: Callable[[], T], fuel: int) -> T:
    """`render()` with at most `fuel` template lines executed on this thread (fuel <= 0: no limit)."""
    if fuel <= 0:
        return render()
    remaining = [fuel]

    def count_line(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            remaining[0] -= 1
            if remaining[0] < 0:
                raise TemplateFuelExhausted(
                    f"the chat template ran more than {fuel} template steps (a request-supplied template "
                    f"may run at most {fuel}; see --chat-template-fuel)")
        return count_line

    def on_call(frame: Any, event: str, arg: Any) -> Any:
        return count_line if frame.f_code.co_filename == JINJA_CODE_FILENAME else None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        return render()
    finally:
        sys.settrace(previous)
