"""The LoRA ops (mini/lora/ops/) against the per-token definition, on a batch mixing slots and no adapter.

The Triton kernel runs under TRITON_INTERPRET=1 without a GPU (set by mini.attention.triton_utils), on tiny
shapes, in fp32 (the interpreter's reductions are exact enough there; `tl.dot` is not used).
"""

from __future__ import annotations

import pytest
import torch

from mini.lora.ops import torch_ops
from mini.lora.punica_wrapper import PunicaWrapper

SLOTS = [0, 0, -1, 2, 1, -1, 2, 2, 0]   # 9 tokens: three slots, two base rows, not grouped


def _case(num_slots=3, rank=4, in_features=24, out_features=20, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(len(SLOTS), in_features, generator=generator)
    lora_a = torch.randn(num_slots, rank, in_features, generator=generator)
    lora_b = torch.randn(num_slots, out_features, rank, generator=generator)
    out = torch.randn(len(SLOTS), out_features, generator=generator)
    return x, lora_a, lora_b, out, torch.tensor(SLOTS)


def test_reference_is_base_plus_b_a_x():
    x, lora_a, lora_b, out, slots = _case()
    got = torch_ops.add_lora_reference(out, x, lora_a, lora_b, slots)
    assert torch.equal(got[2], out[2]) and torch.equal(got[5], out[5]), "rows without an adapter must not change"
    torch.testing.assert_close(got[3], out[3] + lora_b[2] @ lora_a[2] @ x[3])


@pytest.mark.parametrize("grouped_min_tokens", [128, 0])   # the stacked ops, then the grouped ones
@pytest.mark.parametrize("slots", [SLOTS, [1] * 9, [-1] * 9])
def test_torch_ops_equal_reference(slots, grouped_min_tokens, monkeypatch):
    monkeypatch.setattr("mini.lora.punica_wrapper.GROUPED_MIN_TOKENS", grouped_min_tokens)
    x, lora_a, lora_b, out, _ = _case()
    token_slots = torch.tensor(slots)
    expected = torch_ops.add_lora_reference(out, x, lora_a, lora_b, token_slots)
    punica = PunicaWrapper("torch", max_loras=lora_a.shape[0], max_lora_rank=lora_a.shape[1])
    punica.set_mapping(token_slots)
    got = out.clone()
    punica.add_lora(got, x, lora_a, lora_b)
    torch.testing.assert_close(got, expected)
    assert punica.active == any(s >= 0 for s in slots)
    groups = torch_ops.group_tokens(token_slots)   # the grouped ops: one matmul pair per slot
    grouped = torch_ops.lora_expand_grouped(out.clone(), torch_ops.lora_shrink_grouped(x, lora_a, groups), lora_b,
                                            groups)
    torch.testing.assert_close(grouped, expected)


def test_mapping_must_cover_the_layer_input():
    x, lora_a, lora_b, out, slots = _case()
    punica = PunicaWrapper("torch", max_loras=3, max_lora_rank=4)
    punica.set_mapping(slots[:4])
    with pytest.raises(ValueError, match="covers 4 tokens"):
        punica.add_lora(out, x, lora_a, lora_b)
    with pytest.raises(ValueError, match="'torch' or 'triton'"):
        PunicaWrapper("cuda")


def test_triton_kernel_equals_reference():
    triton_utils = pytest.importorskip("mini.attention.triton_utils")
    if not triton_utils.is_available():
        pytest.skip(triton_utils.unavailable_reason())
    from mini.lora.ops import triton_ops

    device = "cuda" if torch.cuda.is_available() and not triton_utils.use_interpreter() else "cpu"
    # in 24 / BLOCK_K 16 and out 20 / BLOCK_N 16: both loops and both masks take a partial tile
    x, lora_a, lora_b, out, slots = _case()
    expected = torch_ops.add_lora_reference(out, x, lora_a, lora_b, slots)
    got = out.clone().to(device)
    buffer = triton_ops.lora_shrink(x.to(device), lora_a.to(device), slots.to(device), block_n=4, block_k=16)
    triton_ops.lora_expand(got, buffer, lora_b.to(device), slots.to(device), block_n=16, block_k=4)
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(buffer[2].cpu(), torch.zeros(4)), "a token without an adapter gets no work"
    with pytest.raises(ValueError, match="shapes do not fit"):
        triton_ops.lora_shrink(x.to(device), lora_a.to(device), slots[:3].to(device))


def test_token_lora_indices_map_each_request_to_its_slot():
    from mini.lora.punica_wrapper import compute_token_lora_indices
    got = compute_token_lora_indices(torch.tensor([7, 0, 2, 7]), torch.tensor([3, 1, 2, 1]), [7, None, 2])
    assert got.tolist() == [0, 0, 0, -1, 2, 2, 0] and got.dtype == torch.int64
    assert compute_token_lora_indices(torch.tensor([0, 0]), torch.tensor([2, 1]), [None, None]).tolist() == [-1] * 3


@pytest.mark.parametrize("slice_offset", [0, 3])
def test_per_token_shrink_and_expand_equal_the_reference(slice_offset):
    x, lora_a, lora_b, out, slots = _case()
    wide = torch.cat([torch.randn(len(slots), slice_offset), out, torch.randn(len(slots), 2)], dim=1)
    got = wide.clone()
    torch_ops.lora_expand(got, torch_ops.lora_shrink(x, lora_a, slots, 0.5), lora_b, slots, slice_offset)
    expected = wide.clone()
    expected[:, slice_offset:slice_offset + out.shape[1]] = torch_ops.add_lora_reference(
        out, x, lora_a, lora_b * 0.5, slots)
    torch.testing.assert_close(got, expected)


def test_a_replaced_punica_part_builds_the_reference_wrapper_that_calls_it():
    from mini import roles
    from mini.config import EngineConfig
    from mini.lora.punica_wrapper import ReferencePunicaWrapper
    calls = []

    def lora_shrink(x, lora_a, token_lora_indices, scaling):
        calls.append(x.shape[0])
        return torch_ops.lora_shrink(x, lora_a, token_lora_indices, scaling)

    assert roles.resolve(EngineConfig(), PunicaWrapper) is PunicaWrapper
    cls = roles.resolve(EngineConfig(parts={"lora_shrink": lora_shrink}), PunicaWrapper)
    assert issubclass(cls, ReferencePunicaWrapper)
    x, lora_a, lora_b, out, slots = _case()
    punica = cls("torch", max_loras=3, max_lora_rank=4)
    punica.update_metadata(torch.tensor([1, 0, 3]), torch.tensor([3, 2, 4]), [None, 1, 3])
    assert punica.token_slots.tolist() == [1, 1, 1, -1, -1, 2, 2, 2, 2]
    got = out.clone()
    punica.add_lora(got, x, lora_a, lora_b)
    torch.testing.assert_close(got, torch_ops.add_lora_reference(out, x, lora_a, lora_b, punica.token_slots))
    assert calls == [9]
