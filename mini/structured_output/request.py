"""Mirrors vllm/v1/structured_output/request.py: a request's structured-output state.

`StructuredOutputRequest` holds the spec (`StructuredOutputsParams`) and, once the manager's compile
thread is done, the request's grammar matcher. Until then `grammar` is a `Future`; the scheduler asks
`is_grammar_ready()` and keeps the request in `WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR` (vLLM's
behaviour). A compile that failed on the thread yields a `FailedGrammar`, which rejects every token, so
the request finishes with `FINISHED_ERROR` (finish reason "error") instead of running unconstrained.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mini.sampling_params import SamplingParams, StructuredOutputsParams
    from mini.structured_output.backend_mini import MiniGrammar


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
