"""Load a Hugging Face tokenizer from a local folder, offline.

Mirrors `get_tokenizer` in vllm/tokenizers/registry.py (older releases: `transformers_utils/tokenizer.py`):
vLLM wraps `AutoTokenizer.from_pretrained` (vllm/tokenizers/hf.py) with caching and mode switches; mini needs
only the local, offline load.
"""

from __future__ import annotations

import os
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def has_tokenizer(model_dir: str | Path) -> bool:
    """True if the folder carries tokenizer files (a weights-only folder needs skip_tokenizer_init=True)."""
    return any((Path(model_dir) / name).exists() for name in TOKENIZER_FILES)


def load_tokenizer(model_dir: str | Path):
    """Return the folder's tokenizer (transformers), loaded with the hub switched off."""
    if not has_tokenizer(model_dir):
        raise ValueError(
            f"no tokenizer files ({', '.join(TOKENIZER_FILES)}) in {str(model_dir)!r}; "
            "pass skip_tokenizer_init=True and give prompts as {'prompt_token_ids': [...]}"
        )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
