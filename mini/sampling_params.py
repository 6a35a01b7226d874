"""Mirrors vllm/sampling_params.py: the user-facing knobs of one generation request.

Same field names and defaults as vLLM's `SamplingParams`. `__post_init__` normalizes the fields the way
vLLM does (`stop` str -> list, `top_k=-1` accepted as "off", `seed=-1` -> None, greedy when the
temperature is ~0) and then validates them like vLLM's `_verify_args`. Every invalid field raises `ValueError` naming
the field and what is allowed, a value of the wrong type (`stop=123`, `temperature="hot"`) included: vLLM raises
`ValueError` for bad sampling parameters, and so does its OpenAI server's request validation.

Checks that need the model's vocabulary (token ids < vocab_size) live in
`mini/engine/input_processor.py`, as vLLM runs them in `SamplingParams.verify` at request time.
"""

# ruff: noqa: TRY004  (a wrong type is a bad value here: ValueError, as vLLM raises)
from __future__ import annotations

import copy
import enum
import math
from dataclasses import dataclass, field
from typing import Any

# Below this temperature the request is greedy (vLLM's _SAMPLING_EPS).
SAMPLING_EPS = 1e-5
# Temperatures in (0, MIN_TEMPERATURE) are raised to it to avoid inf/nan logits (vLLM's _MAX_TEMP).
MIN_TEMPERATURE = 1e-2
# logit_bias values are clamped into this range, as in vLLM.
LOGIT_BIAS_LIMIT = 100.0


class RequestOutputKind(enum.Enum):
    """What each RequestOutput carries: everything so far, only the new part, or only the final result."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _require_int(name: str, value: object, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not _is_int(value):
        allowed = "an int or None" if optional else "an int"
        raise ValueError(f"{name} must be {allowed}, got {type(value).__name__} {value!r}")


def _require_number(name: str, value: object) -> None:
    if not _is_number(value):
        raise ValueError(f"{name} must be a number (int or float), got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")


def _require_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {type(value).__name__} {value!r}")


def _require_int_list(name: str, value: object) -> list[int]:
    if not isinstance(value, (list, tuple)) or not all(_is_int(v) for v in value):
        raise ValueError(f"{name} must be a list of ints, got {value!r}")
    return list(value)


def _require_str_list(name: str, value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{name} must be a str or a list of str, got {value!r}")
    return list(value)


# ---- structured output: the request's format constraint, checked again at add_request
STRUCTURED_OUTPUT_KINDS = ("regex", "json", "choice", "json_object")


@dataclass(slots=True)
class StructuredOutputsParams:
    """Mirrors vllm/sampling_params.py `StructuredOutputsParams`: exactly one of the four kinds.

    regex: the whole output must match (anchors implied); json: a JSON schema (dict or JSON text);
    choice: the output is one of these strings; json_object=True: any JSON value (to a fixed depth).
    The pattern / schema itself is compiled and checked at `add_request` (mini/structured_output/).
    """

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    json_object: bool | None = None

    def __post_init__(self) -> None:
        if self.json_object is not None and not isinstance(self.json_object, bool):
            raise ValueError(
                f"structured_outputs.json_object must be True, False or None, got {self.json_object!r}")
        given = [kind for kind in STRUCTURED_OUTPUT_KINDS if getattr(self, kind) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"structured_outputs needs exactly one of {', '.join(STRUCTURED_OUTPUT_KINDS)}, "
                             f"got {given or 'none'}")
        if self.regex is not None and not isinstance(self.regex, str):
            raise ValueError(f"structured_outputs.regex must be a str, got {type(self.regex).__name__}")
        if self.json is not None and not isinstance(self.json, (str, dict)):
            raise ValueError(
                f"structured_outputs.json must be a schema dict or JSON text, got {type(self.json).__name__}")
        if self.choice is not None:
            if not isinstance(self.choice, (list, tuple)) or not self.choice or \
                    not all(isinstance(c, str) and c for c in self.choice):
                raise ValueError(
                    f"structured_outputs.choice must be a non-empty list of non-empty str, got {self.choice!r}")
            self.choice = list(self.choice)

    @property
    def kind(self) -> str:
        """Which constraint this is: one of STRUCTURED_OUTPUT_KINDS."""
        return next(kind for kind in STRUCTURED_OUTPUT_KINDS if getattr(self, kind) not in (None, False))


@dataclass(slots=True)
class SamplingParams:
    """Sampling parameters for one request (names, defaults and checks as vLLM's)."""

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    detokenize: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    extra_args: dict[str, Any] | None = None
    structured_outputs: StructuredOutputsParams | None = None  # structured output: regex / json / choice / json_object

    # Set in __post_init__ / by the engine; not constructor arguments.
    output_text_buffer_length: int = field(default=0, init=False)
    _eos_token_id: int | None = field(default=None, init=False, repr=False)
    _all_stop_token_ids: set[int] = field(default_factory=set, init=False, repr=False)
    _bad_words_token_ids: list[list[int]] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._normalize()
        self._verify_args()
        if self.temperature < SAMPLING_EPS:
            # Zero temperature means greedy: the other sampling knobs are switched off.
            self.top_p = 1.0
            self.top_k = 0
            self.min_p = 0.0
            if self.n > 1:
                raise ValueError(f"n must be 1 when using greedy sampling (temperature=0), got {self.n}")
        elif self.temperature < MIN_TEMPERATURE:
            self.temperature = MIN_TEMPERATURE
        self._all_stop_token_ids = set(self.stop_token_ids)

    def _normalize(self) -> None:
        """Type checks plus vLLM's normalizations, before any range check."""
        _require_int("n", self.n)
        for name in ("presence_penalty", "frequency_penalty", "repetition_penalty", "temperature",
                     "top_p", "min_p"):
            _require_number(name, getattr(self, name))
        _require_int("top_k", self.top_k)
        if self.top_k == -1:  # vLLM quietly accepts -1 as "off" but prefers 0
            self.top_k = 0
        _require_int("seed", self.seed, optional=True)
        if self.seed == -1:
            self.seed = None
        _require_int("max_tokens", self.max_tokens, optional=True)
        _require_int("min_tokens", self.min_tokens)
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is True:  # vLLM: logprobs=True means 1
                setattr(self, name, 1)
            _require_int(name, getattr(self, name), optional=True)
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens", "detokenize"):
            _require_bool(name, getattr(self, name))
        self.stop = [] if self.stop is None else _require_str_list("stop", self.stop)
        self.stop_token_ids = ([] if self.stop_token_ids is None
                               else list(dict.fromkeys(_require_int_list("stop_token_ids", self.stop_token_ids))))
        self.bad_words = ([] if self.bad_words is None
                          else list(dict.fromkeys(_require_str_list("bad_words", self.bad_words))))
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = _require_int_list("allowed_token_ids", self.allowed_token_ids)
        if self.logit_bias is not None:
            self.logit_bias = self._normalized_logit_bias(self.logit_bias)
        if not isinstance(self.output_kind, RequestOutputKind):
            raise ValueError(
                f"output_kind must be a RequestOutputKind ({', '.join(k.name for k in RequestOutputKind)}), "
                f"got {self.output_kind!r}"
            )
        structured = self.structured_outputs
        if structured is not None and not isinstance(structured, StructuredOutputsParams):
            raise ValueError("structured_outputs must be a StructuredOutputsParams or None, got "
                             f"{type(self.structured_outputs).__name__}")
        if self.extra_args is not None and not isinstance(self.extra_args, dict):
            raise ValueError(f"extra_args must be a dict or None, got {type(self.extra_args).__name__}")
        # Characters held back from streamed text until we know they do not start a stop string.
        if self.stop and not self.include_stop_str_in_output:
            self.output_text_buffer_length = max(len(s) for s in self.stop) - 1

    @staticmethod
    def _normalized_logit_bias(logit_bias: object) -> dict[int, float]:
        if not isinstance(logit_bias, dict):
            raise ValueError(f"logit_bias must be a dict[int, float] or None, got {type(logit_bias).__name__}")
        normalized: dict[int, float] = {}
        for token, bias in logit_bias.items():
            try:  # OpenAI clients send token ids as strings; vLLM converts them
                token_id = int(token)
            except (TypeError, ValueError):
                raise ValueError(f"logit_bias keys must be token ids (int), got {token!r}") from None
            _require_number(f"logit_bias[{token_id}]", bias)
            normalized[token_id] = min(LOGIT_BIAS_LIMIT, max(-LOGIT_BIAS_LIMIT, float(bias)))
        return normalized

    def _verify_args(self) -> None:  # noqa: C901 - a flat list of field checks, as vLLM's SamplingParams._verify_args
        """Range checks, as vLLM's SamplingParams._verify_args."""
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise ValueError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise ValueError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if self.repetition_penalty <= 0.0:
            raise ValueError(f"repetition_penalty must be greater than zero, got {self.repetition_penalty}")
        if self.temperature < 0.0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be 0 or -1 (disable), or at least 1, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be greater than or equal to 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, got {self.min_tokens}"
            )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and value != -1 and value < 0:
                raise ValueError(f"{name} must be non-negative or -1 (whole vocabulary), got {value}")
        if any(token_id < 0 for token_id in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative token ids, got {self.stop_token_ids}")
        if any(not stop_str for stop_str in self.stop):
            raise ValueError(f"stop cannot contain an empty string, got {self.stop!r}")
        if self.stop and not self.detokenize:
            raise ValueError("stop strings are only supported when detokenize is True; set detokenize=True")
        if any(not word for word in self.bad_words):
            raise ValueError(f"bad_words cannot contain an empty string, got {self.bad_words!r}")
        if self.allowed_token_ids is not None and len(self.allowed_token_ids) == 0:
            raise ValueError("allowed_token_ids must be None or a non-empty list of token ids, got []")

    @property
    def eos_token_id(self) -> int | None:
        """The EOS id that stops this request (None with ignore_eos); set by the input processor."""
        return self._eos_token_id

    @property
    def all_stop_token_ids(self) -> set[int]:
        """stop_token_ids plus EOS (EOS is added even with ignore_eos: min_tokens must still mask it)."""
        return self._all_stop_token_ids

    @property
    def bad_words_token_ids(self) -> list[list[int]] | None:
        """Token-id sequences of `bad_words`, filled in by the input processor with the tokenizer."""
        return self._bad_words_token_ids

    def update_from_eos(self, eos_token_id: int | None) -> None:
        """Record the model's EOS id (vLLM: update_from_generation_config)."""
        if not self.ignore_eos:
            self._eos_token_id = eos_token_id
        if eos_token_id is not None:
            self._all_stop_token_ids.add(eos_token_id)

    def update_from_tokenizer(self, tokenizer: Any) -> None:
        """Tokenize `bad_words`, with and without a leading space (vLLM: update_from_tokenizer)."""
        if not self.bad_words:
            return
        sequences: list[list[int]] = []
        for word in self.bad_words:
            for prefix in ("", " "):
                token_ids = list(tokenizer.encode(prefix + word.lstrip(), add_special_tokens=False))
                if not token_ids:
                    if not prefix:
                        raise ValueError(f"bad_words entry {word!r} must tokenize to at least one token")
                    continue
                if not prefix or (token_ids[0] != sequences[-1][0] and len(token_ids) == len(sequences[-1])):
                    sequences.append(token_ids)
        self._bad_words_token_ids = sequences

    def clone(self) -> SamplingParams:
        """A deep copy (each request owns its params; the engine mutates eos fields)."""
        return copy.deepcopy(self)


@dataclass(slots=True)
class BeamSearchParams:
    """Parameters of `LLM.beam_search` (vllm/sampling_params.py `BeamSearchParams`: same fields and defaults).

    beam_width: beams kept per prompt (each step asks the engine for 2 * beam_width logprobs per beam);
    max_tokens: steps (generated tokens) at most; ignore_eos: EOS is an ordinary token, no beam completes;
    temperature: of each step's one-token request (the candidates are ranked by raw logprobs either way);
    length_penalty: exponent of the sequence length in the score (mini/beam_search.py);
    include_stop_str_in_output: keep the text of a completed beam's final EOS token in `text`.
    vLLM does not check these fields; mini does, so that a bad value raises `ValueError` naming the field.
    """

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        for name in ("beam_width", "max_tokens"):
            _require_int(name, getattr(self, name))
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("ignore_eos", "include_stop_str_in_output"):
            _require_bool(name, getattr(self, name))
        for name in ("temperature", "length_penalty"):
            _require_number(name, getattr(self, name))
        if self.temperature < 0.0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}")
