"""The Triton bitmask kernel (mini/structured_output/triton_bitmask.py) against the torch op.

Without a GPU it runs under TRITON_INTERPRET=1 (set by mini.attention.triton_utils), like the attention
kernels' tests. Masking is exact: the results must be identical.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

triton_utils = pytest.importorskip("mini.attention.triton_utils")
if not triton_utils.is_available():
    pytest.skip(triton_utils.unavailable_reason(), allow_module_level=True)
from mini.structured_output.bitmask import BitmaskApplier, apply_token_bitmask_inplace
from mini.structured_output.token_index import pack_allowed
from mini.structured_output.triton_bitmask import apply_token_bitmask_inplace_triton

DEVICE = "cuda" if torch.cuda.is_available() and not triton_utils.use_interpreter() else "cpu"


@pytest.mark.parametrize("num_rows, vocab_size, rows", [(4, 100, [3, 0]), (3, 2051, None), (5, 64, [4, 1, 2])])
def test_triton_kernel_equals_torch_op(num_rows, vocab_size, rows):
    rng = random.Random(vocab_size)
    num_masked = num_rows if rows is None else len(rows)
    allowed = [rng.sample(range(vocab_size), rng.randint(0, vocab_size)) for _ in range(num_masked)]
    bitmask = torch.from_numpy(np.stack([pack_allowed(a, vocab_size) for a in allowed]))
    logits = torch.randn(num_rows, vocab_size, generator=torch.Generator().manual_seed(0))
    indices = None if rows is None else torch.tensor(rows)
    expected = apply_token_bitmask_inplace(logits.clone(), bitmask, indices)
    got = apply_token_bitmask_inplace_triton(logits.clone().to(DEVICE), bitmask.to(DEVICE),
                                             None if indices is None else indices.to(DEVICE))
    assert torch.equal(got.cpu(), expected)


def test_triton_kernel_narrow_bitmask_disallows_the_rest():
    logits = torch.zeros(1, 80, device=DEVICE)
    bitmask = torch.full((1, 2), -1, dtype=torch.int32, device=DEVICE)  # covers tokens 0..63 only
    apply_token_bitmask_inplace_triton(logits, bitmask)
    assert torch.isfinite(logits[0, :64]).all() and torch.isinf(logits[0, 64:]).all()
    with pytest.raises(ValueError, match="bitmask"):
        apply_token_bitmask_inplace_triton(logits, bitmask.to(torch.int64))


def test_the_applier_chooses_the_kernel_once_on_a_cuda_device_only():
    assert BitmaskApplier("cpu").op is BitmaskApplier.apply_token_bitmask_inplace
    if torch.cuda.is_available():
        assert BitmaskApplier("cuda").op is apply_token_bitmask_inplace_triton
