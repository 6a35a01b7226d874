"""Mirrors vllm/entrypoints/generate/beam_search/utils.py: the state of beam search, which vLLM v1 runs at the
entry point (`BeamSearchOfflineMixin.beam_search` in vllm/entrypoints/generate/beam_search/offline.py, the
`LLM.beam_search` that vllm/entrypoints/llm.py's `LLM` inherits).

vLLM v1's engine core knows nothing about beams. `LLM.beam_search` (mini/entrypoints/llm.py) keeps, per
prompt, a `BeamSearchInstance`: the live `beams` and the `completed`
ones. Every step it sends each live beam to the engine as a new one-token request whose prompt is the
beam's tokens (prompt + generated so far), asking for `2 * beam_width` logprobs; `beam_search_step` then
extends each beam by each of those tokens: candidates ending in EOS move to `completed`; the best
`beam_width` of the rest, by `get_beam_search_score`, are the next live beams (phase 06's exercise). The beams of one
prompt share their prefix, so with prefix caching on, each step's requests find that prefix's full KV blocks in the
cache and only prefill the tail: the sharing a V0-style beam search did with copy-on-write blocks, here for free.

The score is vLLM v0.33.0's `get_beam_search_score`: the cumulative logprob divided by
`max(num_generated_tokens, 1) ** length_penalty`, counting the generated tokens and a final EOS (one `logprobs`
entry each), as transformers' `generate(num_beams=...)` does. In older releases vLLM divided by the length of
the whole sequence, prompt included, minus a final EOS (transformers' old `BeamHypotheses.add`): with prompts
of different lengths that ranked beams differently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mini.outputs import Logprob


@dataclass(slots=True)
class BeamSearchSequence:
    """One beam: all its tokens (the prompt included), one logprobs dict per generated token, and the sum
    of the generated tokens' logprobs. `text` is filled in only when the beam is returned.

    `orig_prompt` is the prompt dict the beam came from (its `cache_salt` travels with every step's
    request, as in vLLM's `BeamSearchSequence.get_prompt`). `finish_reason` is "stop" for a beam that ended
    in EOS and "length" for one cut at `max_tokens` (vLLM's LLM.beam_search leaves it None).
    """

    orig_prompt: dict[str, Any]
    tokens: list[int]
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def get_prompt(self) -> dict[str, Any]:
        """The token-id prompt that extends this beam by one token (keeps the original cache_salt)."""
        prompt: dict[str, Any] = {"prompt_token_ids": list(self.tokens)}
        if self.orig_prompt.get("cache_salt") is not None:
            prompt["cache_salt"] = self.orig_prompt["cache_salt"]
        return prompt


@dataclass(slots=True)
class BeamSearchOutput:
    """The result of beam search for one prompt: the best `beam_width` sequences, best first."""

    sequences: list[BeamSearchSequence]


class BeamSearchInstance:
    """The search state of one prompt: the live beams (one, the prompt, at the start) and the completed."""

    __slots__ = ("beams", "completed")

    def __init__(self, prompt: dict[str, Any], prompt_token_ids: list[int]) -> None:
        self.beams: list[BeamSearchSequence] = [BeamSearchSequence(orig_prompt=prompt, tokens=list(prompt_token_ids))]
        self.completed: list[BeamSearchSequence] = []


def get_beam_search_score(num_generated_tokens: int, cumulative_logprob: float, length_penalty: float = 1.0) -> float:
    """cumulative_logprob / max(num_generated_tokens, 1) ** length_penalty (a final EOS counts as generated)."""
    return cumulative_logprob / (max(num_generated_tokens, 1) ** length_penalty)


def create_sort_beams_key_function(length_penalty: float) -> Callable[[BeamSearchSequence], float]:
    """The sort key `LLM.beam_search` ranks beams by (higher is better): one `logprobs` entry per generated token,
    EOS included."""

    def sort_beams_key(beam: BeamSearchSequence) -> float:
        return get_beam_search_score(len(beam.logprobs), beam.cum_logprob, length_penalty)

    return sort_beams_key


def beam_search_step(
    instance: BeamSearchInstance,
    beam_logprobs: list[dict[int, Logprob] | None],
    beam_width: int,
    length_penalty: float,
    eos_token_id: int | None,
) -> None:
    """Advance one prompt's search by one token (the per-instance body of vLLM's `_beam_search_step`).

    `beam_logprobs[i]` is what the engine returned for `instance.beams[i]`: its next token's logprobs dict
    (the sampled token, then the top `2 * beam_width`), or None / {} when nothing came back. Every beam is
    extended by every token of its dict, in that order; a candidate ending in `eos_token_id` is appended to
    `instance.completed` (None: no EOS, `ignore_eos`), the others are ranked by `get_beam_search_score`
    (a stable sort: on equal scores the earlier candidate stays first) and the best `beam_width` become
    `instance.beams`.
    """
    sort_beams_key = create_sort_beams_key_function(length_penalty)
    candidates: list[BeamSearchSequence] = []
    for beam, logprobs in zip(instance.beams, beam_logprobs, strict=False):
        if not logprobs:  # nothing came back (vLLM: the request hit max_model_len or was aborted)
            continue
        for token_id, logprob in logprobs.items():
            candidate = BeamSearchSequence(
                orig_prompt=beam.orig_prompt, tokens=beam.tokens + [token_id], logprobs=beam.logprobs + [logprobs],
                cum_logprob=beam.cum_logprob + logprob.logprob,
            )
            if token_id == eos_token_id:
                instance.completed.append(candidate)
            else:
                candidates.append(candidate)
    instance.beams = sorted(candidates, key=sort_beams_key, reverse=True)[:beam_width]
