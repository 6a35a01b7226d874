"""Mirrors vllm/v1/sample/rejection_sampler.py: verify a batch of draft tokens against the target model.

Speculative decoding (Leviathan et al. 2023, arXiv:2211.17192; Chen et al. 2023) lets a cheap drafter
guess k tokens, runs the target model once over all of them, and keeps a prefix of the guesses, such that
every emitted token is distributed exactly as if the target had sampled it alone. Per request, walking
its drafts x_1..x_k in order, with p the target's and q the drafter's distribution at each position:

* random rows accept x with probability min(1, p(x) / q(x)). mini draws u ~ Uniform[0, 1) and accepts
  iff q(x) > 0 and u * q(x) < p(x) (the division-free form of vLLM's `p / q >= u`; q(x) = 0 rejects, as
  in vLLM, and the strict `<` never accepts a token with p(x) = 0);
* at the first rejection the row emits a "recovered" token drawn from the residual max(0, p - q)
  normalised (`compute_residual_probs`) and stops: P(emit y) = q(y) min(1, p/q) + P(reject) residual(y)
  = p(y), so the output follows p whatever q is;
* greedy rows accept while x == argmax p, and on the first mismatch emit argmax p;
* a row that accepts all its drafts appends its bonus token (sampled by the ordinary sampler from the
  target's distribution at the position after the last draft).

`draft_probs=None` means a deterministic drafter (n-gram, argmax drafts): q is one-hot at the draft, so
a draft is accepted with probability p(x) and the residual is p with the draft token zeroed.

Randomness: uniforms for every draft token, and for the recovered tokens one Exp(1) vector per request
raced against the residual (argmax(residual / E), as vLLM's `sample_recovered_tokens`): only the first
rejection's recovered token is ever used, so a row can share one race across its positions. A row in
`generators` draws its uniforms, then its race, from its own generator (and nothing when it has no
drafts), so a seeded request's output does not depend on the rest of the batch. vLLM does this in Triton
kernels; here it is torch, vectorised over the flat draft tokens, with `[B, max_k]` padded views.

`RejectionSampler` (vLLM's class of the same name) runs one step's verification in one pass: the sampler
samples every row of the batch once, from its last scheduled position (a row with drafts: its bonus
token, with the drafts already in its output history, as vLLM's `predict_bonus_token`), then the target's
distribution p at every draft position comes from the same sampler pipeline (`Sampler.compute_probs`),
and `rejection_sample` decides. No generator is drawn from twice or rewound: a seeded row with drafts
draws its bonus race, then its uniforms, then its recovery race. It holds `compute_residual_probs` and
`rejection_sample`, the two parts of the sampler role it owns (mini/roles.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from mini.sample.logprobs import compute_logprobs, logprobs_to_dicts
from mini.sample.metadata import SamplingMetadata
from mini.sample.ops.topk_topp_sampler import exponentials_
from mini.sample.sampler import Sampler, SamplerOutput
from mini.sampling_params import SAMPLING_EPS
from mini.spec_decode.metadata import SpecDecodeMetadata

PLACEHOLDER_TOKEN_ID = -1


def draft_distribution(draft_probs: torch.Tensor | None, draft_token_ids: torch.Tensor,
                       vocab_size: int) -> torch.Tensor:
    """q: `draft_probs` as float32, or a one-hot row at each draft token when the drafter gives none."""
    if draft_probs is not None:
        return draft_probs.to(torch.float32)
    one_hot = torch.zeros(draft_token_ids.shape[0], vocab_size, dtype=torch.float32,
                          device=draft_token_ids.device)
    return one_hot.scatter_(1, draft_token_ids.view(-1, 1), 1.0)


def compute_residual_probs(target_probs: torch.Tensor, draft_probs: torch.Tensor | None,
                           draft_token_ids: torch.Tensor) -> torch.Tensor:
    """[N, V] float32: max(0, p - q) normalised per row. q = draft_probs, or one-hot at draft_token_ids
    when draft_probs is None (a deterministic drafter: n-gram, argmax drafts). A row whose residual is all
    zero (p == q) -> fall back to p (it can only be reached with probability 0; keep it finite)."""
    target = target_probs.to(torch.float32)
    draft = draft_distribution(draft_probs, draft_token_ids, target.shape[-1]).to(target.device)
    residual = (target - draft).clamp_min_(0.0)
    mass = residual.sum(dim=-1, keepdim=True)
    empty = mass <= 0.0
    return torch.where(empty, target, residual / torch.where(empty, 1.0, mass))


def _draw_randomness(num_draft_tokens: list[int], vocab_size: int, draws_rows: torch.Tensor,
                     generators: dict[int, torch.Generator], device: torch.device
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """uniforms [T] and exponential races [B, V]; seeded rows redraw theirs from their own generator."""
    uniforms = torch.rand(sum(num_draft_tokens), dtype=torch.float32, device=device)
    races = exponentials_(torch.empty(len(num_draft_tokens), vocab_size, dtype=torch.float32, device=device))
    starts = [0]
    for count in num_draft_tokens:
        starts.append(starts[-1] + count)
    for row in sorted(generators):
        if num_draft_tokens[row] == 0 or not bool(draws_rows[row]):
            continue                        # nothing drawn: the seeded stream stays where it was
        uniforms[starts[row]:starts[row + 1]].uniform_(generator=generators[row])
        exponentials_(races[row], generators[row])
    return uniforms, races


def _to_padded(flat: torch.Tensor, row_of_token: torch.Tensor, position: torch.Tensor,
               shape: tuple[int, int], fill: int | bool) -> torch.Tensor:
    """Scatter per-draft values [T] into a [B, width] table (row, position within the row)."""
    padded = torch.full(shape, fill, dtype=flat.dtype, device=flat.device)
    padded[row_of_token, position] = flat
    return padded


def rejection_sample(
    draft_token_ids: torch.Tensor,
    num_draft_tokens: list[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    is_greedy: torch.Tensor,
    generators: dict[int, torch.Generator],
    *,
    compute_residual_probs=compute_residual_probs,
) -> torch.Tensor:
    """Verify every request's drafts; int64 [B, max(num_draft_tokens) + 1], padded with PLACEHOLDER_TOKEN_ID.

    draft_token_ids int64 [T] (all requests' drafts back to back, T = sum(num_draft_tokens));
    num_draft_tokens [B] (0 allowed: that row emits only its bonus token); draft_probs float32 [T, V] or
    None (one-hot drafts); target_probs float32 [T, V] (already processed: temperature, top-k/p, ...);
    bonus_token_ids int64 [B]; is_greedy bool [B]; generators: batch row -> that request's generator.
    Row b holds its accepted drafts, then either the token emitted at the first rejection or the bonus.
    """
    batch_size, num_tokens = len(num_draft_tokens), int(draft_token_ids.shape[0])
    if sum(num_draft_tokens) != num_tokens or min(num_draft_tokens, default=0) < 0:
        raise ValueError(f"num_draft_tokens {num_draft_tokens} must be >= 0 and sum to len(draft_token_ids) "
                         f"= {num_tokens}")
    if target_probs.dim() != 2 or target_probs.shape[0] != num_tokens:
        raise ValueError(f"target_probs must be [T={num_tokens}, V], got {tuple(target_probs.shape)}")
    if draft_probs is not None and draft_probs.shape != target_probs.shape:
        raise ValueError(f"draft_probs must be None or {tuple(target_probs.shape)}, got {tuple(draft_probs.shape)}")
    if bonus_token_ids.numel() != batch_size or is_greedy.numel() != batch_size:
        raise ValueError(f"bonus_token_ids and is_greedy need one entry per request ({batch_size})")
    device, vocab_size = target_probs.device, target_probs.shape[1]
    max_drafts = max(num_draft_tokens, default=0)
    draft_token_ids = draft_token_ids.to(device=device, dtype=torch.int64)
    is_greedy = is_greedy.to(device=device, dtype=torch.bool).view(-1)
    bonus_token_ids = bonus_token_ids.to(device=device, dtype=torch.int64).view(-1)

    # Where each flat draft sits: its request (row) and its position within the request.
    counts = torch.tensor(num_draft_tokens, dtype=torch.int64, device=device)
    row_of_token = torch.repeat_interleave(torch.arange(batch_size, device=device), counts)
    row_starts = torch.cumsum(counts, dim=0) - counts
    position = torch.arange(num_tokens, device=device) - row_starts[row_of_token]

    # Accept test and the token to emit on rejection, per flat draft token.
    target_argmax = target_probs.argmax(dim=-1)
    uniforms, races = _draw_randomness(num_draft_tokens, vocab_size, ~is_greedy, generators, device)
    target_prob_of_draft = target_probs.gather(1, draft_token_ids.view(-1, 1)).view(-1).to(torch.float32)
    if draft_probs is None:
        draft_prob_of_draft = torch.ones_like(target_prob_of_draft)
    else:
        draft_prob_of_draft = draft_probs.gather(1, draft_token_ids.view(-1, 1)).view(-1).to(torch.float32)
    random_accept = (draft_prob_of_draft > 0) & (uniforms * draft_prob_of_draft < target_prob_of_draft)
    residual = compute_residual_probs(target_probs, draft_probs, draft_token_ids)
    recovered = (residual / races[row_of_token]).argmax(dim=-1)
    token_is_greedy = is_greedy[row_of_token]
    accepted = torch.where(token_is_greedy, draft_token_ids == target_argmax, random_accept)
    on_reject = torch.where(token_is_greedy, target_argmax, recovered)

    # Per request: the accepted prefix is as long as the run of accepts from position 0.
    shape = (batch_size, max_drafts + 1)
    accepted_table = _to_padded(accepted, row_of_token, position, shape, False)
    num_accepted = accepted_table.to(torch.int64).cumprod(dim=1).sum(dim=1)
    drafts_table = _to_padded(draft_token_ids, row_of_token, position, shape, PLACEHOLDER_TOKEN_ID)
    reject_table = _to_padded(on_reject, row_of_token, position, shape, PLACEHOLDER_TOKEN_ID)

    columns = torch.arange(max_drafts + 1, device=device)
    output = torch.where(columns < num_accepted.view(-1, 1), drafts_table, PLACEHOLDER_TOKEN_ID)
    rows = torch.arange(batch_size, device=device)
    rejected = num_accepted < counts
    output[rows, num_accepted] = torch.where(rejected, reject_table[rows, num_accepted], bonus_token_ids)
    return output


def outputs_with_drafts(output_token_ids: list[int], drafts: list[int]) -> list[int]:
    """A row's output history as the position after `drafts` sees it: the tokens so far, then the drafts."""
    return output_token_ids + drafts if drafts else output_token_ids


@dataclass(slots=True)
class RejectionSamplerOutput:
    """One verification step: the sampler's pass over every row, and what each row with drafts emits."""

    sampler_output: SamplerOutput             # every row's token (a row with drafts: its bonus token)
    token_ids: dict[int, list[int]]           # batch row with drafts -> accepted drafts + recovered or bonus
    logprobs: dict[int, list[dict[int, float]]]  # the same rows, when they ask `logprobs`: one dict per token


class RejectionSampler(nn.Module):
    """Mirrors vllm/v1/sample/rejection_sampler.py `RejectionSampler`: the sampler samples every row once (the
    bonus tokens), the rejection test keeps a prefix of each row's drafts. `parse_output` gives each row's
    tokens as a list."""

    compute_residual_probs = staticmethod(compute_residual_probs)
    rejection_sample = staticmethod(rejection_sample)

    def __init__(self, sampler: Sampler) -> None:
        super().__init__()
        self.sampler = sampler

    def forward(self, spec: SpecDecodeMetadata, draft_probs: torch.Tensor | None, logits: torch.Tensor,
                target_logits: torch.Tensor, metadata: SamplingMetadata) -> RejectionSamplerOutput:
        """`logits` [B, V]: every row's last scheduled position (a row with drafts: its bonus position);
        `target_logits` [T, V]: the draft positions (`spec.target_logits_indices`); `draft_probs` [T, V] or
        None (one-hot drafts); `metadata`: the step's SamplingMetadata. May edit `logits` in place."""
        outputs = list(metadata.output_token_ids)
        for row, drafts in zip(spec.rows, spec.draft_token_ids, strict=False):
            outputs[row] = outputs_with_drafts(outputs[row], drafts)
        sampler_output = self.sampler(logits, dataclasses.replace(metadata, output_token_ids=outputs))
        target_logits = target_logits.to(torch.float32)
        output = self.rejection_sample(
            spec.flat_draft_token_ids(target_logits.device), spec.num_draft_tokens, draft_probs,
            self.target_probs(spec, target_logits, metadata), sampler_output.sampled_token_ids[spec.rows],
            self.rows_are_greedy(metadata, spec.rows, target_logits.device),
            {entry: metadata.generators[row] for entry, row in enumerate(spec.rows) if row in metadata.generators})
        token_ids = dict(zip(spec.rows, self.parse_output(output), strict=False))
        return RejectionSamplerOutput(sampler_output, token_ids,
                                      self.emitted_logprobs(spec, target_logits, sampler_output, metadata, token_ids))

    def target_probs(self, spec: SpecDecodeMetadata, target_logits: torch.Tensor,
                     metadata: SamplingMetadata) -> torch.Tensor:
        """float32 [T, V]: p at every draft position, what the sampler would have drawn from had the request
        decoded its drafts one step at a time: the same processors, and penalties that see the drafts before
        the position as output already. One full-batch `compute_probs` per position j (the processors and
        penalty tensors are indexed by batch row); rows with no draft at j are zeros and ignored."""
        probs = torch.empty_like(target_logits)
        starts = spec.draft_starts
        for position in range(spec.max_spec_len):
            entries = [entry for entry, drafts in enumerate(spec.draft_token_ids) if position < len(drafts)]
            rows = [spec.rows[entry] for entry in entries]
            flat = [starts[entry] + position for entry in entries]
            logits = target_logits.new_zeros(metadata.num_rows, target_logits.shape[1])
            logits[rows] = target_logits[flat]
            outputs = list(metadata.output_token_ids)
            for entry, row in zip(entries, rows, strict=False):
                outputs[row] = outputs_with_drafts(outputs[row], spec.draft_token_ids[entry][:position])
            position_probs = self.sampler.compute_probs(logits, dataclasses.replace(metadata,
                                                                                    output_token_ids=outputs))
            probs[flat] = position_probs[rows]
        return probs

    @staticmethod
    def rows_are_greedy(metadata: SamplingMetadata, rows: list[int], device: torch.device) -> torch.Tensor:
        """bool [len(rows)]: which of these batch rows decode greedily."""
        if metadata.temperature is None:
            return torch.ones(len(rows), dtype=torch.bool, device=device)
        return metadata.temperature[rows] < SAMPLING_EPS

    def emitted_logprobs(self, spec: SpecDecodeMetadata, target_logits: torch.Tensor,
                         sampler_output: SamplerOutput, metadata: SamplingMetadata,
                         token_ids: dict[int, list[int]]) -> dict[int, list[dict[int, float]]]:
        """For rows asking `logprobs`: each emitted token's logprob under the raw target logits at its
        position (the draft positions', then the bonus position's, which the sampler already gathered)."""
        if sampler_output.logprobs_tensors is None:   # no row of the batch asks for logprobs
            return {}
        bonus = logprobs_to_dicts(sampler_output.logprobs_tensors, metadata.num_logprobs)
        result: dict[int, list[dict[int, float]]] = {}
        for entry, (row, start) in enumerate(zip(spec.rows, spec.draft_starts, strict=False)):
            wanted = metadata.num_logprobs[row]
            if wanted is None:
                continue
            emitted = token_ids[row]
            judged = min(len(emitted), len(spec.draft_token_ids[entry]))   # tokens emitted at draft positions
            raw = compute_logprobs(target_logits[start: start + judged])
            tensors = self.sampler.gather_logprobs(raw, wanted, torch.as_tensor(emitted[:judged], device=raw.device))
            result[row] = logprobs_to_dicts(tensors, [wanted] * judged)
            if len(emitted) > judged:   # every draft accepted: the bonus token, as the sampler gathered it
                result[row].append(bonus[row])
        return result

    @staticmethod
    def parse_output(output_token_ids: torch.Tensor) -> list[list[int]]:
        """Each row's emitted tokens, placeholders dropped (1 to k + 1 tokens per request)."""
        return [[token for token in row if token != PLACEHOLDER_TOKEN_ID] for row in output_token_ids.tolist()]
