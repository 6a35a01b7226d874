"""Drafting with a smaller model of the same family: the shipped 2-layer `tiny-llama-draft` by default.

Mirrors vllm/v1/spec_decode/draft_model.py (`DraftModelProposer`). The draft model reads the request's own
tokens: the catch-up pass feeds every token the target placed this step, up to and including the newest
one (whose output gives the first draft); each later pass feeds the draft just made. With
`compilation_config=3` the draft model is compiled as the target is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from mini.compilation import compile_model
from mini.model.loader import load_model
from mini.spec_decode.model_proposer import ModelDrafterBase

if TYPE_CHECKING:
    from mini.config import EngineConfig
    from mini.worker.input_batch import CachedRequestState
    from mini.worker.prepare_inputs import PreparedInputs


class DraftModelProposer(ModelDrafterBase):
    def load(self, folder: str, config: EngineConfig, target_model: torch.nn.Module) -> torch.nn.Module:
        model, _ = load_model(folder, config.device, next(target_model.parameters()).dtype)
        if model.config.vocab_size != target_model.config.vocab_size:
            raise ValueError(f"speculative_config['model'] must share the target's vocabulary: the draft at "
                             f"{folder!r} has {model.config.vocab_size} tokens, the target "
                             f"{target_model.config.vocab_size}")
        if model.attention_backend != target_model.attention_backend:
            model.set_attention_backend(target_model.attention_backend)
        # Compiled as the target is (vLLM: the draft model is built by `get_model` under the same compilation
        # config, tagged "draft_model"); its own graph, its attention reading the draft's KV cache.
        return compile_model(model, config.compilation_settings)

    def num_layers(self) -> int:
        return self.net.config.num_hidden_layers

    def catch_up_span(self, state: CachedRequestState, num_scheduled: int, partial: bool) -> tuple[int, int]:
        # A decoding request reads up to its newest token (position num_tokens - 1): the target's
        # positions this step that were not rejected, then the token the target just emitted.
        first = state.num_computed_tokens
        last = first + num_scheduled - 1 if partial else state.num_tokens - 1
        return first, last - first + 1

    def catch_up_tokens(self, state: CachedRequestState, first: int, count: int) -> list[int]:
        return state.all_token_ids[first: first + count]

    def forward(self, input_ids: torch.Tensor, hidden_in: torch.Tensor | None, inputs: PreparedInputs
                ) -> torch.Tensor:
        return self.net(input_ids, inputs.positions, self.kv_caches, self.metadata(inputs))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.net.compute_logits(hidden)
