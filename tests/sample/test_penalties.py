"""Repetition / frequency / presence penalties (vLLM tests/v1/sample/test_sampler.py penalty cases)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mini.sample.metadata import make_padded_tensor
from mini.sample.ops.penalties import apply_all_penalties, get_token_bin_counts_and_mask


def penalize(logits, prompts, outputs, presence, frequency, repetition):
    vocab_size = logits.shape[1]
    return apply_all_penalties(
        logits.clone(), make_padded_tensor(prompts, vocab_size, "cpu"),
        make_padded_tensor(outputs, vocab_size, "cpu"),
        torch.tensor(presence), torch.tensor(frequency), torch.tensor(repetition))


def dense_reference(logits, prompts, outputs, presence, frequency, repetition):
    """vLLM's dense formulation, written out with bin counts."""
    num_rows, vocab_size = logits.shape
    padded_prompts = make_padded_tensor(prompts, vocab_size, "cpu")
    _, prompt_mask = get_token_bin_counts_and_mask(padded_prompts, vocab_size, num_rows)
    counts, output_mask = get_token_bin_counts_and_mask(make_padded_tensor(outputs, vocab_size, "cpu"),
                                                        vocab_size, num_rows)
    rep = torch.where(prompt_mask | output_mask, torch.tensor(repetition).unsqueeze(1), 1.0)
    out = torch.where(logits > 0, logits / rep, logits * rep)
    out -= torch.tensor(frequency).unsqueeze(1) * counts
    out -= torch.tensor(presence).unsqueeze(1) * output_mask
    return out


def test_repetition_divides_positive_and_multiplies_negative_seen_tokens():
    logits = torch.tensor([[2.0, -2.0, 4.0, -1.0, 3.0]])
    out = penalize(logits, [[0]], [[1]], [0.0], [0.0], [2.0])
    # token 0 seen in the prompt, token 1 in the output; tokens 2..4 unseen.
    assert out.tolist() == [[1.0, -4.0, 4.0, -1.0, 3.0]]


def test_frequency_counts_output_occurrences_only():
    logits = torch.zeros(1, 4)
    out = penalize(logits, [[3, 3, 3]], [[1, 1, 2]], [0.0], [0.5], [1.0])
    assert out.tolist() == [[0.0, -1.0, -0.5, 0.0]]


def test_presence_subtracts_once_per_output_token():
    logits = torch.ones(1, 4)
    out = penalize(logits, [[0]], [[1, 1, 1, 2]], [0.25], [0.0], [1.0])
    assert out.tolist() == [[1.0, 0.75, 0.75, 1.0]]


def test_all_three_combine_in_vllm_order():
    logits = torch.tensor([[3.0, -3.0, 1.0]])
    out = penalize(logits, [[]], [[0, 0, 1]], [0.5], [1.0], [1.5])
    # token 0: 3/1.5 - 2*1 - 0.5 ; token 1: -3*1.5 - 1 - 0.5 ; token 2 unseen
    assert torch.allclose(out, torch.tensor([[2.0 - 2.0 - 0.5, -4.5 - 1.0 - 0.5, 1.0]]))


def test_rows_are_independent_and_empty_histories_are_untouched():
    logits = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [-1.0, 2.0, 0.5]])
    out = penalize(logits, [[0], [], []], [[], [], []], [0.0, 2.0, 2.0], [0.0, 2.0, 2.0], [2.0, 3.0, 3.0])
    assert out[0].tolist() == [0.5, 1.0, 1.0]
    assert torch.equal(out[1:], logits[1:])


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(2, 30), st.integers(0, 2**31 - 1))
def test_sparse_penalties_equal_dense_reference_bit_for_bit(num_rows, vocab_size, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_rows, vocab_size, generator=gen) * 4
    lengths = torch.randint(0, 12, (2, num_rows), generator=gen).tolist()
    prompts = [torch.randint(0, vocab_size, (n,), generator=gen).tolist() for n in lengths[0]]
    outputs = [torch.randint(0, vocab_size, (n,), generator=gen).tolist() for n in lengths[1]]
    presence = (torch.rand(num_rows, generator=gen) * 4 - 2).tolist()
    frequency = (torch.rand(num_rows, generator=gen) * 4 - 2).tolist()
    repetition = (torch.rand(num_rows, generator=gen) * 2 + 0.1).tolist()
    got = penalize(logits, prompts, outputs, presence, frequency, repetition)
    want = dense_reference(logits, prompts, outputs, presence, frequency, repetition)
    assert torch.equal(got, want)
