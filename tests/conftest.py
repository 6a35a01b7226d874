"""Shared fixtures: tiny random-weight Hugging Face checkpoints built from configs (never downloaded)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import gc
import tempfile
import time
from pathlib import Path

import pytest
import torch
from patience import HANG_GUARD_S

# Under `pytest -n N` every worker would start torch with one thread per core: N x cores threads fighting
# over the cores (measured: a 10x slowdown of the model tests on 2 cores). One thread per worker.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

# The engine-core mode of the suite (mini/engine/core_client.py): MINI_ENABLE_V1_MULTIPROCESSING as set when
# pytest starts (unset: mini's default, the core in a child process). Test modules that look inside an engine
# (its scheduler, model runner, step observers; the course's views, plugged parts and checks) build their
# engines in process whatever the suite's mode: those marked `inprocess_engine` and everything under tests/course/.
INPROC_FOLDER = Path(__file__).resolve().parent / "course"


@pytest.fixture(autouse=True, scope="module")
def engine_core_mode(request):
    """In-process engine cores for the modules that look inside the engine (marked, or under tests/course/)."""
    if request.node.get_closest_marker("inprocess_engine") or INPROC_FOLDER in request.path.resolve().parents:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "0")
            yield "inproc"
        return
    yield "multiprocess" if os.environ.get("MINI_ENABLE_V1_MULTIPROCESSING", "1") != "0" else "inproc"


def _live_children(pid: int) -> list[tuple[int, str]]:
    """(pid, name) of the live, non-zombie child processes of `pid`, read from /proc (Linux)."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name_and_rest = (entry / "stat").read_text()
        except OSError:
            continue
        name = name_and_rest[name_and_rest.index("(") + 1:name_and_rest.rindex(")")]
        fields = name_and_rest.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] not in ("Z", "X"):
            children.append((int(entry.name), name))
    return children


@pytest.fixture(autouse=True, scope="session")
def nothing_left_behind():
    """After the session: no engine-core or worker process of this pytest process is alive, and no socket folder
    it created is left in the temp dir (issue 27: shutdown leaves no orphan and no stale socket file). A process
    forked by this one is a child with this process' command line, whatever it renamed itself to."""
    if not Path("/proc/self/stat").exists():
        yield
        return
    temp = Path(tempfile.gettempdir())
    me = os.getpid()
    # Only this process's engines' folders (their names carry its pid, mini/engine/utils.py): another test run or
    # server on the machine may create and remove its own meanwhile.
    mine = f"mini-engine-{me}-*"
    sockets_before = set(temp.glob(mine))
    my_cmdline = Path("/proc/self/cmdline").read_bytes()
    yield
    gc.collect()   # engines only a reference cycle still holds are shut down by their finalizers

    def leftovers() -> tuple[list, list]:
        forks = [(pid, name) for pid, name in _live_children(me)
                 if _cmdline(pid) == my_cmdline]
        sockets = sorted(str(p) for p in set(temp.glob(mine)) - sockets_before)
        return forks, sockets

    deadline = time.monotonic() + HANG_GUARD_S   # engines shut down asynchronously: give them time
    forks, sockets = leftovers()
    while (forks or sockets) and time.monotonic() < deadline:
        time.sleep(0.2)
        forks, sockets = leftovers()
    assert not forks and not sockets, (f"the test session left engine processes {forks} and socket folders "
                                       f"{sockets} behind")


def _cmdline(pid: int) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


TINY_ARCHS = {
    # name: (config class name, extra config kwargs)
    "llama-tied": ("LlamaConfig", {"tie_word_embeddings": True}),
    "llama-untied": ("LlamaConfig", {"tie_word_embeddings": False}),
    "qwen2": ("Qwen2Config", {"tie_word_embeddings": False}),
    "qwen3": ("Qwen3Config", {"tie_word_embeddings": True, "head_dim": 32}),
}


def build_tiny_model(directory: Path, arch: str, seed: int = 0, vocab_size: int = 211) -> Path:
    """Save a 2-layer random model of `arch` (GQA: 4 query heads, 2 KV heads) to `directory`.

    initializer_range is large so logits are peaked: greedy argmax ties (which would make any two
    correct implementations diverge) are then rare.
    """
    import transformers

    class_name, extra = TINY_ARCHS[arch]
    config = getattr(transformers, class_name)(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.15,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
        **extra,
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    if arch == "qwen2":  # make the attention biases non-zero so they are really exercised
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.3)
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    """tiny_model_factory(arch) -> a folder with config.json + model.safetensors (cached per session)."""
    cache: dict[str, Path] = {}

    def make(arch: str = "llama-tied") -> Path:
        if arch not in cache:
            cache[arch] = build_tiny_model(tmp_path_factory.mktemp(f"tiny-{arch}"), arch)
        return cache[arch]

    return make


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_model_factory) -> Path:
    return tiny_model_factory("llama-tied")
