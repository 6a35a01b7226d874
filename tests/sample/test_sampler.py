"""Sampler end to end on hand-made logits (after vLLM tests/v1/sample/test_sampler.py, test_logprobs.py,
test_topk_topp_sampler.py): each parameter's semantics, sampling frequencies, seeds, logprobs, -inf rows."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mini.sample.ops.topk_topp as topk_topp_ops
import mini.sample.ops.topk_topp_sampler as sampler_ops
from mini import roles
from mini.config import EngineConfig
from mini.sample import Sampler, SamplingMetadata, logprobs_to_dicts
from mini.sample.logits_processor import LogitsProcessor, build_logitsprocs
from mini.sample.logits_processor.interface import BatchUpdate
from mini.sample.sampler import ReferenceSampler
from mini.sampling_params import SamplingParams

NEG_INF = -float("inf")
BOTH_PATHS = pytest.mark.parametrize("sampler_class", [Sampler, ReferenceSampler], ids=["fused", "reference"])


def build(params, vocab_size, prompts=None, outputs=None, generators=None, logitsprocs=None):
    rows = len(params)
    return SamplingMetadata.build(params, prompts or [[] for _ in range(rows)],
                                  outputs if outputs is not None else [[] for _ in range(rows)],
                                  generators or {}, vocab_size, "cpu", logitsprocs)


def sample(logits, params, sampler_class=Sampler, **kwargs):
    metadata = build(params, logits.shape[1], **kwargs)
    return sampler_class()(logits.clone(), metadata)


def chi_square_ok(samples: torch.Tensor, expected_probs: torch.Tensor) -> None:
    """Observed counts match expected probabilities (bound ~ the 99.99% quantile); none outside support."""
    counts = torch.bincount(samples, minlength=expected_probs.numel()).double()
    expected = expected_probs.double() * samples.numel()
    support = expected > 0
    assert counts[~support].sum() == 0, f"sampled outside the support: {counts[~support].nonzero().tolist()}"
    stat = ((counts[support] - expected[support]) ** 2 / expected[support]).sum().item()
    dof = max(1, int(support.sum()) - 1)
    bound = dof + 5 * math.sqrt(2 * dof) + 5
    assert stat < bound, (stat, counts[support].tolist(), expected[support].tolist())


def expected_distribution(logits_row, temperature, top_k, top_p):
    k = None if top_k == 0 else torch.tensor([top_k])
    p = None if top_p == 1.0 else torch.tensor([top_p])
    masked = topk_topp_ops.apply_top_k_top_p((logits_row / temperature).unsqueeze(0).clone(), k, p)
    return masked.softmax(-1)[0]


def test_greedy_takes_the_argmax_and_mixes_with_random_rows():
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_k=1),
              SamplingParams(temperature=0.0), SamplingParams(temperature=0.9, top_k=3),
              SamplingParams(temperature=0.0), SamplingParams(temperature=1.3)]
    out = sample(logits, params).sampled_token_ids
    assert out.dtype == torch.int64 and out.shape == (6,)
    argmax = logits.argmax(-1)
    assert out[[0, 2, 4]].tolist() == argmax[[0, 2, 4]].tolist()
    assert out[1] == argmax[1]  # top_k=1 is greedy in effect
    assert out[3].item() in logits[3].topk(3).indices.tolist()


@BOTH_PATHS
@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [
    (1.0, 0, 1.0), (0.6, 0, 1.0), (1.0, 3, 1.0), (1.4, 0, 0.7), (0.8, 4, 0.6), (1.0, 0, 0.97),
])
def test_sampling_frequencies_match_the_truncated_softmax(sampler_class, temperature, top_k, top_p, monkeypatch):
    monkeypatch.setattr(sampler_ops, "FIRST_WINDOW", 4)  # small window: exercises growth and fallback
    vocab_size, num_rows = 64, 6000
    gen = torch.Generator().manual_seed(1234)
    base = torch.full((vocab_size,), -3.0)
    base[:8] = torch.tensor([2.0, 1.5, 1.2, 1.0, 0.5, 0.3, 0.0, -0.5])
    base = base[torch.randperm(vocab_size, generator=gen)]
    logits = base.expand(num_rows, vocab_size).contiguous()
    params = [SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)] * num_rows
    torch.manual_seed(99)
    out = sample(logits, params, sampler_class=sampler_class).sampled_token_ids
    chi_square_ok(out, expected_distribution(base, temperature, top_k, top_p))


@BOTH_PATHS
def test_seeded_request_gets_the_same_tokens_alone_and_batched(sampler_class):
    vocab_size = 600
    gen = torch.Generator().manual_seed(5)
    steps = [torch.randn(8, vocab_size, generator=gen) * 2 for _ in range(4)]
    seeded = SamplingParams(temperature=0.9, top_p=0.9, seed=42)

    def run(row_of_seeded, batch_rows):
        generator = torch.Generator().manual_seed(42)
        tokens = []
        for logits in steps:
            params = [SamplingParams(temperature=1.0, top_k=5)] * batch_rows
            params[row_of_seeded] = seeded
            batch = logits[:batch_rows].clone()
            batch[row_of_seeded] = logits[7]
            out = sample(batch, params, sampler_class=sampler_class, generators={row_of_seeded: generator})
            tokens.append(out.sampled_token_ids[row_of_seeded].item())
        return tokens

    alone = run(0, 1)
    assert run(3, 6) == alone
    assert run(5, 8) == alone


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.integers(0, 2**31 - 1), st.sampled_from([1, 2, 3, 64]))
def test_fused_path_only_samples_inside_the_native_kept_set(seed, first_window):
    gen = torch.Generator().manual_seed(seed)
    vocab_size, repeats = 200, 50
    scales = torch.tensor([[0.5], [1.0], [2.0], [4.0], [8.0], [1.0]])
    logits = torch.randn(6, vocab_size, generator=gen) * scales
    logits[5, :4] = 3.0  # exact ties
    k = torch.randint(0, 40, (6,), generator=gen)
    p = torch.rand(6, generator=gen).clamp(min=0.05)
    p[torch.rand(6, generator=gen) < 0.3] = 1.0
    kept = torch.isfinite(topk_topp_ops.apply_top_k_top_p(logits.clone(), k, p))
    saved, sampler_ops.FIRST_WINDOW = sampler_ops.FIRST_WINDOW, first_window
    try:
        out = sampler_ops.sample_fused(logits.repeat_interleave(repeats, 0), k.repeat_interleave(repeats),
                                       p.repeat_interleave(repeats), {})
    finally:
        sampler_ops.FIRST_WINDOW = saved
    rows = torch.arange(6).repeat_interleave(repeats)
    # Among exactly tied logits top-p keeps an arbitrary subset (as in vLLM): compare by value and count.
    lowest_kept = torch.where(kept, logits, float("inf")).amin(dim=1)
    assert (logits[rows, out] >= lowest_kept[rows]).all()
    for row in range(6):
        assert len(set(out[rows == row].tolist())) <= int(kept[row].sum())


def test_fused_and_native_paths_draw_the_same_seeded_tokens(monkeypatch):
    monkeypatch.setattr(sampler_ops, "FIRST_WINDOW", 8)
    gen = torch.Generator().manual_seed(6)
    logits = torch.randn(12, 400, generator=gen) * 3
    params = [SamplingParams(temperature=0.8, top_k=[0, 5, 30, 0][i % 4], top_p=[0.9, 1.0, 0.8, 0.99][i % 4],
                             seed=i) for i in range(12)]
    results = []
    for sampler_class in (Sampler, ReferenceSampler):
        generators = {i: torch.Generator().manual_seed(i) for i in range(12)}
        results.append(sample(logits, params, sampler_class=sampler_class, generators=generators).sampled_token_ids)
    assert torch.equal(results[0], results[1])


def test_a_sampler_built_with_a_replaced_part_calls_it_on_the_reference_pipeline():
    """`roles.resolve(config, Sampler)` with a part replaced gives the reference sampler's subclass holding it
    (the step-by-step draw, no fused window), so the replacement runs, and `compute_probs` walks the same
    pipeline; with none replaced, the fast Sampler itself."""
    calls = []
    originals = {name: roles.reference(name) for name in ("apply_temperature", "apply_top_k_top_p",
                                                          "random_sample", "apply_all_penalties", "gather_logprobs")}

    def spy(name):
        def part(*args):
            calls.append(name)
            return originals[name](*args)
        return part

    assert roles.resolve(EngineConfig(), Sampler) is Sampler
    sampler = roles.resolve(EngineConfig(parts={name: spy(name) for name in originals}), Sampler)()
    assert type(sampler).__bases__ == (ReferenceSampler,) and isinstance(sampler, Sampler)
    logits = torch.randn(3, 20)
    params = [SamplingParams(temperature=1.0, top_k=2, logprobs=1, presence_penalty=0.5)] * 3
    out = sampler(logits.clone(), build(params, 20, outputs=[[1], [2], [3]])).sampled_token_ids
    assert calls == ["apply_all_penalties", "apply_temperature", "apply_top_k_top_p", "random_sample",
                     "gather_logprobs"]
    penalized = logits.clone()   # the presence penalty lowers each row's one output token (1, 2, 3) first
    for row, token in enumerate([1, 2, 3]):
        penalized[row, token] -= 0.5
    assert all(t in penalized[i].topk(2).indices.tolist() for i, t in enumerate(out.tolist())), \
        (out.tolist(), penalized.topk(2).indices.tolist())
    calls.clear()
    probs = sampler.compute_probs(logits.clone(), build(params, 20, outputs=[[1], [2], [3]]))
    assert calls == ["apply_all_penalties", "apply_temperature", "apply_top_k_top_p"]
    torch.testing.assert_close(probs, Sampler().compute_probs(logits.clone(), build(params, 20,
                                                                                   outputs=[[1], [2], [3]])))


@pytest.mark.parametrize("seeded", [False, True])
def test_compute_probs_is_the_distribution_sample_draws_from(seeded):
    """`compute_probs` and `sample` share one pipeline: the native draw from `compute_probs`' rows with the same
    generators gives the very tokens `sample` gives (greedy rows: the one-hot's token)."""
    torch.manual_seed(5)
    logits = torch.randn(6, 40) * 2
    params = [SamplingParams(temperature=0.0, repetition_penalty=1.4), SamplingParams(temperature=0.8, top_k=5),
              SamplingParams(temperature=1.2, top_p=0.7, min_p=0.05), SamplingParams(temperature=0.0),
              SamplingParams(temperature=0.6, logit_bias={3: 2.0}), SamplingParams(temperature=1.0, top_k=9, top_p=0.9)]
    outputs = [[1, 2], [3], [], [4, 4], [5], []]
    seeds = {row: 100 + row for row in (1, 2, 4, 5)} if seeded else {}

    def generators():
        return {row: torch.Generator().manual_seed(seed) for row, seed in seeds.items()}

    probs = Sampler().compute_probs(logits.clone(), build(params, 40, outputs=outputs, generators=generators()))
    assert torch.allclose(probs.sum(-1), torch.ones(6))
    sampled = ReferenceSampler()(logits.clone(), build(params, 40, outputs=outputs,
                                                             generators=generators())).sampled_token_ids
    assert probs[[0, 3]].max(-1).values.tolist() == [1.0, 1.0]
    assert sampled[[0, 3]].tolist() == probs[[0, 3]].argmax(-1).tolist()
    assert bool((probs.gather(1, sampled.view(-1, 1)) > 0).all())
    if seeded:
        redrawn = sampler_ops.random_sample(probs.clone(), generators())
        assert sampled[list(seeds)].tolist() == redrawn[list(seeds)].tolist()


def test_logprobs_are_raw_top_n_plus_the_sampled_token():
    torch.manual_seed(3)
    logits = torch.randn(4, 30)
    params = [SamplingParams(temperature=0.0, logprobs=3, repetition_penalty=2.0),
              SamplingParams(temperature=1.0, top_k=4, logprobs=0),
              SamplingParams(temperature=0.0),
              SamplingParams(temperature=0.7, logprobs=1)]
    out = sample(logits, params, prompts=[[int(logits[0].argmax())], [], [], []])
    lp = out.logprobs_tensors
    assert lp.logprob_token_ids.shape == (4, 4) and lp.logprobs.shape == (4, 4)
    raw = logits.log_softmax(-1)  # raw: before penalties and temperature
    sampled = out.sampled_token_ids
    assert torch.equal(lp.logprob_token_ids[:, 0], sampled)
    assert torch.allclose(lp.logprobs[:, 0], raw.gather(1, sampled.unsqueeze(1)).squeeze(1))
    top = raw.topk(3, dim=-1)
    assert torch.equal(lp.logprob_token_ids[:, 1:], top.indices)
    assert torch.allclose(lp.logprobs[:, 1:], top.values)
    ranks = (raw >= raw.gather(1, sampled.unsqueeze(1))).sum(-1)
    assert torch.equal(lp.selected_token_ranks, ranks)
    # The repetition penalty moved row 0's greedy choice away from the raw argmax: rank 2 or worse.
    assert sampled[0] != logits[0].argmax() and lp.selected_token_ranks[0] >= 2
    dicts = logprobs_to_dicts(lp, [3, 0, None, 1])
    assert dicts[2] is None
    assert len(dicts[1]) == 1 and sampled[1].item() in dicts[1]
    assert set(dicts[0]) == {sampled[0].item(), *top.indices[0].tolist()}
    assert set(dicts[3]) <= {sampled[3].item(), top.indices[3, 0].item()} and len(dicts[3]) >= 1


def test_no_logprobs_requested_gives_none_and_minus_one_means_whole_vocab():
    logits = torch.randn(2, 10)
    assert sample(logits, [SamplingParams()] * 2).logprobs_tensors is None
    lp = sample(logits, [SamplingParams(logprobs=-1), SamplingParams()]).logprobs_tensors
    assert lp.logprobs.shape == (2, 11)


@BOTH_PATHS
def test_allowed_token_ids_restrict_every_row(sampler_class):
    torch.manual_seed(4)
    logits = torch.randn(200, 40)
    params = [SamplingParams(temperature=1.5, allowed_token_ids=[3, 7, 11])] * 100 + [SamplingParams(
        temperature=0.0, allowed_token_ids=[5, 6])] * 100
    out = sample(logits, params, sampler_class=sampler_class).sampled_token_ids
    assert set(out[:100].tolist()) <= {3, 7, 11}
    expected_greedy = torch.where(logits[100:, 5] >= logits[100:, 6], 5, 6)
    assert torch.equal(out[100:], expected_greedy)


def test_bad_words_ban_single_tokens_and_completions_of_prefixes():
    logits = torch.zeros(3, 10)
    logits[:, 4] = 5.0
    logits[:, 2] = 4.0
    params = [SamplingParams(temperature=0.0) for _ in range(3)]
    params[0]._bad_words_token_ids = [[4]]
    params[1]._bad_words_token_ids = [[1, 4]]
    params[2]._bad_words_token_ids = [[1, 4]]
    out = sample(logits, params, outputs=[[], [7, 1], [1, 7]]).sampled_token_ids
    assert out.tolist() == [2, 2, 4]


def test_logit_bias_can_move_the_argmax():
    logits = torch.tensor([[3.0, 1.0, 0.0], [3.0, 1.0, 0.0]])
    params = [SamplingParams(temperature=0.0, logit_bias={2: 5.0}), SamplingParams(temperature=0.0)]
    assert sample(logits, params).sampled_token_ids.tolist() == [2, 0]


def test_min_tokens_masks_stop_tokens_until_reached():
    logits = torch.tensor([[5.0, 1.0, 0.0, 4.0]] * 3)
    stop = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[0])
    stop.update_from_eos(3)  # EOS is held back too
    outputs = [[], [1], [1, 2]]
    out = sample(logits, [stop, stop, stop], outputs=outputs).sampled_token_ids
    assert out.tolist() == [1, 1, 0]


def test_min_p_drops_unlikely_tokens():
    torch.manual_seed(5)
    base = torch.log(torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05]))
    logits = base.expand(4000, 5).contiguous()
    out = sample(logits, [SamplingParams(temperature=1.0, min_p=0.3)] * 4000).sampled_token_ids
    # threshold 0.3 * 0.4 = 0.12: tokens 3 and 4 must never appear
    chi_square_ok(out, torch.tensor([0.4, 0.3, 0.15, 0.0, 0.0]) / 0.85)


class MaskArgmaxButClaimInvariant(LogitsProcessor):
    """A (deliberately lying) argmax-invariant processor: it bans each row's argmax."""

    def __init__(self, vllm_config, device, is_pin_memory):
        self.calls = 0

    def is_argmax_invariant(self):
        return True

    def update_state(self, batch_update):
        pass

    def apply(self, logits):
        self.calls += 1
        return logits.scatter(1, logits.argmax(-1, keepdim=True), NEG_INF)


def test_argmax_invariant_processors_are_skipped_for_all_greedy_batches_and_after_greedy_argmax():
    torch.manual_seed(6)
    logits = torch.randn(4, 12)
    procs = build_logitsprocs([MaskArgmaxButClaimInvariant], 12)
    custom = procs.argmax_invariant[-1]
    greedy = [SamplingParams(temperature=0.0)] * 4
    out = sample(logits, greedy, logitsprocs=procs).sampled_token_ids
    assert custom.calls == 0 and torch.equal(out, logits.argmax(-1))
    mixed = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)] * 2
    out = sample(logits, mixed, logitsprocs=procs).sampled_token_ids
    assert custom.calls == 1
    assert torch.equal(out[[0, 2]], logits.argmax(-1)[[0, 2]])  # greedy rows chose before the processor
    assert (out[[1, 3]] != logits.argmax(-1)[[1, 3]]).all()  # random rows saw the mask


def test_penalties_reach_the_sampler_and_output_lists_are_read_live():
    logits = torch.tensor([[2.0, 1.9, 0.0]])
    params = [SamplingParams(temperature=0.0, frequency_penalty=1.0)]
    outputs = [[]]
    metadata = build(params, 3, outputs=outputs)
    sampler = Sampler()
    assert sampler(logits.clone(), metadata).sampled_token_ids.item() == 0
    outputs[0].append(0)  # the request generated token 0; the same metadata sees it by reference
    assert sampler(logits.clone(), metadata).sampled_token_ids.item() == 1


@BOTH_PATHS
def test_mostly_and_entirely_minus_inf_rows(sampler_class, monkeypatch):
    monkeypatch.setattr(sampler_ops, "FIRST_WINDOW", 2)
    vocab_size = 32
    logits = torch.full((6, vocab_size), NEG_INF)
    logits[0, 9] = 0.0
    logits[1, [3, 4]] = torch.tensor([1.0, 1.0])
    logits[3, 17] = -5.0
    logits[5, [1, 30]] = torch.tensor([-1.0, 2.0])
    params = [SamplingParams(temperature=1.0, top_k=5, top_p=0.5), SamplingParams(temperature=0.7, top_p=0.9),
              SamplingParams(temperature=1.0, top_k=3), SamplingParams(temperature=0.0),
              SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)]
    for _ in range(20):
        out = sample(logits, params, sampler_class=sampler_class).sampled_token_ids
        assert out[0] == 9 and out[1] in (3, 4) and out[3] == 17 and out[5] in (1, 30)
        assert ((out >= 0) & (out < vocab_size)).all()


def test_bad_input_raises_value_error():
    params = [SamplingParams()]
    with pytest.raises(ValueError, match="one entry per row"):
        SamplingMetadata.build(params, [[], []], [[]], {}, 10)
    with pytest.raises(ValueError, match="generators"):
        SamplingMetadata.build(params, [[]], [[]], {3: torch.Generator()}, 10)
    with pytest.raises(ValueError, match="allowed_token_ids"):
        SamplingMetadata.build([SamplingParams(allowed_token_ids=[10])], [[]], [[]], {}, 10)
    with pytest.raises(ValueError, match="vocab_size"):
        SamplingMetadata.build(params, [[]], [[]], {}, 0)
    with pytest.raises(ValueError, match="logits must be"):
        Sampler()(torch.zeros(2, 10), build(params, 10))


def test_metadata_fields_are_none_when_unused_and_packed_otherwise():
    md = build([SamplingParams(temperature=0.0)] * 3, 50)
    assert md.all_greedy and md.temperature is None and md.top_k is None and md.top_p is None
    assert md.no_penalties and md.prompt_token_ids is None and md.max_num_logprobs is None
    params = [SamplingParams(temperature=0.5, top_k=10, seed=1), SamplingParams(temperature=0.0),
              SamplingParams(top_p=0.5, presence_penalty=1.0, logprobs=2)]
    generators = {0: torch.Generator().manual_seed(1), 1: torch.Generator()}
    md = build(params, 50, prompts=[[1, 2], [3], []], generators=generators)
    assert not md.all_greedy and not md.all_random
    assert md.top_k.tolist() == [10, 50, 50] and md.top_p.tolist() == [1.0, 1.0, 0.5]
    assert md.prompt_token_ids.tolist() == [[1, 2], [3, 50], [50, 50]]
    assert md.max_num_logprobs == 2 and md.num_logprobs == [None, None, 2]
    assert set(md.generators) == {0}  # a greedy row never draws


def test_logitsprocs_passed_in_are_used_as_is():
    procs = build_logitsprocs(None, 5)
    biased = SamplingParams(temperature=0.0, logit_bias={4: 50.0})
    procs.update_state(BatchUpdate(1, [], [(0, biased, [], [])], []))
    # The row's own params say nothing about bias: the persistent processors decide.
    out = sample(torch.zeros(1, 5), [SamplingParams(temperature=0.0)], logitsprocs=procs)
    assert out.sampled_token_ids.tolist() == [4]


def test_greedy_sample_picks_the_first_of_tied_maxima_like_argmax():
    from mini.sample.sampler import greedy_sample

    generator = torch.Generator().manual_seed(0)
    logits = torch.randint(0, 3, (64, 40), generator=generator).float()  # many ties per row
    logits[5] = float("-inf")
    assert torch.equal(greedy_sample(logits), logits.argmax(dim=-1))
