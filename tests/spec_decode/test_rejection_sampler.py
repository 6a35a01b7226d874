"""Speculative verification, mini/sample/rejection_sampler.py: greedy rows exactly; random rows by their
output distribution (whatever the drafter's q, every emitted token must follow the target's p: checked with
a chi-square goodness-of-fit test over tens of thousands of one-call trials); seeded rows reproducible
whatever else is in the batch; the residual distribution max(0, p - q) normalised. `RejectionSampler` runs a
step's verification in one pass: every row sampled once (a row with drafts: its bonus token), each seeded
generator drawn from once, in order, never rewound."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mini import roles
from mini.config import EngineConfig
from mini.sample.metadata import SamplingMetadata
from mini.sample.rejection_sampler import (
    PLACEHOLDER_TOKEN_ID,
    RejectionSampler,
    compute_residual_probs,
    rejection_sample,
)
from mini.sample.sampler import Sampler
from mini.sampling_params import SamplingParams
from mini.spec_decode.metadata import SpecDecodeMetadata

NUM_TRIALS = 40_000
MIN_P_VALUE = 1e-3          # seeded tests: a correct sampler passes; a biased one lands far below this


def dirichlet(vocab_size: int, concentration: float = 1.0) -> torch.Tensor:
    """One random distribution over `vocab_size` tokens (uses the global RNG: seed it first)."""
    return torch.distributions.Dirichlet(torch.full((vocab_size,), concentration)).sample()


def chi_square_p_value(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness of fit of `tokens` to `probs`: P(chi2 >= statistic), by the regularised upper gamma.

    A token with probability 0 that shows up at all is an outright failure (p-value 0).
    """
    counts = torch.bincount(tokens, minlength=probs.numel()).to(torch.float64)
    support = probs > 0
    if counts[~support].sum() > 0:
        return 0.0
    expected = probs[support].to(torch.float64) * counts.sum()
    statistic = ((counts[support] - expected) ** 2 / expected).sum()
    degrees_of_freedom = int(support.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(degrees_of_freedom / 2.0, dtype=torch.float64),
                                         statistic / 2.0))


def one_draft_batch(p: torch.Tensor, q: torch.Tensor | None, drafts: torch.Tensor, bonus: int = 99,
                    greedy: bool = False) -> torch.Tensor:
    """Run NUM rows of one draft each, all with target p (and draft distribution q)."""
    num_rows, vocab_size = drafts.shape[0], p.numel()
    return rejection_sample(
        draft_token_ids=drafts,
        num_draft_tokens=[1] * num_rows,
        draft_probs=None if q is None else q.expand(num_rows, vocab_size).contiguous(),
        target_probs=p.expand(num_rows, vocab_size).contiguous(),
        bonus_token_ids=torch.full((num_rows,), bonus, dtype=torch.int64),
        is_greedy=torch.full((num_rows,), greedy),
        generators={},
    )


# ---------------------------------------------------------------- greedy rows: exact


def peaked(argmax_tokens: list[int], vocab_size: int = 8) -> torch.Tensor:
    """Target rows whose argmax is the given token (the rest of the mass spread evenly)."""
    probs = torch.full((len(argmax_tokens), vocab_size), 0.5 / (vocab_size - 1))
    probs[torch.arange(len(argmax_tokens)), torch.tensor(argmax_tokens)] = 0.5
    return probs


def greedy_call(drafts: list[int], num_draft_tokens: list[int], argmax_tokens: list[int],
                bonus: list[int]) -> torch.Tensor:
    return rejection_sample(torch.tensor(drafts, dtype=torch.int64), num_draft_tokens, None,
                            peaked(argmax_tokens), torch.tensor(bonus, dtype=torch.int64),
                            torch.ones(len(num_draft_tokens), dtype=torch.bool), {})


def test_greedy_all_accepted_appends_the_bonus():
    out = greedy_call([3, 1, 4], [3], argmax_tokens=[3, 1, 4], bonus=[7])
    assert out.dtype == torch.int64 and out.tolist() == [[3, 1, 4, 7]]


def test_greedy_first_mismatch_emits_the_argmax_and_stops():
    out = greedy_call([3, 1, 4], [3], argmax_tokens=[3, 5, 4], bonus=[7])
    assert out.tolist() == [[3, 5, PLACEHOLDER_TOKEN_ID, PLACEHOLDER_TOKEN_ID]]
    out = greedy_call([3, 1, 4], [3], argmax_tokens=[2, 1, 4], bonus=[7])   # the later match is not used
    assert out.tolist() == [[2, -1, -1, -1]]


def test_greedy_batch_with_zero_drafts_and_padding():
    out = greedy_call([3, 1, 4, 6, 2, 2], [3, 0, 1, 2], argmax_tokens=[3, 1, 0, 6, 2, 5], bonus=[7, 8, 9, 6])
    assert out.shape == (4, 4)
    assert out.tolist() == [[3, 1, 0, -1],      # mismatch at position 2
                            [8, -1, -1, -1],    # no drafts: the bonus alone
                            [6, 9, -1, -1],     # its one draft accepted, then its bonus
                            [2, 5, -1, -1]]     # mismatch at position 1


def test_no_drafts_anywhere_returns_the_bonus_tokens():
    out = rejection_sample(torch.empty(0, dtype=torch.int64), [0, 0], None, torch.empty(0, 8),
                           torch.tensor([4, 5]), torch.tensor([True, False]), {})
    assert out.tolist() == [[4], [5]]


def test_greedy_rows_ignore_draft_probs():
    # q says the drafts are certain; a greedy row still only compares them with argmax p.
    draft_probs = peaked([1, 1])
    out = rejection_sample(torch.tensor([1, 1]), [2], draft_probs, peaked([1, 3]), torch.tensor([0]),
                           torch.tensor([True]), {})
    assert out.tolist() == [[1, 3, -1]]


# ---------------------------------------------------------------- random rows: output follows p


@pytest.mark.parametrize("vocab_size", [5, 8])
def test_first_token_follows_p_for_a_random_drafter(vocab_size):
    torch.manual_seed(vocab_size)
    p, q = dirichlet(vocab_size), dirichlet(vocab_size)
    drafts = torch.multinomial(q, NUM_TRIALS, replacement=True)
    out = one_draft_batch(p, q, drafts)
    assert chi_square_p_value(out[:, 0], p) > MIN_P_VALUE
    assert chi_square_p_value(out[:, 0], q) < 1e-9, "the test must tell p from q (else it proves nothing)"
    accepted = out[:, 1] != PLACEHOLDER_TOKEN_ID
    assert torch.equal(out[accepted, 0], drafts[accepted]) and (out[accepted, 1] == 99).all()
    # Leviathan et al.: the acceptance rate is sum_x min(p(x), q(x)); 5 standard errors of slack.
    expected_rate = float(torch.minimum(p, q).sum())
    slack = 5 * (expected_rate * (1 - expected_rate) / NUM_TRIALS) ** 0.5
    assert abs(accepted.double().mean().item() - expected_rate) < slack


def test_first_token_follows_p_for_a_bad_drafter():
    torch.manual_seed(1)
    p = torch.tensor([0.02, 0.30, 0.25, 0.18, 0.15, 0.10])
    q = torch.tensor([0.90, 0.02, 0.02, 0.02, 0.02, 0.02])  # almost always drafts the token p barely wants
    drafts = torch.multinomial(q, NUM_TRIALS, replacement=True)
    out = one_draft_batch(p, q, drafts)
    assert chi_square_p_value(out[:, 0], p) > MIN_P_VALUE
    assert (out[:, 1] != PLACEHOLDER_TOKEN_ID).double().mean().item() < float(torch.minimum(p, q).sum()) + 0.01


def test_first_token_follows_p_for_a_deterministic_drafter():
    torch.manual_seed(2)
    vocab_size = 6
    p = dirichlet(vocab_size)
    drafts = torch.arange(NUM_TRIALS) % vocab_size           # n-gram style: fixed guesses, no draft_probs
    out = one_draft_batch(p, None, drafts)
    assert chi_square_p_value(out[:, 0], p) > MIN_P_VALUE
    for draft in range(vocab_size):                            # each guess: accepted with probability p(draft)
        rows = drafts == draft
        assert chi_square_p_value(out[rows, 0], p) > MIN_P_VALUE
        rate = (out[rows, 1] != PLACEHOLDER_TOKEN_ID).double().mean().item()
        assert abs(rate - float(p[draft])) < 5 * (float(p[draft] * (1 - p[draft])) / rows.sum().item()) ** 0.5


def test_second_position_follows_p_given_the_first_was_accepted():
    torch.manual_seed(3)
    vocab_size, num_rows = 6, NUM_TRIALS
    p1, q1, p2, q2 = (dirichlet(vocab_size) for _ in range(4))
    drafts = torch.stack([torch.multinomial(q1, num_rows, replacement=True),
                          torch.multinomial(q2, num_rows, replacement=True)], dim=1).view(-1)
    target = torch.stack([p1, p2]).repeat(num_rows, 1)         # rows: p1, p2, p1, p2, ...
    draft_probs = torch.stack([q1, q2]).repeat(num_rows, 1)
    out = rejection_sample(drafts, [2] * num_rows, draft_probs, target, torch.full((num_rows,), 42),
                           torch.zeros(num_rows, dtype=torch.bool), {})
    assert chi_square_p_value(out[:, 0], p1) > MIN_P_VALUE
    first_accepted = out[:, 1] != PLACEHOLDER_TOKEN_ID
    assert first_accepted.sum() > 5_000
    assert chi_square_p_value(out[first_accepted, 1], p2) > MIN_P_VALUE
    both_accepted = out[:, 2] != PLACEHOLDER_TOKEN_ID
    assert (out[both_accepted, 2] == 42).all()
    assert torch.equal(out[both_accepted, :2], drafts.view(num_rows, 2)[both_accepted])


def test_a_draft_the_target_rules_out_is_always_rejected():
    torch.manual_seed(4)
    p = torch.tensor([0.0, 0.5, 0.5, 0.0])
    q = torch.tensor([0.7, 0.1, 0.1, 0.1])
    out = one_draft_batch(p, q, torch.zeros(2_000, dtype=torch.int64))
    assert (out[:, 1] == PLACEHOLDER_TOKEN_ID).all()           # never accepted ...
    assert set(out[:, 0].tolist()) == {1, 2}                  # ... replaced from the residual (tokens 1, 2)


def test_a_draft_its_drafter_gave_zero_probability_is_rejected():
    torch.manual_seed(5)
    p = torch.tensor([0.5, 0.5, 0.0])
    q = torch.tensor([0.0, 0.5, 0.5])
    out = one_draft_batch(p, q, torch.zeros(500, dtype=torch.int64))
    assert (out[:, 1] == PLACEHOLDER_TOKEN_ID).all() and (out[:, 0] == 0).all()   # residual = [1, 0, 0]


# ---------------------------------------------------------------- per-request seeds


def seeded_row_output(seed: int, row: int, num_rows: int, global_seed: int) -> list[int]:
    """The seeded request's output when it sits at `row` of a batch of random, unseeded neighbours."""
    torch.manual_seed(global_seed)
    vocab_size = 6
    counts = [int(c) for c in torch.randint(0, 4, (num_rows,))]
    counts[row] = 3
    total = sum(counts)
    target = torch.distributions.Dirichlet(torch.ones(vocab_size)).sample((total,))
    draft_probs = torch.distributions.Dirichlet(torch.ones(vocab_size)).sample((total,))
    drafts = torch.randint(0, vocab_size, (total,))
    start = sum(counts[:row])                                 # the seeded request's own inputs, fixed:
    request = torch.Generator().manual_seed(1000 + seed)
    target[start:start + 3] = torch.rand(3, vocab_size, generator=request).softmax(dim=-1)
    draft_probs[start:start + 3] = torch.rand(3, vocab_size, generator=request).softmax(dim=-1)
    drafts[start:start + 3] = torch.randint(0, vocab_size, (3,), generator=request)
    bonus = torch.arange(num_rows) + 200
    bonus[row] = 100
    out = rejection_sample(drafts, counts, draft_probs, target, bonus,
                           torch.zeros(num_rows, dtype=torch.bool),
                           {row: torch.Generator().manual_seed(seed)})
    return out[row, :4].tolist()


def test_a_seeded_request_gives_the_same_tokens_whatever_the_batch():
    outputs = []
    for seed in range(12):
        alone = seeded_row_output(seed, row=0, num_rows=1, global_seed=0)
        assert seeded_row_output(seed, row=3, num_rows=5, global_seed=1) == alone
        assert seeded_row_output(seed, row=1, num_rows=7, global_seed=2) == alone
        outputs.append(tuple(alone))
    assert len(set(outputs)) > 3, "different seeds should give different outcomes"


def test_an_unseeded_request_varies_with_the_global_rng():
    p = torch.full((6,), 1 / 6)
    q = torch.tensor([0.5, 0.1, 0.1, 0.1, 0.1, 0.1])
    outputs = set()
    for global_seed in range(8):
        torch.manual_seed(global_seed)
        outputs.add(tuple(one_draft_batch(p, q, torch.zeros(4, dtype=torch.int64)).view(-1).tolist()))
    assert len(outputs) > 1


# ---------------------------------------------------------------- residual distribution


def test_residual_is_normalised_and_zero_where_q_covers_p():
    torch.manual_seed(6)
    p = torch.distributions.Dirichlet(torch.ones(7)).sample((50,))
    q = torch.distributions.Dirichlet(torch.ones(7)).sample((50,))
    residual = compute_residual_probs(p, q, torch.zeros(50, dtype=torch.int64))
    assert residual.dtype == torch.float32
    torch.testing.assert_close(residual.sum(dim=-1), torch.ones(50))
    assert (residual[q >= p] == 0).all()
    difference = (p - q).clamp_min(0)
    torch.testing.assert_close(residual, difference / difference.sum(dim=-1, keepdim=True))


def test_residual_without_draft_probs_zeroes_the_draft_token():
    p = torch.tensor([[0.1, 0.6, 0.3], [0.2, 0.2, 0.6]])
    residual = compute_residual_probs(p, None, torch.tensor([1, 2]))
    torch.testing.assert_close(residual, torch.tensor([[0.25, 0.0, 0.75], [0.5, 0.5, 0.0]]))


def test_residual_falls_back_to_p_when_it_is_all_zero():
    p = torch.tensor([[0.2, 0.3, 0.5], [0.0, 1.0, 0.0]])
    residual = compute_residual_probs(p, p.clone(), torch.tensor([0, 1]))   # q >= p everywhere: q == p
    assert torch.isfinite(residual).all()
    torch.testing.assert_close(residual, p)
    one_hot_draft = compute_residual_probs(p[1:], None, torch.tensor([1]))
    torch.testing.assert_close(one_hot_draft, p[1:])          # p one-hot at the (deterministic) draft


# ---------------------------------------------------------------- plumbing


def test_bad_shapes_raise_value_error():
    with pytest.raises(ValueError, match="num_draft_tokens"):
        rejection_sample(torch.tensor([1, 2]), [1], None, torch.rand(2, 4), torch.tensor([0]),
                         torch.tensor([False]), {})
    with pytest.raises(ValueError, match="target_probs"):
        rejection_sample(torch.tensor([1, 2]), [2], None, torch.rand(3, 4), torch.tensor([0]),
                         torch.tensor([False]), {})


def test_parse_output_and_parts():
    out = torch.tensor([[3, 1, -1], [4, -1, -1], [5, 6, 7]])
    assert RejectionSampler.parse_output(out) == [[3, 1], [4], [5, 6, 7]]
    assert roles.reference("rejection_sample") is rejection_sample
    assert roles.reference("compute_residual_probs") is compute_residual_probs
    assert roles.home_class("rejection_sample") is RejectionSampler
    assert roles.role_of("compute_residual_probs").name == "sampler"


def test_a_replaced_residual_is_the_one_the_resolved_rejection_sample_calls():
    """`rejection_sample` calls its sibling part through a keyword-only parameter: the class an engine
    resolves with a replaced `compute_residual_probs` binds the replacement there."""
    calls = []

    def residual(target_probs, draft_probs, draft_token_ids):
        calls.append(target_probs.shape)
        return compute_residual_probs(target_probs, draft_probs, draft_token_ids)

    resolved = roles.resolve(EngineConfig(parts={"compute_residual_probs": residual}), RejectionSampler)
    assert resolved.__bases__ == (RejectionSampler,)
    assert RejectionSampler.compute_residual_probs is compute_residual_probs   # the home class is untouched
    out = resolved.rejection_sample(torch.tensor([1]), [1], None, torch.tensor([[0.5, 0.5]]), torch.tensor([0]),
                                    torch.tensor([False]), {})
    assert calls == [(1, 2)] and out.shape == (1, 2)


# ---------------------------------------------------------------- one verification pass (RejectionSampler.forward)


def _one_pass_case():
    """Three rows: 0 seeded random with 2 drafts, 1 greedy with 1 draft and penalties, 2 seeded without drafts."""
    torch.manual_seed(11)
    vocab_size = 12
    params = [SamplingParams(temperature=0.9, top_k=6, seed=1, logprobs=2),
              SamplingParams(temperature=0.0, repetition_penalty=1.5, logprobs=1),
              SamplingParams(temperature=1.1, seed=3)]
    outputs = [[4, 5], [6], [7]]
    drafts = [[2, 3], [8], []]
    # Flat batch: row 0 feeds 3 tokens (last token + 2 drafts), row 1 feeds 2, row 2 feeds 1.
    query_start_loc = torch.tensor([0, 3, 5, 6])
    hidden_logits = torch.randn(6, vocab_size) * 2      # the target's logits at every flat position
    return vocab_size, params, outputs, drafts, query_start_loc, hidden_logits


def _metadata(params, outputs, vocab_size):
    generators = {row: torch.Generator().manual_seed(p.seed) for row, p in enumerate(params) if p.seed is not None}
    return SamplingMetadata.build(params, [[1]] * len(params), outputs, generators, vocab_size)


def test_one_pass_samples_every_row_once_and_draws_each_generator_once():
    vocab_size, params, outputs, drafts, query_start_loc, flat_logits = _one_pass_case()
    spec = SpecDecodeMetadata.build(drafts, query_start_loc)
    assert spec.rows == [0, 1] and spec.target_logits_indices == [0, 1, 3]
    bonus_logits = flat_logits[[2, 4, 5]]               # each row's last scheduled position

    sampler = Sampler()
    sampler_calls = []
    sampler.register_forward_hook(lambda module, args, out: sampler_calls.append(args[1]))
    metadata = _metadata(params, outputs, vocab_size)
    result = RejectionSampler(sampler)(spec, None, bonus_logits.clone(), flat_logits[spec.target_logits_indices],
                                       metadata)
    assert len(sampler_calls) == 1       # one pass: every row sampled once, a row with drafts gets its bonus
    assert sampler_calls[0].output_token_ids == [[4, 5, 2, 3], [6, 8], [7]]   # the bonus sees all its drafts
    assert outputs == [[4, 5], [6], [7]]                                      # the live lists are untouched

    # The same step done by hand: the bonus pass, p at each draft position, then the rejection test.
    expected_metadata = _metadata(params, outputs, vocab_size)
    bonus = Sampler()(bonus_logits.clone(), dataclasses.replace(
        expected_metadata, output_token_ids=[[4, 5, 2, 3], [6, 8], [7]])).sampled_token_ids
    assert result.sampler_output.sampled_token_ids.tolist() == bonus.tolist()
    target = []
    for flat_row, row, history in ((0, 0, [4, 5]), (1, 0, [4, 5, 2]), (3, 1, [6])):
        logits = torch.zeros(3, vocab_size)
        logits[row] = flat_logits[flat_row]
        history_rows = [list(o) for o in outputs]
        history_rows[row] = history
        target.append(Sampler().compute_probs(logits, dataclasses.replace(expected_metadata,
                                                                          output_token_ids=history_rows))[row])
    expected = rejection_sample(torch.tensor([2, 3, 8]), [2, 1], None, torch.stack(target), bonus[[0, 1]],
                                torch.tensor([False, True]), {0: expected_metadata.generators[0]})
    assert result.token_ids == dict(zip([0, 1], RejectionSampler.parse_output(expected), strict=False))
    assert result.token_ids[1] == ([8, int(bonus[1])] if target[2].argmax() == 8 else [int(target[2].argmax())])

    # No generator was rewound or drawn twice: row 0 drew its bonus race (V), its uniforms (2), its recovery
    # race (V); row 2, without drafts, only its race.
    for row, draws in ((0, (vocab_size, 2, vocab_size)), (2, (vocab_size,))):
        reference = torch.Generator().manual_seed(params[row].seed)
        for count in draws:
            torch.empty(count).uniform_(generator=reference)
        assert torch.equal(metadata.generators[row].get_state(), reference.get_state()), row


def test_one_pass_logprobs_are_the_raw_target_logprobs_of_each_emitted_token():
    vocab_size, params, outputs, drafts, query_start_loc, flat_logits = _one_pass_case()
    spec = SpecDecodeMetadata.build(drafts, query_start_loc)
    result = RejectionSampler(Sampler())(spec, None, flat_logits[[2, 4, 5]].clone(),
                                         flat_logits[spec.target_logits_indices], _metadata(params, outputs,
                                                                                            vocab_size))
    assert set(result.logprobs) == {0, 1}
    for row, first_flat, wanted in ((0, 0, 2), (1, 3, 1)):
        emitted = result.token_ids[row]
        raw = flat_logits[first_flat: first_flat + len(emitted)].log_softmax(-1)
        assert len(result.logprobs[row]) == len(emitted)
        for position, (token, entry) in enumerate(zip(emitted, result.logprobs[row], strict=False)):
            assert token in entry and len(entry) <= wanted + 1
            assert abs(entry[token] - float(raw[position, token])) < 1e-5
            assert set(raw[position].topk(wanted).indices.tolist()) <= set(entry)
