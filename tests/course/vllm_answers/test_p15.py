"""vLLM v0.33.0's own packing helpers pass phase 15's checks.

Read from an unpacked vLLM tree ($MINI_VLLM_SOURCE), never copied; adapted only in their call shape:
`pack_rows(q_w, num_bits, size_k, size_n)` (vllm/model_executor/layers/quantization/utils/quant_utils.py) is
`pack_int4_rows` with 4 bits and the shape of its input; vLLM has no `unpack_rows`, so `unpack_int4_rows` is its
`unpack_cols` on the transposed words (the same nibble order along the other axis), transposed back.

Not run: vLLM's `quantize_weights` (same file). With `zero_points=True` it spans the group's own min..max
(not min..max extended to 0.0) and takes the zero point as round(|min| / scale), so for a one-sided group its
grid does not hold 0.0 exactly and its codes differ from AutoGPTQ's round-to-nearest quantizer, which mini and
the check follow. Its int8 path is not per-channel symmetric in mini's sense either (it takes a ScalarType).
"""

from __future__ import annotations

from typing import Any

import numpy
import torch

from tests.course.fidelity import check_of, vllm_definition

PHASE = "15_quantization"
QUANT_UTILS = "vllm/model_executor/layers/quantization/utils/quant_utils.py"


def vllm_namespace() -> dict[str, Any]:
    namespace: dict[str, Any] = {"numpy": numpy, "torch": torch}
    vllm_definition(QUANT_UTILS, "get_pack_factor", namespace)
    return namespace


def test_vllm_pack_rows_passes_as_pack_int4_rows():
    pack_rows = vllm_definition(QUANT_UTILS, "pack_rows", vllm_namespace())

    def pack_int4_rows(values):
        return pack_rows(values, 4, values.shape[0], values.shape[1])

    check_of(PHASE, "pack_int4_rows")(pack_int4_rows)


def test_vllm_unpack_cols_passes_as_unpack_int4_rows():
    unpack_cols = vllm_definition(QUANT_UTILS, "unpack_cols", vllm_namespace())

    def unpack_int4_rows(packed):
        rows, cols = packed.shape
        return unpack_cols(packed.t().contiguous(), 4, cols, rows * 8).t().contiguous()

    check_of(PHASE, "unpack_int4_rows")(unpack_int4_rows)
