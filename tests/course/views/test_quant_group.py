"""The quantized-group view (labs/views/quant_group.py): its numbers are mini's quantizer's, its words the packer's."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import torch

from labs.views.quant_group import plot_quant_group, quant_group, render_quant_group_text
from mini.model.quantization import quant_utils


def _weight() -> torch.Tensor:
    return torch.randn(4, 64, generator=torch.Generator().manual_seed(0)) * 0.05


def test_the_group_is_minis_quantizer_and_packer():
    weight = _weight()
    group = quant_group(weight, 32, row=2, group=1)
    q, scales, zeros = quant_utils.quantize_int4_groups(weight, 32)
    assert group.columns == (32, 64)
    assert list(group.codes) == q[2, 32:64].tolist()
    assert group.zero == int(zeros[2, 1]) and abs(group.scale - float(scales[2, 1])) < 1e-9
    words = quant_utils.pack_int4_rows(q[2, 32:64][:, None].contiguous())[:, 0]
    assert list(group.packed_words) == [int(w) & 0xFFFFFFFF for w in words]
    assert group.max_abs_error <= group.scale / 2 + 1e-6   # round to nearest: within half a step
    assert abs(group.levels[group.zero]) == 0.0


def test_a_learner_quantizer_is_what_is_drawn():
    def everything_zero(weight, group_size):
        q, scales, zeros = quant_utils.quantize_int4_groups(weight, group_size)
        return torch.zeros_like(q), scales, zeros

    group = quant_group(_weight(), 32, quantize=everything_zero)
    assert set(group.codes) == {0} and group.packed_words == (0, 0, 0, 0)


def test_text_and_plot():
    group = quant_group(_weight(), 32)
    text = render_quant_group_text(group)
    assert "zero point" in text and "word 3: 0x" in text and "more" in text
    figure = plot_quant_group(group)
    assert len(figure.axes) == 2
