"""Run vLLM v0.33.0's own Triton kernels on CPU tensors, under Triton's interpreter, for the course's checks.

Used by tests/course/vllm_answers/test_p02.py, _p03.py and _p07.py. The kernel's source is read from the
unpacked vLLM tree (`MINI_VLLM_SOURCE`, via `course_fidelity.vllm_definition`), never copied into the repo.
Triton reads a kernel's source to interpret it, so the slice is registered in `linecache` under the name
it was compiled with.
"""

from __future__ import annotations

import ast
import linecache
import textwrap
from typing import Any

import pytest

from tests.course.fidelity import vllm_definition, vllm_source_root


def interpreted_triton() -> tuple[Any, Any]:
    """(triton, triton.language) with the interpreter on; skips without Triton or on a GPU machine."""
    from mini.attention import triton_utils

    if not triton_utils.is_available():
        pytest.skip(triton_utils.unavailable_reason())
    triton, tl = triton_utils.import_triton()
    if not triton_utils.use_interpreter():
        pytest.skip("runs vLLM's kernel on CPU tensors: needs Triton's interpreter (no GPU)")
    return triton, tl


def vllm_kernel(path: str, qualname: str, namespace: dict[str, Any] | None = None) -> Any:
    """vLLM's `@triton.jit` function `qualname` of `path`, jitted again here (its decorators are dropped)."""
    triton, tl = interpreted_triton()
    function = vllm_definition(path, qualname, {"tl": tl, "triton": triton, **(namespace or {})})
    source = (vllm_source_root() / path).read_text(encoding="utf-8")
    node: ast.AST = ast.parse(source)
    for part in qualname.split("."):
        node = next(n for n in ast.iter_child_nodes(node)
                    if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part)
    segment = textwrap.dedent(ast.get_source_segment(source, node, padded=True))
    segment = segment[segment.index("def "):]
    filename = function.__code__.co_filename
    linecache.cache[filename] = (len(segment), None, segment.splitlines(keepends=True), filename)
    return triton.jit(function)


def vllm_store_kv():
    """store_kv(key, value, kv_cache, slot_mapping) on vLLM's `reshape_and_cache_kernel_flash`
    (vllm/v1/attention/ops/triton_reshape_and_cache_flash.py), launched as its `triton_reshape_and_cache_flash`
    launches it for a `[num_blocks, block_size, num_kv_heads, head_size]` cache per side (not head-major,
    no FP8): one program per (token, tile of num_kv_heads * head_size elements)."""
    import torch

    triton, _ = interpreted_triton()
    kernel = vllm_kernel("vllm/v1/attention/ops/triton_reshape_and_cache_flash.py", "reshape_and_cache_kernel_flash")

    def store_kv(key, value, kv_cache, slot_mapping):
        key_cache, value_cache = kv_cache[0], kv_cache[1]
        num_tokens = slot_mapping.shape[0]
        if num_tokens == 0:
            return
        num_heads, head_size = key.shape[1], key.shape[2]
        n = num_heads * head_size
        tile_size = min(2048, triton.next_power_of_2(n))
        scale = torch.ones(1, dtype=torch.float32, device=key.device)
        kernel[(num_tokens, triton.cdiv(n, tile_size))](
            key, value, key_cache, value_cache, slot_mapping, scale, scale,
            key.stride(0), value.stride(0), key_cache.stride(0), key_cache.stride(2), 0, 0, key_cache.stride(1),
            num_heads, head_size, key_cache.shape[1], 1,
            USE_HEAD_MAJOR_LAYOUT=False, INTERLEAVED_V_PACK_FACTOR=0, FP8_KV_CACHE=False, TILE_SIZE=tile_size)

    return store_kv
