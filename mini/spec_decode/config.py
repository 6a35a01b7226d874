"""The `speculative_config` engine argument, parsed and checked once.

Mirrors vllm/config/speculative.py (SpeculativeConfig): vLLM takes the same dict from `LLM(...,
speculative_config={...})`, with the same keys: `method`, `num_speculative_tokens`, `model`,
`prompt_lookup_max`, `prompt_lookup_min`. Unknown keys and out-of-range values raise ValueError naming
the key, before the engine builds anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPEC_METHODS = ("ngram", "draft_model", "eagle")
_KNOWN_KEYS = ("method", "num_speculative_tokens", "model", "prompt_lookup_max", "prompt_lookup_min")
ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
DEFAULT_DRAFT_MODELS = {"draft_model": ASSETS_DIR / "tiny-llama-draft", "eagle": ASSETS_DIR / "tiny-llama-eagle"}


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """How drafts are proposed and how many per step (`num_speculative_tokens`, k)."""

    method: str
    num_speculative_tokens: int
    model: str | None = None           # draft_model / eagle: a local folder (default: the shipped one)
    prompt_lookup_max: int = 4         # ngram: the longest n-gram tried first ...
    prompt_lookup_min: int = 2         # ... down to this one (vLLM's defaults when only one is given)

    @classmethod
    def from_dict(cls, spec: dict[str, Any] | SpeculativeConfig | None) -> SpeculativeConfig | None:
        if spec is None or isinstance(spec, SpeculativeConfig):
            return spec
        if not isinstance(spec, dict):
            raise ValueError(  # noqa: TRY004 - bad values of any type are ValueErrors, as vLLM's config checks
                f"speculative_config must be a dict or None, got {type(spec).__name__}")
        unknown = sorted(set(spec) - set(_KNOWN_KEYS))
        if unknown:
            raise ValueError(f"speculative_config has unknown key(s) {unknown}; allowed keys: {list(_KNOWN_KEYS)}")
        method = spec.get("method")
        if method not in SPEC_METHODS:
            raise ValueError(f"speculative_config['method'] must be one of {SPEC_METHODS}, got {method!r}")
        k = spec.get("num_speculative_tokens")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"speculative_config['num_speculative_tokens'] must be an int >= 1, got {k!r}")
        lookup_max = spec.get("prompt_lookup_max", spec.get("prompt_lookup_min", 4) if method == "ngram" else 4)
        lookup_min = spec.get("prompt_lookup_min", min(2, lookup_max) if isinstance(lookup_max, int) else 2)
        for key, value in (("prompt_lookup_max", lookup_max), ("prompt_lookup_min", lookup_min)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"speculative_config['{key}'] must be an int >= 1, got {value!r}")
        if lookup_min > lookup_max:
            raise ValueError(f"speculative_config['prompt_lookup_min'] ({lookup_min}) must be <= "
                             f"'prompt_lookup_max' ({lookup_max})")
        model = spec.get("model")
        if method == "ngram" and model is not None:
            raise ValueError("speculative_config['model'] must be None for method 'ngram' (it drafts from the "
                             "request's own tokens)")
        if method != "ngram":
            model = str(DEFAULT_DRAFT_MODELS[method]) if model is None else str(model)
            if not Path(model).is_dir():
                raise ValueError(f"speculative_config['model'] must be a local folder holding the {method} "
                                 f"weights, got {model!r}")
        return cls(method=method, num_speculative_tokens=k, model=model,
                   prompt_lookup_max=lookup_max, prompt_lookup_min=lookup_min)

    @property
    def needs_kv_cache(self) -> bool:
        """draft_model and eagle run a network with its own paged KV cache (same block table as the target)."""
        return self.method != "ngram"
