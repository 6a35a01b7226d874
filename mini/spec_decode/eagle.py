"""Drafting with an EAGLE-style head: one decoder layer on top of the target's own hidden states.

Mirrors vllm/v1/spec_decode/eagle.py (`EagleProposer`). The head (mini/spec_decode/eagle_head.py) reads, at
position t, the target's final hidden state h_t together with the token x_{t+1}, and predicts the hidden
state at t + 1, which the target's own LM head turns into a guess for x_{t+2}. So the catch-up pass runs
over the target's positions of this step that were kept, one shorter than the draft model's (the newest
token has no hidden state yet: it is read as x_{t+1} of the position before it); later passes feed the
head's own predicted hidden state with the draft just made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from mini.spec_decode.eagle_head import EagleHead
from mini.spec_decode.model_proposer import ModelDrafterBase

if TYPE_CHECKING:
    from mini.config import EngineConfig
    from mini.worker.input_batch import CachedRequestState
    from mini.worker.prepare_inputs import PreparedInputs


class EagleProposer(ModelDrafterBase):
    reads_target_hidden = True

    def load(self, folder: str, config: EngineConfig, target_model: torch.nn.Module) -> torch.nn.Module:
        return EagleHead.from_pretrained(folder, target_model, config.device,
                                         next(target_model.parameters()).dtype)

    def num_layers(self) -> int:
        return 1

    def catch_up_span(self, state: CachedRequestState, num_scheduled: int, partial: bool) -> tuple[int, int]:
        first = state.num_computed_tokens
        end = first + num_scheduled if partial else min(first + num_scheduled, state.num_tokens - 1)
        return first, end - first

    def catch_up_tokens(self, state: CachedRequestState, first: int, count: int) -> list[int]:
        return state.all_token_ids[first + 1: first + 1 + count]

    def forward(self, input_ids: torch.Tensor, hidden_in: torch.Tensor | None, inputs: PreparedInputs
                ) -> torch.Tensor:
        return self.net(input_ids, hidden_in, inputs.positions, self.kv_caches, self.metadata(inputs))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.target_model.compute_logits(hidden)
