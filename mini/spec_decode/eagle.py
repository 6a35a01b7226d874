"""Drafting with an EAGLE-style head: one decoder layer on top of the target's own hidden states.

Mirrors vllm/v1/spec_decode/eagle.py (`EagleProposer`, whose work is in `SpecDecodeBaseProposer`,
vllm/v1/spec_decode/llm_base_proposer.py). The head (mini/spec_decode/eagle_head.py) reads, at position t,
the target's final hidden state h_t together with the token x_{t+1}, and predicts the hidden state at t + 1,
which the target's own LM head turns into a guess for x_{t+2}.

Two parts of the `drafter` role (mini/roles.py) live here, class attributes of `EagleProposer`:

* `prepare_eagle_inputs`: the first pass, from the target's step. It keeps every position the target
  computed except the rejected drafts' (vLLM: `prepare_inputs`), shifts the ids left by one inside each
  request and puts the token after the last kept position in the last slot (vLLM: `set_inputs_first_pass`):

      target ids    [a1 | b1 b2 b3 | c1 c2]     request b verified 2 drafts (b2, b3), one was rejected
      kept rows      0    1  2       4  5       b3's row (3) is dropped
      head ids      [A  | b2 B     | c2 C ]     A, B, C: each request's next token (sampled, or the next
      hidden rows    0    1  2       4  5                prompt token mid-prefill)

* `compute_draft_slots`: the k - 1 further passes, one token per request each, write their K/V one position
  further every time; their slots come from the block table (vLLM: `eagle_step_update_slot_mapping_and_metadata`
  in vllm/v1/spec_decode/utils.py), the scheduler having reserved k lookahead slots for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from mini.spec_decode.eagle_head import EagleHead
from mini.spec_decode.model_proposer import PADDING_SLOT_ID, FirstPass, ModelDrafterBase, compute_draft_slots

if TYPE_CHECKING:
    from mini.config import EngineConfig
    from mini.worker.input_batch import CachedRequestState
    from mini.worker.prepare_inputs import PreparedInputs


def prepare_eagle_inputs(target_token_ids: torch.Tensor, target_positions: torch.Tensor,
                         query_start_loc: torch.Tensor, num_draft_tokens: Sequence[int],
                         num_sampled_tokens: Sequence[int], next_token_ids: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The EAGLE head's first pass after a target step -> (input_ids, positions, hidden_indices, last_indices).

    A request that verified d > 0 drafts and emitted s tokens rejected d + 1 - s of them (its last d + 1 - s
    rows); a request without drafts rejected none (mid-prefill it emitted nothing). Its other rows are kept,
    in order. Kept row r reads the target's hidden state at r (`hidden_indices`), the position of r, and the
    id of the next kept row of its request, or `next_token_ids[b]` for its last one. `last_indices[b]`: where
    request b's last input sits among the kept rows (its output gives the request's first draft).
    Mirrors `SpecDecodeBaseProposer.prepare_inputs` and `set_inputs_first_pass` (llm_base_proposer.py).
    """
    starts = query_start_loc.tolist()
    num_rejected = [drafts + 1 - sampled if drafts > 0 else 0
                    for drafts, sampled in zip(num_draft_tokens, num_sampled_tokens, strict=False)]
    kept_rows: list[int] = []
    last_rows: list[int] = []
    for start, end, rejected in zip(starts, starts[1:], num_rejected, strict=False):
        kept_rows.extend(range(start, end - rejected))
        last_rows.append(len(kept_rows) - 1)
    hidden_indices = torch.tensor(kept_rows, dtype=torch.int64)
    last_indices = torch.tensor(last_rows, dtype=torch.int64)
    input_ids = target_token_ids[(hidden_indices + 1).clamp_max(target_token_ids.shape[0] - 1)].clone()
    input_ids[last_indices] = next_token_ids.to(input_ids.dtype)
    return input_ids, target_positions[hidden_indices].clone(), hidden_indices, last_indices


class EagleProposer(ModelDrafterBase):
    """EAGLE drafting. Home of the drafter role's model-based parts: `prepare_eagle_inputs` and
    `compute_draft_slots`; an engine built with replaced parts builds this class from `roles.resolve`."""

    reads_target_hidden = True
    prepare_eagle_inputs = staticmethod(prepare_eagle_inputs)
    compute_draft_slots = staticmethod(compute_draft_slots)

    def load(self, folder: str, config: EngineConfig, target_model: torch.nn.Module) -> torch.nn.Module:
        return EagleHead.from_pretrained(folder, target_model, config.device,
                                         next(target_model.parameters()).dtype)

    def num_layers(self) -> int:
        return 1

    def first_pass(self, states: list[CachedRequestState], new_token_ids: list[list[int]], is_partial: list[bool],
                   inputs: PreparedInputs, hidden: torch.Tensor) -> FirstPass:
        starts = inputs.query_start_loc.tolist()
        next_token_ids = [new[-1] if new else state.all_token_ids[state.num_computed_tokens + end - start]
                          for state, new, start, end in zip(states, new_token_ids, starts, starts[1:], strict=False)]
        input_ids, positions, hidden_indices, last_indices = self.prepare_eagle_inputs(
            inputs.input_ids.cpu(), inputs.positions.cpu(), inputs.query_start_loc.cpu(),
            [len(state.spec_token_ids) for state in states], [len(new) for new in new_token_ids],
            torch.tensor(next_token_ids, dtype=torch.int64))
        last = torch.as_tensor(last_indices, dtype=torch.int64).tolist()
        counts = [b - a for a, b in zip([-1, *last], last, strict=False)]
        positions = torch.as_tensor(positions, dtype=torch.int64)
        firsts = [int(positions[end - count + 1]) if count else state.num_computed_tokens
                  for state, end, count in zip(states, last, counts, strict=False)]
        batch = self.assemble([int(t) for t in torch.as_tensor(input_ids).tolist()], firsts, counts,
                              inputs.block_table)
        batch.positions = positions.to(self.device)
        hidden_in = hidden[torch.as_tensor(hidden_indices, dtype=torch.int64, device=hidden.device)]
        out = self.forward(batch.input_ids, hidden_in, batch)
        return FirstPass(out, last, [int(positions[index]) for index in last])

    def forward(self, input_ids: torch.Tensor, hidden_in: torch.Tensor | None, inputs: PreparedInputs
                ) -> torch.Tensor:
        return self.net(input_ids, hidden_in, inputs.positions, self.kv_caches, self.metadata(inputs))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.target_model.compute_logits(hidden)


__all__ = ["PADDING_SLOT_ID", "EagleProposer", "compute_draft_slots", "prepare_eagle_inputs"]
