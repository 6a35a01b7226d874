"""Mirrors vllm/v1/structured_output/request.py: a request's structured-output state.

`StructuredOutputRequest` holds the spec (`StructuredOutputsParams`) and, once the manager's compile
thread is done, the request's grammar matcher. Until then `grammar` is a `Future`; the scheduler asks
`is_grammar_ready()` and keeps the request in `WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR` (vLLM's
behaviour). A compile that failed on the thread yields a `FailedGrammar`, which rejects every token.

The grammar answers, the scheduler decides: `accept_token` feeds one sampled token to the matcher and
returns a `GrammarVerdict` (taken; taken and the grammar is complete; refused). Only the scheduler turns
a verdict into a request status (vllm/v1/core/sched/scheduler.py `update_from_output`: a refused token
finishes the request with `FINISHED_ERROR`, finish reason "error").
"""

from __future__ import annotations

import enum
from concurrent.futures import Future
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mini.sampling_params import SamplingParams, StructuredOutputsParams
    from mini.structured_output.backend_mini import MiniGrammar


class GrammarVerdict(enum.Enum):
    """What a request's grammar says of one sampled token."""

    ACCEPTED = enum.auto()  # taken; more tokens may follow
    COMPLETED = enum.auto()  # taken, and the grammar is complete (it took EOS): the request can stop here
    REJECTED = enum.auto()  # not taken: no continuation of the grammar starts with it (or no grammar)


class FailedGrammar:
    """Stands in for a grammar whose compilation raised: nothing is allowed."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def accept_tokens(self, token_ids: list[int]) -> bool:
        return False

    def is_terminated(self) -> bool:
        return False

    def is_dead_end(self) -> bool:
        return True


class StructuredOutputRequest:
    """The spec plus the (future) grammar of one request."""

    __slots__ = ("_grammar", "params")

    def __init__(self, params: StructuredOutputsParams) -> None:
        self.params = params
        self._grammar: Future | MiniGrammar | FailedGrammar | None = None

    @classmethod
    def from_sampling_params(cls, sampling_params: SamplingParams | None) -> StructuredOutputRequest | None:
        params = getattr(sampling_params, "structured_outputs", None)
        return None if params is None else cls(params)

    @property
    def grammar(self) -> MiniGrammar | FailedGrammar | None:
        """The matcher once compiled (None while compiling or before grammar_init)."""
        if isinstance(self._grammar, Future):
            if not self._grammar.done():
                return None
            error = self._grammar.exception()
            self._grammar = FailedGrammar(error) if error is not None else self._grammar.result()
        return self._grammar

    @grammar.setter
    def grammar(self, value: Future | MiniGrammar | FailedGrammar) -> None:
        self._grammar = value

    def is_grammar_ready(self) -> bool:
        return self.grammar is not None

    def accept_token(self, token_id: int) -> GrammarVerdict:
        """Feed one sampled token to the matcher (vLLM: `StructuredOutputManager.accept_tokens`, which asks the
        grammar's `accept_tokens`; the scheduler reads `is_terminated` through COMPLETED here)."""
        grammar = self.grammar
        if grammar is None or not grammar.accept_tokens([token_id]):
            return GrammarVerdict.REJECTED
        return GrammarVerdict.COMPLETED if grammar.is_terminated() else GrammarVerdict.ACCEPTED

    def rejection_reason(self, token_id: int) -> str:
        """Why `accept_token(token_id)` said REJECTED (the request's stop_reason)."""
        grammar = self.grammar
        if grammar is None:
            return "structured output: token sampled before the grammar was compiled"
        if isinstance(grammar, FailedGrammar):
            return f"structured output: grammar compilation failed: {grammar.error}"
        return f"structured output: no token can continue the grammar here (token {token_id} refused)"
