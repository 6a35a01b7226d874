"""apply_top_k_top_p / apply_top_k_only semantics (vLLM tests/v1/sample/test_topk_topp_sampler.py)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mini.sample.ops.topk_topp import apply_top_k_only, apply_top_k_top_p

NEG_INF = -float("inf")


def reference_row(row: torch.Tensor, k: int | None, p: float | None) -> torch.Tensor:
    """Single-row, loop-based definition: keep ties of the k-th value; keep the smallest top-p nucleus."""
    out = row.clone()
    if k is not None and 0 < k < row.numel():
        kth = row.sort(descending=True).values[k - 1]
        out[out < kth] = NEG_INF
    if p is not None and p < 1.0:
        probs = out.softmax(-1).tolist()
        order = sorted(range(row.numel()), key=lambda j: -probs[j])
        mass = 0.0
        keep = set()
        for j in order:
            if mass >= p:
                break
            keep.add(j)
            mass += probs[j]
        for j in range(row.numel()):
            if j not in keep:
                out[j] = NEG_INF
    return out


def test_top_p_keeps_the_token_crossing_the_boundary():
    logits = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.15), math.log(0.05)]])
    out = apply_top_k_top_p(logits.clone(), None, torch.tensor([0.6]))
    # 0.5 < 0.6, so the 0.3 token (which crosses 0.6) is kept; the rest are dropped.
    assert torch.isfinite(out[0, :2]).all() and torch.isinf(out[0, 2:]).all()
    out = apply_top_k_top_p(logits.clone(), None, torch.tensor([0.4]))
    assert torch.isfinite(out[0, 0]) and torch.isinf(out[0, 1:]).all()


def test_top_k_keeps_exactly_k_and_ties():
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0], [1.0, 2.0, 2.0, 2.0, 0.0]])
    out = apply_top_k_top_p(logits.clone(), torch.tensor([2, 2]), None)
    assert torch.isfinite(out[0]).tolist() == [False, True, False, True, False]
    assert torch.isfinite(out[1]).tolist() == [False, True, True, True, False]  # ties with the 2nd value kept


def test_kept_values_are_unchanged_and_others_are_minus_inf():
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    out = apply_top_k_top_p(logits.clone(), torch.tensor([3, 10, 0, 50, 7, 1]),
                            torch.tensor([0.5, 0.9, 0.7, 1.0, 0.99, 0.3]))
    kept = torch.isfinite(out)
    assert torch.equal(out[kept], logits[kept])
    assert torch.all(out[~kept] == NEG_INF)


def test_p_one_and_k_none_leave_logits_bit_identical():
    torch.manual_seed(1)
    logits = torch.randn(4, 300) * 40  # some probabilities underflow to 0 in float32
    for k, p in ((None, None), (None, torch.ones(4)), (torch.zeros(4, dtype=torch.long), None),
                 (torch.full((4,), 300), torch.ones(4))):
        out = apply_top_k_top_p(logits.clone(), k, p)
        assert torch.equal(out, logits)


def test_rows_off_stay_bit_identical_next_to_truncated_rows():
    torch.manual_seed(2)
    logits = torch.randn(3, 64) * 5
    out = apply_top_k_top_p(logits.clone(), torch.tensor([0, 5, 0]), torch.tensor([1.0, 0.8, 0.5]))
    assert torch.equal(out[0], logits[0])
    assert torch.isinf(out[1]).sum() >= 59 and torch.isinf(out[2]).any()


def test_mostly_and_entirely_minus_inf_rows_stay_valid():
    logits = torch.full((3, 16), NEG_INF)
    logits[0, 3] = 1.0  # one allowed token (grammar mask)
    logits[1, [2, 9]] = torch.tensor([0.5, 0.4])
    # row 2: everything masked
    for k, p in ((torch.tensor([5, 1, 3]), torch.tensor([0.5, 0.9, 0.1])),
                 (None, torch.tensor([0.1, 0.2, 0.3])),
                 (torch.tensor([4, 4, 4]), None)):
        out = apply_top_k_top_p(logits.clone(), k, p)
        assert not torch.isnan(out).any()
        assert out[0, 3] == 1.0 and torch.isfinite(out[1]).sum() >= 1 and torch.isinf(out[2]).all()


def test_top_k_only_matches_sort_path():
    torch.manual_seed(3)
    logits = torch.randn(8, 100)
    k = torch.tensor([1, 2, 10, 0, 99, 100, 50, 7])
    sort_path = apply_top_k_top_p(logits.clone(), k, torch.ones(8))
    assert torch.equal(apply_top_k_only(logits.clone(), k), sort_path)


def test_bad_shapes_raise_value_error():
    with pytest.raises(ValueError, match="k must be"):
        apply_top_k_top_p(torch.zeros(2, 4), torch.tensor([1]), None)
    with pytest.raises(ValueError, match="logits must be 2-D"):
        apply_top_k_top_p(torch.zeros(4), None, None)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    st.integers(min_value=1, max_value=5),
    st.integers(min_value=2, max_value=40),
    st.integers(min_value=0, max_value=2**31 - 1),
    st.floats(min_value=0.05, max_value=1.0),
)
def test_matches_single_row_reference(num_rows, vocab_size, seed, p_scale):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_rows, vocab_size, generator=gen) * 3
    k = torch.randint(0, vocab_size + 1, (num_rows,), generator=gen)
    p = (torch.rand(num_rows, generator=gen) * p_scale).clamp(min=0.01)
    p[0] = 1.0
    out = apply_top_k_top_p(logits.clone(), k, p)
    for row in range(num_rows):
        expected = reference_row(logits[row], int(k[row]), float(p[row]))
        assert torch.equal(torch.isfinite(out[row]), torch.isfinite(expected)), (row, out[row], expected)
        assert torch.isfinite(out[row]).any()
