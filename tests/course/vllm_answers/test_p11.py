"""vLLM v0.33.0's own bitmask application passes phase 11's `apply_token_bitmask_inplace` check.

vLLM applies the grammar bitmask in the model runner, before sampling: `apply_grammar_bitmask` in
vllm/v1/structured_output/utils.py reorders the compacted bitmask rows to the batch's rows and calls
xgrammar's `apply_token_bitmask_inplace`. That function runs here as is (xgrammar is installed with mini's
dev tools), adapted only in its call shape: stub scheduler/grammar outputs and an input batch whose rows
are `r0, r1, ...`, the rows listed in `indices` being the structured-output requests (no drafts).
(The newer GPU runner's Triton kernel, `_apply_grammar_bitmask_kernel` in
vllm/v1/worker/gpu/structured_outputs.py, does not run under Triton's CPU interpreter: its store mask has
a dtype the interpreter refuses.)

The other exercises have no vLLM counterpart: vLLM compiles grammars with xgrammar, outlines-core or
llguidance (vllm/v1/structured_output/backend_*.py); the NFA, the subset construction, the token trie walk
and the packing are mini's own finite-automaton compiler.
"""

from __future__ import annotations

import types

import pytest
import torch

from labs.checks.p11 import check_apply_token_bitmask_inplace
from tests.course.fidelity import vllm_definition


def test_vllm_apply_grammar_bitmask_passes():
    xgr = pytest.importorskip("xgrammar")
    namespace = {"torch": torch, "xgr": xgr, "PIN_MEMORY": False,
                 "async_tensor_h2d": lambda data, dtype=None, device=None: torch.tensor(data, dtype=dtype,
                                                                                         device=device)}
    apply_grammar_bitmask = vllm_definition("vllm/v1/structured_output/utils.py", "apply_grammar_bitmask",
                                            namespace)

    def apply_token_bitmask_inplace(logits, bitmask, indices=None):
        rows = list(range(logits.shape[0])) if indices is None else [int(i) for i in indices]
        req_ids = [f"r{row}" for row in range(logits.shape[0])]
        apply_grammar_bitmask(
            types.SimpleNamespace(scheduled_spec_decode_tokens={}),
            types.SimpleNamespace(structured_output_request_ids=[req_ids[row] for row in rows],
                                  grammar_bitmask=bitmask.numpy()),
            types.SimpleNamespace(req_ids=req_ids),
            logits,
        )
        return logits

    check_apply_token_bitmask_inplace(apply_token_bitmask_inplace)
