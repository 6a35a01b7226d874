"""int8_per_token (W8A8): per-token activation rounding, the int32 product, and the layer against float."""

from __future__ import annotations

import torch

from mini.model.parallel_linear import ColumnParallelLinear
from mini.model.quantization import get_quantization_config
from mini.model.quantization.int8_per_token import Int8PerTokenLinearMethod, int8_scaled_mm, quantize_per_token
from mini.model.quantization.quant_utils import quantize_int8_per_channel


def test_per_token_rounding_is_within_half_a_step_of_each_row():
    torch.manual_seed(0)
    x = torch.randn(6, 96) * torch.logspace(-3, 2, 6)[:, None]   # rows of very different sizes
    q, scales = quantize_per_token(x)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127
    assert scales.shape == (6, 1)
    assert bool(((q.float() * scales - x).abs() <= scales / 2 + 1e-7).all())


def test_int_mm_product_equals_the_float_product_of_the_rounded_operands():
    torch.manual_seed(0)
    x, weight = torch.randn(8, 128), torch.randn(48, 128)
    w_q, w_s = quantize_int8_per_channel(weight)
    x_q, x_s = quantize_per_token(x)
    got = int8_scaled_mm(x, w_q.t(), w_s, None)
    want = (x_q.double() @ w_q.double().t()) * x_s.double() * w_s.double()   # integers: exact in float64
    assert torch.allclose(got.double(), want, rtol=1e-6, atol=0)


def test_layer_matches_float_within_activation_and_weight_rounding():
    torch.manual_seed(0)
    layer = ColumnParallelLinear(256, 64, bias=True, tp_rank=0, tp_size=1).to(torch.bfloat16)
    weight, bias = layer.weight.detach().float().clone(), layer.bias.detach().float().clone()
    method = get_quantization_config("int8_per_token")().get_quant_method(layer, "layer")
    assert isinstance(method, Int8PerTokenLinearMethod)
    layer.quant_method = method
    method.process_weights_after_loading(layer)
    assert "weight" not in dict(layer.named_parameters())
    x = torch.randn(8, 256)
    with torch.no_grad():
        got = layer(x.to(torch.bfloat16)).float()
    want = x.to(torch.bfloat16).float() @ weight.t() + bias
    # two roundings to 1/254 of a row's largest entry, then a bfloat16 output
    assert float((got - want).abs().max() / want.abs().max()) < 2e-2
