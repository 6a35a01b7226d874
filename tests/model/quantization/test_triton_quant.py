"""The Triton dequant-matmul kernels (mini/model/quantization/triton_kernels.py) against the dequantized float
reference. Without a GPU they run under TRITON_INTERPRET=1 (a few ms per program per K step), so the shapes are
tiny: 2 x 2 programs, 2 K steps. The kernels accumulate in float32; tolerance (relative to the largest output)
1e-5 under the interpreter and on a GPU for float32 inputs (tf32 is not used: `tl.dot` of float32 tiles with
default precision may use tf32 on a GPU, hence 5e-3 there)."""

from __future__ import annotations

import pytest
import torch

triton_utils = pytest.importorskip("mini.attention.triton_utils")
if not triton_utils.is_available():
    pytest.skip(triton_utils.unavailable_reason(), allow_module_level=True)

from mini.model.quantization import triton_kernels  # a real failure here, never a skip
from mini.model.quantization.quant_utils import (
    dequantize_int4_groups,
    pack_gptq,
    quantize_int4_groups,
    quantize_int8_per_channel,
)

DEVICE = "cuda" if torch.cuda.is_available() and not triton_utils.use_interpreter() else "cpu"
TOLERANCE = 5e-3 if DEVICE == "cuda" else 1e-5


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.cpu() - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("num_tokens", [3, 17])   # 17: a partial second row of programs (masked)
def test_int4_kernel_matches_the_dequantized_weight(num_tokens):
    torch.manual_seed(0)
    n, k, group = 48, 64, 32      # N = 48: a partial second column of programs
    weight = torch.randn(n, k)
    q, scales, zeros = quantize_int4_groups(weight, group)
    reference = dequantize_int4_groups(q, scales, zeros, group)
    tensors = pack_gptq(weight, group)
    x = torch.randn(num_tokens, k)
    got = triton_kernels.int4_matmul(x.to(DEVICE), tensors["qweight"].to(DEVICE), scales.t().contiguous().to(DEVICE),
                                     zeros.t().float().contiguous().to(DEVICE), group)
    assert _relative_error(got, x @ reference.t()) < TOLERANCE


def test_int8_kernel_matches_the_dequantized_weight():
    torch.manual_seed(0)
    weight = torch.randn(40, 64)
    q, scales = quantize_int8_per_channel(weight)
    x = torch.randn(5, 64)
    got = triton_kernels.int8_matmul(x.to(DEVICE), q.to(DEVICE), scales.to(DEVICE))
    assert _relative_error(got, x @ (q.float() * scales[:, None]).t()) < TOLERANCE


def test_a_block_that_does_not_divide_the_group_is_refused():
    with pytest.raises(ValueError, match="block_k .* must divide group_size"):
        triton_kernels.int4_matmul(torch.zeros(1, 64), torch.zeros(8, 16, dtype=torch.int32), torch.zeros(2, 16),
                                   torch.zeros(2, 16), 32, block_k=64)
