"""Every vLLM path, `path:line` and path + symbol that the course and the engine cite exists in the pinned
release (vLLM v0.33.0), as recorded by the committed index (`scripts/vllm_index.py` writes it)."""

from __future__ import annotations

import pytest

from labs.course.vllm_citations import check_text, cited_sources, find_broken_citations, load_index

# It looks inside the engine (scheduler, runner, observers): its engines run in-process in either suite mode.
pytestmark = pytest.mark.inprocess_engine


def test_the_index_is_the_pinned_release():
    index = load_index()
    assert index["vllm_version"] == "0.33.0"
    assert "vllm/v1/core/block_pool.py" in index["files"]
    assert len(index["files"]) > 2000


def test_every_vllm_citation_exists_in_the_pinned_release():
    broken = find_broken_citations()
    assert not broken, "broken vLLM citations (python -m labs.course citations lists them):\n" + "\n".join(
        map(str, broken))


def test_the_sources_read_include_notebooks_readme_and_engine():
    wheres = list(cited_sources())
    assert any(w.startswith("solutions/05_scheduler/") for w in wheres)
    assert "README.md" in wheres and "mini/core/block_pool.py" in wheres


@pytest.mark.parametrize(("text", "reason"), [
    ("see `vllm/attention/layer.py`", "no such file"),
    ("see `vllm/v1/core/nowhere/`", "no such folder"),
    ("`vllm/v1/core/block_pool.py:99999`", "past the end"),
    ("`vllm/v1/core/block_pool.py::BlockPool.no_such_method`", "defines no"),
    ("`vllm/v1/core/block_pool.py:40::BlockPool.touch`", "not near 40"),
    ("`BlockPool.evict_everything()` in `vllm/v1/core/block_pool.py`", "defines no"),
    ("`RequestStatus.WAITING_FOR_FSM` (`vllm/v1/request.py`)", "defines no"),
    ("mirroring vLLM's `model_loader/gguf_loader.py`", "no file of vLLM 0.33.0 ends with"),   # no vllm/ prefix
    ("vLLM's `v1/core/block_pool.py`", "write vLLM's paths in full: vllm/v1/core/block_pool.py"),
])
def test_a_broken_citation_is_reported(text, reason):
    broken = check_text(text, "example")
    assert broken and reason in broken[0].reason, broken


@pytest.mark.parametrize("text", [
    "`vllm/v1/core/block_pool.py`", "`vllm/v1/core/`", "`vllm/v1/core/block_pool.py::BlockPool.touch`",
    "`BlockPool.touch` in `vllm/v1/core/block_pool.py`", ("`RequestStatus.WAITING_FOR_FSM` is gone; the "
    "statuses are in `vllm/v1/request.py`"), "the `num_tokens` variable in `vllm/v1/core/block_pool.py`",
    "`mini/model/gguf_loader.py`", "mini's `sampler.py` (`Sampler.forward` in vLLM's order), `ops/topk_topp.py`",
    "vLLM's `benchmarks/benchmark_serving.py`",   # vLLM's repository beside vllm/: not indexed
])
def test_a_correct_citation_passes(text):
    assert check_text(text, "example") == []


PIN_LINE = "> Every path and symbol cited refers to **vLLM v0.33.0**."


def test_every_deep_dive_names_the_pinned_release():
    """Each phase's Deep dive says, right under its heading, which vLLM release its paths refer to."""
    deep_dives = {w: t for w, t in cited_sources().items() if w.startswith("solutions/") and t.startswith("## 1. Deep")}
    missing = [where for where, text in deep_dives.items() if PIN_LINE not in text.splitlines()[:3]]
    assert len(deep_dives) >= 15
    assert not missing, f"Deep dives without the line {PIN_LINE!r} under their heading: {missing}"


def test_the_readme_names_the_pinned_release():
    assert "vLLM v0.33.0" in cited_sources()["README.md"]
