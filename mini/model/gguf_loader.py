"""Load a GGUF checkpoint: convert it ONCE into a cached Hugging Face folder, then load that folder.

Mirrors no vLLM v0.33.0 file: v0.33.0 has no GGUF model loader (older releases had `GGUFModelLoader`, in
a `gguf_loader.py` under vllm/model_executor/model_loader/, which kept the GGUF tensors quantized, ran
quantized kernels and took the config and the tokenizer from the file through transformers' GGUF
support). mini runs float weights only, so it goes one step further down that road: transformers (with the `gguf`
package) reads the file — config, dequantized tensors with llama.cpp's Q/K row permutation undone, tokenizer and chat
template — and mini saves the result as an ordinary HF folder (`model.safetensors`, `config.json` without
`quantization_config`, tokenizer files). From then on the GGUF model is a local folder like any other:
`mini.model.loader`, `mini.tokenizer` and the benchmark's transformers baseline all read it unchanged.

Why convert rather than read GGUF at every start: parsing the file's metadata and dequantizing takes
about a minute on a 2-core CPU (the `gguf` reader walks a 49k-entry vocabulary in Python); loading
the converted safetensors takes about a second.

The cache: `$MINI_CACHE_DIR/gguf/<file stem>-<key>/`, where `MINI_CACHE_DIR` defaults to
`$XDG_CACHE_HOME/mini` or `~/.cache/mini`, and `<key>` hashes the GGUF file's absolute path, size and
modification time (a changed file is converted again into a new folder). A folder is complete only
once its `mini_gguf_source.json` marker is written; it is built in a temporary folder and renamed
into place, so two processes converting at once cannot leave a half-written folder behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

GGUF_SUFFIX = ".gguf"
MARKER_FILE = "mini_gguf_source.json"
WEIGHTS_FILE = "model.safetensors"
# Config keys that only describe the GGUF origin; a float HF folder must not carry them.
DROPPED_CONFIG_KEYS = ("quantization_config", "_name_or_path", "_model_name_or_path")


def cache_root() -> Path:
    """`$MINI_CACHE_DIR`, else `$XDG_CACHE_HOME/mini`, else `~/.cache/mini`."""
    explicit = os.environ.get("MINI_CACHE_DIR")
    if explicit:
        return Path(os.path.expanduser(explicit))
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(os.path.expanduser(xdg)) if xdg else Path.home() / ".cache"
    return base / "mini"


def is_gguf_file(path: str | Path) -> bool:
    return Path(path).suffix.lower() == GGUF_SUFFIX and Path(path).is_file()


def source_fingerprint(gguf_path: Path) -> dict[str, object]:
    """What identifies one version of the file: absolute path, size and mtime (no hashing of 100 MB)."""
    stat = gguf_path.stat()
    return {"gguf_path": str(gguf_path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def cached_folder_for(gguf_path: Path) -> Path:
    """Where the converted folder of this file version lives (it may not exist yet)."""
    fingerprint = json.dumps(source_fingerprint(gguf_path), sort_keys=True)
    key = hashlib.sha256(fingerprint.encode()).hexdigest()[:12]
    return cache_root() / "gguf" / f"{gguf_path.stem}-{key}"


def is_converted(folder: Path, gguf_path: Path) -> bool:
    marker = folder / MARKER_FILE
    if not marker.is_file():
        return False
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return all(recorded.get(name) == value for name, value in source_fingerprint(gguf_path).items())


def hf_folder_for_gguf(gguf_path: str | Path) -> Path:
    """The cached HF folder for `gguf_path`, converting the file first if it was not converted yet."""
    path = Path(os.path.expanduser(str(gguf_path)))
    if not is_gguf_file(path):
        raise ValueError(f"model must name an existing {GGUF_SUFFIX} file, got {str(gguf_path)!r}")
    folder = cached_folder_for(path)
    if not is_converted(folder, path):
        convert_gguf(path, folder)
    return folder


def gguf_source(folder: str | Path) -> Path | None:
    """The GGUF file a model folder stands for: its only `*.gguf` file, else the file it was converted from
    (its marker), else None. `quantization="gguf"` reads the blocks from there (mini/model/gguf_weights.py)."""
    folder = Path(folder)
    inside = sorted(folder.glob(f"*{GGUF_SUFFIX}"))
    if len(inside) == 1:
        return inside[0]
    marker = folder / MARKER_FILE
    if not inside and marker.is_file():
        source = Path(json.loads(marker.read_text())["gguf_path"])
        if source.is_file() and is_converted(folder, source):
            return source
    return None


def convert_gguf(gguf_path: Path, folder: Path) -> None:
    """Dequantize `gguf_path` with transformers and write a float32 HF folder at `folder` (atomically)."""
    _check_gguf_package(gguf_path)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(f"mini: converting {gguf_path.name} into {folder} (once; about a minute on a 2-core CPU)",
          file=sys.stderr, flush=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.parent / f".{folder.name}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        _write_hf_folder(gguf_path, staging)
        (staging / MARKER_FILE).write_text(json.dumps(source_fingerprint(gguf_path), indent=2) + "\n")
        if folder.exists():  # another process finished first, or a stale incomplete folder
            if is_converted(folder, gguf_path):
                return
            shutil.rmtree(folder)
        os.rename(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _check_gguf_package(gguf_path: Path) -> None:
    """transformers reads GGUF through the `gguf` package (and `accelerate`): say so clearly if missing."""
    import importlib.util

    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise ValueError(
            f"model={str(gguf_path)!r} is a GGUF file; converting it needs the packages {missing}: "
            "pip install gguf accelerate (scripts/setup.sh installs them)"
        )


def _write_hf_folder(gguf_path: Path, out_dir: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    directory, filename = str(gguf_path.parent), gguf_path.name
    config = AutoConfig.from_pretrained(directory, gguf_file=filename, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=filename, config=config, dtype=torch.float32, local_files_only=True
    )
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=filename, local_files_only=True)

    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    tensors = {
        name: tensor.detach().to(torch.float32).contiguous()
        for name, tensor in model.state_dict().items()
        if not (tied and name == "lm_head.weight")  # the tied head is the embedding; loaders re-tie it
    }
    save_file(tensors, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})

    config_dict = model.config.to_diff_dict()  # only what differs from the defaults, as save_pretrained
    for key in DROPPED_CONFIG_KEYS:
        config_dict.pop(key, None)
    config_dict["architectures"] = [type(model).__name__]
    config_dict["dtype"] = "float32"
    (out_dir / "config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n")
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
