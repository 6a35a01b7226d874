"""Build the engine's drafter from `speculative_config`, and the n-gram drafter.

Mirrors the proposer selection in `GPUModelRunner.__init__` (vllm/v1/worker/gpu_model_runner.py), which
builds an `NgramProposer`, a `DraftModelProposer` or an `EagleProposer` from the speculative config, and
`propose_draft_token_ids`, which the runner calls after sampling. Every drafter here has one method,
`propose(states, new_token_ids, is_partial, inputs, hidden) -> one draft list per batch row`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from mini.spec_decode import ngram_proposer

if TYPE_CHECKING:
    from mini.config import EngineConfig
    from mini.spec_decode.config import SpeculativeConfig
    from mini.worker.input_batch import CachedRequestState
    from mini.worker.prepare_inputs import PreparedInputs


class NgramDrafter:
    """Prompt-lookup drafting from each request's own tokens: no network, no KV cache."""

    def __init__(self, spec: SpeculativeConfig, max_model_len: int) -> None:
        self.spec = spec
        self.max_model_len = max_model_len

    def propose(self, states: list[CachedRequestState], new_token_ids: list[list[int]], is_partial: list[bool],
                inputs: PreparedInputs, hidden: torch.Tensor) -> list[list[int]]:
        spec = self.spec
        return [[] if partial or not new else
                ngram_proposer.propose_ngram(state.all_token_ids, spec.prompt_lookup_min, spec.prompt_lookup_max,
                                             spec.num_speculative_tokens, self.max_model_len)
                for state, new, partial in zip(states, new_token_ids, is_partial)]


def build_drafter(config: EngineConfig, target_model: torch.nn.Module, num_blocks: int):
    """The drafter `config.speculative_config` asks for (n-gram, draft model or EAGLE head)."""
    spec = config.speculative_config
    assert spec is not None and config.max_model_len is not None
    if spec.method == "ngram":
        return NgramDrafter(spec, config.max_model_len)
    if spec.method == "draft_model":
        from mini.spec_decode.draft_model import DraftModelProposer

        return DraftModelProposer(config, target_model, num_blocks)
    from mini.spec_decode.eagle import EagleProposer

    return EagleProposer(config, target_model, num_blocks)
