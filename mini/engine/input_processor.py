"""Mirrors vllm/v1/engine/input_processor.py (`InputProcessor.process_inputs`): user prompt -> EngineCoreRequest.

(Older vLLM releases called the file `v1/engine/processor.py` and the class `Processor`. In v0.33.0 the
tokenizing itself is done before it, by the renderer, vllm/renderers/; mini does both here.)

Everything that can be wrong with a request is found here, before any engine state changes: the
prompt's form, an empty or too long prompt, token ids outside the vocabulary, and sampling parameters
that name tokens the model does not have. Then the text is tokenized (as vLLM: `tokenizer.encode(text)`
with the tokenizer's own special-token handling) and the user's SamplingParams are cloned, so that
the engine can fill in per-request fields (EOS, max_tokens) without touching the caller's object.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from mini.engine import EngineCoreRequest
from mini.sampling_params import SamplingParams
from mini.structured_output import validate_structured_outputs

PROMPT_FORMS = 'a str, {"prompt": str} or {"prompt_token_ids": list[int]} (dicts may add "cache_salt": str)'
# vLLM's default cap on how many logprobs a request may ask for (ModelConfig.max_logprobs).
DEFAULT_MAX_LOGPROBS = 20


def _first_out_of_vocab(token_ids: Iterable[int], vocab_size: int) -> int | None:
    for token_id in token_ids:
        if not 0 <= token_id < vocab_size:
            return token_id
    return None


class InputProcessor:
    """Validates and tokenizes requests for one model (its tokenizer, vocabulary size and context length)."""

    def __init__(
        self, tokenizer: Any | None, vocab_size: int, max_model_len: int, eos_token_id: int | None = None,
        max_logprobs: int = DEFAULT_MAX_LOGPROBS, lora_checker: Any | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.eos_token_id = eos_token_id
        self.max_logprobs = vocab_size if max_logprobs == -1 else max_logprobs
        # LoRA: the adapter checker (mini/lora/peft_helper.py `AdapterChecker`), None when enable_lora is off.
        self.lora_checker = lora_checker

    def process(
        self, request_id: str, prompt: Any, params: SamplingParams, arrival_time: float | None = None,
        priority: int = 0, lora_request: Any | None = None,
    ) -> EngineCoreRequest:
        """Validate, tokenize, clone the params -> EngineCoreRequest. Raises before changing anything."""
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a mini.SamplingParams, got {type(params).__name__}")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise TypeError(f"priority must be an int, got {type(priority).__name__} {priority!r}")
        if arrival_time is not None and not isinstance(arrival_time, (int, float)):
            raise TypeError(f"arrival_time must be a float (seconds) or None, got {type(arrival_time).__name__}")
        self._validate_lora(lora_request)
        cache_salt = self._cache_salt(prompt)
        prompt_text, prompt_token_ids = self._tokenize(prompt)
        self._validate_prompt(prompt_token_ids)
        self._validate_params(params)
        params = params.clone()
        params.update_from_eos(self.eos_token_id)
        if params.bad_words:
            params.update_from_tokenizer(self.tokenizer)
        if params.max_tokens is None:  # as vLLM: fill the context
            params.max_tokens = self.max_model_len - len(prompt_token_ids)
        return EngineCoreRequest(
            request_id=request_id, prompt=prompt_text, prompt_token_ids=prompt_token_ids,
            sampling_params=params, eos_token_id=self.eos_token_id,
            arrival_time=time.time() if arrival_time is None else float(arrival_time), priority=priority,
            cache_salt=cache_salt, lora_request=lora_request,
        )

    def _validate_lora(self, lora_request: Any | None) -> None:
        """A request's adapter must exist and fit the base model (vLLM: `InputProcessor._validate_lora`)."""
        if lora_request is None:
            return
        if self.lora_checker is None:
            raise ValueError(f"lora_request {getattr(lora_request, 'lora_name', lora_request)!r} was given but LoRA "
                             "is not enabled: start the engine with enable_lora=True (--enable-lora)")
        self.lora_checker.check(lora_request)

    @staticmethod
    def _cache_salt(prompt: Any) -> str | None:
        """The prompt dict's "cache_salt" (vLLM: TextPrompt / TokensPrompt `cache_salt`), or None."""
        if not isinstance(prompt, dict) or prompt.get("cache_salt") is None:
            return None
        cache_salt = prompt["cache_salt"]
        if not isinstance(cache_salt, str) or not cache_salt:
            raise TypeError(f"cache_salt must be a non-empty str, got {cache_salt!r}")
        return cache_salt

    def _tokenize(self, prompt: Any) -> tuple[str | None, list[int]]:
        """-> (prompt text or None, prompt token ids)."""
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                token_ids = prompt["prompt_token_ids"]
                if not isinstance(token_ids, (list, tuple)) or not all(
                    isinstance(t, int) and not isinstance(t, bool) for t in token_ids
                ):
                    raise TypeError(f"prompt_token_ids must be a list of ints, got {token_ids!r}")
                text = prompt.get("prompt")
                return (text if isinstance(text, str) else None), list(token_ids)
            if "prompt" in prompt:
                prompt = prompt["prompt"]
                if not isinstance(prompt, str):
                    raise TypeError(f'{{"prompt": ...}} must hold a str, got {type(prompt).__name__}')
            else:
                raise TypeError("a prompt dict needs the key 'prompt' or 'prompt_token_ids'; "
                                f"prompts are {PROMPT_FORMS}")
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be {PROMPT_FORMS}, got {type(prompt).__name__}")
        if self.tokenizer is None:
            raise ValueError(
                "text prompts need a tokenizer, but this engine has none (skip_tokenizer_init=True); "
                'pass {"prompt_token_ids": [...]} instead'
            )
        if prompt == "":
            raise ValueError("prompt must not be empty (got an empty string)")
        return prompt, list(self.tokenizer.encode(prompt))

    def _validate_prompt(self, prompt_token_ids: list[int]) -> None:
        if len(prompt_token_ids) == 0:
            raise ValueError("prompt must not be empty: prompt_token_ids has no tokens")
        bad_id = _first_out_of_vocab(prompt_token_ids, self.vocab_size)
        if bad_id is not None:
            raise ValueError(
                f"prompt token id {bad_id} is out of vocabulary: ids must be in [0, vocab_size={self.vocab_size})"
            )
        if len(prompt_token_ids) > self.max_model_len:
            raise ValueError(
                f"prompt (length {len(prompt_token_ids)}) is longer than the maximum model length "
                f"max_model_len={self.max_model_len}"
            )

    def _validate_params(self, params: SamplingParams) -> None:
        """The checks that need the model (vLLM: SamplingParams.verify)."""
        fields = {
            "stop_token_ids": params.stop_token_ids or [],
            "allowed_token_ids": params.allowed_token_ids or [],
            "logit_bias": list(params.logit_bias or {}),
        }
        for name, token_ids in fields.items():
            bad_id = _first_out_of_vocab(token_ids, self.vocab_size)
            if bad_id is not None:
                raise ValueError(
                    f"{name} contains token id {bad_id}, out of vocabulary: ids must be in "
                    f"[0, vocab_size={self.vocab_size})"
                )
        for name in ("logprobs", "prompt_logprobs"):
            requested = getattr(params, name)
            if requested == -1:
                requested = self.vocab_size
            if requested is not None and requested > self.max_logprobs:
                raise ValueError(f"{name}={requested} is more than the maximum allowed, {self.max_logprobs}")
        if params.bad_words and self.tokenizer is None:
            raise ValueError("bad_words need a tokenizer, but this engine has none (skip_tokenizer_init=True)")
        if params.structured_outputs is not None:  # structured output: parse + check the spec now, compile later
            if self.tokenizer is None:
                raise ValueError("structured_outputs need a tokenizer, but this engine has none "
                                 "(skip_tokenizer_init=True)")
            validate_structured_outputs(params.structured_outputs)
