"""Mirrors vllm/v1/structured_output/__init__.py: the StructuredOutputManager.

The engine owns one manager. Its jobs, in vLLM's order:

- `grammar_init(request)` (at add_request): submit the compilation to a worker thread and leave the
  request in `WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR`; the scheduler holds it out of its waiting queue
  until `is_grammar_ready()` (`Scheduler.promote_ready_grammars`, after every step).
- `grammar_bitmask(requests, scheduler_output)` (every step, after schedule): one packed int32 row
  `[ceil(vocab / 32)]` per scheduled constrained request; the model runner applies it to the logits
  before sampling (`BitmaskApplier`, bitmask.py), as vLLM's `GPUModelRunner` does.
- accepting tokens (in the scheduler's update_from_output): each sampled token goes to the request's
  grammar, which answers with a verdict (`StructuredOutputRequest.accept_token`, request.py); the scheduler
  alone turns a refusal into `FINISHED_ERROR` (finish reason "error", vLLM's status when its grammar rejects
  a token) and a completed grammar into a stop. mini's choice: the refused token is not emitted (vLLM has
  already appended it when `accept_tokens` fails).

Preemption needs nothing special: the FSM state advances only with accepted output tokens, which a
preempted request keeps, so it resumes exactly where it was. See README "Structured output".
"""

from __future__ import annotations

import concurrent.futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from mini.structured_output.backend_mini import MiniBackend, MiniGrammar, build_checked_nfa, spec_key
from mini.structured_output.json_schema import check_json_nesting
from mini.structured_output.request import GrammarVerdict, StructuredOutputRequest
from mini.structured_output.token_index import bitmask_words

if TYPE_CHECKING:
    from mini.core.request import Request
    from mini.core.sched.output import SchedulerOutput
    from mini.sampling_params import StructuredOutputsParams

__all__ = ["GrammarOutput", "GrammarVerdict", "StructuredOutputManager", "StructuredOutputRequest",
           "validate_structured_outputs"]


def validate_structured_outputs(params: StructuredOutputsParams) -> None:
    """Parse the spec and check its language is not empty; ValueError naming the field (no state kept).

    A schema nested deeper than vLLM's MAX_STRUCTURED_OUTPUT_JSON_NESTING is refused first (as vLLM's
    `check_json_nesting`), before anything recurses over it.
    """
    if params.kind == "json":
        check_json_nesting(params.json)
    kind, spec = spec_key(params)
    try:
        build_checked_nfa(kind, spec)
    except ValueError as error:
        message = str(error)
        if not message.startswith("structured_outputs"):
            message = f"structured_outputs.{kind}: {message}"
        raise ValueError(message) from None


@dataclass(slots=True)
class GrammarOutput:
    """vLLM's GrammarOutput: which requests are constrained this step and their mask rows, in order."""

    structured_output_request_ids: list[str]
    grammar_bitmask: np.ndarray  # int32 [len(ids), ceil(vocab / 32)]


class StructuredOutputManager:
    """Compiles grammars off the step loop and builds each step's bitmask."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_id: int | None, max_workers: int = 1,
                 config: Any = None) -> None:
        self.vocab_size = vocab_size
        self.backend = None if tokenizer is None else MiniBackend(tokenizer, vocab_size, eos_token_id, config)
        self.executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="mini-grammar")
        self._pending: set[concurrent.futures.Future] = set()

    def grammar_init(self, request: Request) -> None:
        """Start compiling `request`'s grammar on the worker thread."""
        so_request = request.structured_output_request
        if so_request is None:
            return
        if self.backend is None:
            raise ValueError("structured_outputs need a tokenizer, but this engine has none")
        kind, spec = spec_key(so_request.params)
        backend = self.backend
        future = self.executor.submit(lambda: MiniGrammar(backend.compile_grammar(kind, spec)))
        so_request.grammar = future
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)

    def wait_for_compilation(self, timeout: float) -> None:
        """Block up to `timeout` s until some grammar finishes compiling (the engine calls it on a step that
        scheduled nothing: busy-stepping would only take the GIL from the pure-Python compile thread)."""
        pending = list(self._pending)
        if pending:
            concurrent.futures.wait(pending, timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED)

    def grammar_bitmask(self, requests: dict[str, Request], scheduler_output: SchedulerOutput
                        ) -> GrammarOutput | None:
        """Mask rows for the scheduled constrained requests (None when there are none)."""
        ids = [req_id for req_id in scheduler_output.num_scheduled_tokens
               if req_id in requests and requests[req_id].structured_output_request is not None]
        if not ids:
            return None
        bitmask = np.full((len(ids), bitmask_words(self.vocab_size)), -1, dtype=np.int32)
        for row, req_id in enumerate(ids):
            grammar = requests[req_id].structured_output_request.grammar
            # A terminated or dead grammar keeps the all-ones row: its next token is refused (accept_token).
            if isinstance(grammar, MiniGrammar) and not grammar.is_terminated() and not grammar.is_dead_end():
                grammar.fill_bitmask(bitmask, row)
        return GrammarOutput(structured_output_request_ids=ids, grammar_bitmask=bitmask)

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
