"""The Triton kernels compile for a real GPU (sm_90, through ptxas), even on a machine without one.

The CPU interpreter is lenient: it does not check tl.dot shape rules, layouts or register use. This
test runs Triton's real compiler for an H100 target in a subprocess (TRITON_INTERPRET=0), for the
shapes of a Llama-style model (head size 128, 4 query heads per KV head), and asserts no register spills
for the tensor-core paths.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from patience import RUN_GUARD_S

triton_utils = pytest.importorskip("mini.attention.triton_utils")
if not triton_utils.is_available():
    pytest.skip(triton_utils.unavailable_reason(), allow_module_level=True)

COMPILE_SCRIPT = r'''
import os, subprocess, sys, tempfile
os.environ["TRITON_INTERPRET"] = "0"
import triton
from triton.backends.compiler import GPUTarget
from mini.attention import triton_paged as tp

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")

def compile_for_h100(kernel, dtype, constexprs, num_warps):
    def arg_type(name):
        if name in constexprs:
            return "constexpr"
        if name in ("out_ptr", "query_ptr", "kv_cache_ptr", "key_ptr", "value_ptr"):
            return "*" + dtype
        if name.startswith("part_"):
            return "*fp32"
        if name.endswith("_ptr"):
            return "*i64" if name == "slot_mapping_ptr" else "*i32"
        return "fp32" if name == "scale" else "i32"
    signature = {name: arg_type(name) for name in kernel.arg_names}
    source = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as handle:
        handle.write(compiled.asm["cubin"])
    usage = subprocess.run([CUOBJDUMP, "-res-usage", handle.name], capture_output=True, text=True).stdout
    line = next(line for line in usage.splitlines() if "REG:" in line).strip()
    print(kernel.__name__, dtype, line)

compile_for_h100(tp._store_kv_kernel, "bf16", {"KV_HEADS_PAD": 8, "HEAD_PAD": 128}, 4)
compile_for_h100(tp._paged_decode_kernel, "bf16",
                 {"GROUP_PAD": 4, "HEAD_PAD": 128, "TILE_N": tp.DECODE_TILE_N}, tp.DECODE_NUM_WARPS)
import torch
for dtype, torch_dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
    block_q = tp.PREFILL_TILE_ROWS[torch_dtype] // 4
    compile_for_h100(tp._paged_prefill_kernel, dtype,
                     {"GROUP_PAD": 4, "BLOCK_Q": block_q, "HEAD_PAD": 128, "TILE_N": tp.PREFILL_TILE_N[torch_dtype],
                      "USE_FP32_DOT": dtype == "fp32"}, tp.PREFILL_NUM_WARPS)
for dtype, torch_dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
    compile_for_h100(tp._paged_decode_segment_kernel, dtype,
                     {"ROWS": 16, "HEAD_PAD": 128, "TILE_N": tp.SPLIT_DECODE_TILE_N[torch_dtype],
                      "USE_FP32_DOT": dtype == "fp32"}, tp.SPLIT_DECODE_NUM_WARPS)
compile_for_h100(tp._reduce_segments_kernel, "bf16", {"SEGMENTS_PAD": tp.MAX_DECODE_SEGMENTS, "HEAD_PAD": 128}, 4)
'''


def test_kernels_compile_for_h100_without_spills():
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    repo_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo_root, env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", COMPILE_SCRIPT],
        check=False, capture_output=True, text=True, env=env, timeout=RUN_GUARD_S
    )
    if result.returncode != 0 and "cuobjdump" in result.stderr and "No such file" in result.stderr:
        pytest.skip("this Triton build ships no NVIDIA tools (ptxas/cuobjdump)")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == [
        "_store_kv_kernel", "_paged_decode_kernel", "_paged_prefill_kernel", "_paged_prefill_kernel",
        "_paged_decode_segment_kernel", "_paged_decode_segment_kernel", "_reduce_segments_kernel",
    ]
    for line in lines:
        assert "STACK:0 " in line, f"register spills (local stack) in: {line}"
