"""Verify one step's draft tokens: the target's distribution at every draft position, then rejection.

Mirrors the speculative half of `GPUModelRunner._sample` in vllm/v1/worker/gpu_model_runner.py, with
`SpecDecodeMetadata` (vllm/v1/spec_decode/metadata.py) and the call into `RejectionSampler.forward`
(vllm/v1/sample/rejection_sampler.py).

A request that was scheduled `1 + k` tokens (its last sampled token x, then drafts d1..dk) owns the last
`1 + k` rows of its part of the flat batch. Row j (0-based) holds the hidden state after reading
x, d1, ..., dj, so its logits are the target's prediction for the token after dj: row 0 verifies d1, ...,
row k-1 verifies dk, and row k predicts the bonus token, used when all k drafts are accepted. The
target's distribution at row j is what the sampler would have drawn from had the request decoded
x, d1, ..., dj one step at a time: the same processors, and penalties that see d1..dj as output already.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from mini.sample import logprobs as logprobs_ops
from mini.sample.ops.topk_topp_sampler import random_sample
from mini.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID, rejection_sample
from mini.sampling_params import SAMPLING_EPS

if TYPE_CHECKING:
    from mini.sample.metadata import SamplingMetadata
    from mini.sample.sampler import Sampler
    from mini.worker.input_batch import CachedRequestState


@dataclass(slots=True)
class SpecDecodeMetadata:
    """Where each verifying request's rows are (vLLM: vllm/v1/spec_decode/metadata.py)."""

    rows: list[int]                    # batch rows of the requests with drafts, ascending
    draft_token_ids: list[list[int]]   # their drafts, one list per entry of `rows`
    target_row_indices: list[list[int]]  # flat hidden-state rows 0..k of each (k = its number of drafts)

    @classmethod
    def build(cls, states: list[CachedRequestState], query_start_loc: torch.Tensor) -> SpecDecodeMetadata | None:
        """None when no row has drafts (then nothing is read back from `query_start_loc`)."""
        rows = [row for row, state in enumerate(states) if state.spec_token_ids]
        if not rows:
            return None
        drafts = [list(states[row].spec_token_ids) for row in rows]
        starts = query_start_loc.tolist()
        last_rows = [starts[row + 1] - 1 for row in rows]
        return cls(rows=rows, draft_token_ids=drafts,
                   target_row_indices=[list(range(last - len(d), last + 1)) for last, d in zip(last_rows, drafts)])

    @property
    def max_spec_len(self) -> int:
        return max(len(drafts) for drafts in self.draft_token_ids)


@dataclass(slots=True)
class SpecDecodeResult:
    """Per verifying batch row: the tokens it emits this step (accepted drafts + one) and their logprobs."""

    token_ids: dict[int, list[int]]
    logprobs: dict[int, list[dict[int, float]]]


@torch.inference_mode()
def verify_drafts(model: torch.nn.Module, sampler: Sampler, hidden: torch.Tensor, last_logits: torch.Tensor,
                  spec: SpecDecodeMetadata, states: list[CachedRequestState],
                  metadata: SamplingMetadata) -> SpecDecodeResult:
    """Score every draft position with the target and run the rejection sampler over them.

    `hidden` is the flat batch's final hidden states, `last_logits` the `[B, V]` logits of each row's last
    scheduled token (the ones the ordinary sampler used); `metadata` is the step's SamplingMetadata.
    """
    flat_rows = [index for indices in spec.target_row_indices for index in indices]
    flat_logits = model.compute_logits(hidden[torch.as_tensor(flat_rows, device=hidden.device)])
    offsets = [0]
    for indices in spec.target_row_indices:
        offsets.append(offsets[-1] + len(indices))

    # The target distribution at position j of every verifying request, one full-batch pass per j: the
    # batch-row layout is what the logits processors and penalty tensors are indexed by.
    probs_at: dict[tuple[int, int], torch.Tensor] = {}
    for position in range(spec.max_spec_len + 1):
        logits = last_logits.clone()
        outputs = [state.output_token_ids for state in states]
        active = []
        for entry, (row, drafts) in enumerate(zip(spec.rows, spec.draft_token_ids)):
            if position <= len(drafts):
                logits[row] = flat_logits[offsets[entry] + position]
                outputs[row] = outputs_with_drafts(states[row].output_token_ids, drafts[:position])
                active.append(entry)
        probs = sampler.compute_probs(logits, dataclasses.replace(metadata, output_token_ids=outputs))
        for entry in active:
            probs_at[(entry, position)] = probs[spec.rows[entry]]

    num_drafts = [len(drafts) for drafts in spec.draft_token_ids]
    target_probs = torch.stack([probs_at[(entry, j)] for entry, k in enumerate(num_drafts) for j in range(k)])
    bonus_probs = torch.stack([probs_at[(entry, k)] for entry, k in enumerate(num_drafts)])
    is_greedy = torch.tensor([states[row].sampling_params.temperature < SAMPLING_EPS for row in spec.rows],
                             device=last_logits.device)
    generators = {entry: states[row].generator for entry, row in enumerate(spec.rows)
                  if states[row].generator is not None and not bool(is_greedy[entry])}
    bonus = torch.where(is_greedy, bonus_probs.argmax(dim=-1), random_sample(bonus_probs.clone(), generators))
    draft_ids = torch.as_tensor([t for drafts in spec.draft_token_ids for t in drafts], dtype=torch.int64,
                                device=last_logits.device)
    output = rejection_sample(draft_ids, num_drafts, None, target_probs, bonus.to(torch.int64), is_greedy,
                              generators).tolist()

    token_ids: dict[int, list[int]] = {}
    for entry, row in enumerate(spec.rows):
        token_ids[row] = [int(t) for t in output[entry] if t != PLACEHOLDER_TOKEN_ID]
    return SpecDecodeResult(token_ids=token_ids,
                            logprobs=_emitted_logprobs(flat_logits, offsets, spec, states, token_ids))


def outputs_with_drafts(output_token_ids: list[int], drafts: list[int]) -> list[int]:
    """The output history as position j sees it: the tokens so far, then the drafts before j."""
    return output_token_ids + drafts if drafts else output_token_ids


def _emitted_logprobs(flat_logits: torch.Tensor, offsets: list[int], spec: SpecDecodeMetadata,
                      states: list[CachedRequestState], token_ids: dict[int, list[int]]
                      ) -> dict[int, list[dict[int, float]]]:
    """For requests asking `logprobs`: each emitted token's logprob under the raw target logits at its row."""
    result: dict[int, list[dict[int, float]]] = {}
    for entry, row in enumerate(spec.rows):
        wanted = states[row].sampling_params.logprobs
        if wanted is None:
            continue
        emitted = token_ids[row]
        raw = logprobs_ops.compute_logprobs(flat_logits[offsets[entry]: offsets[entry] + len(emitted)])
        num = raw.shape[1] if wanted == -1 else int(wanted)
        tensors = logprobs_ops.gather_logprobs(raw, num, torch.as_tensor(emitted, device=raw.device))
        result[row] = logprobs_ops.logprobs_to_dicts(tensors, [num] * len(emitted))
    return result
