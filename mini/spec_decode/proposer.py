"""Build the engine's drafter from `speculative_config`, and the n-gram drafter.

Mirrors the proposer selection in `GPUModelRunner.__init__` (vllm/v1/worker/gpu_model_runner.py), which
builds an `NgramProposer`, a `DraftModelProposer` or an `EagleProposer` from the speculative config, and
`propose_draft_token_ids`, which the runner calls after sampling. Every drafter here has one method,
`propose(states, new_token_ids, is_partial, inputs, hidden) -> one draft list per batch row`. The
config's `parts` (what the engine replaced, mini/roles.py) pick the `NgramProposer` and `EagleProposer` classes
(the homes of the drafter role's parts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from mini import roles
from mini.spec_decode.draft_model import DraftModelProposer
from mini.spec_decode.eagle import EagleProposer
from mini.spec_decode.ngram_proposer import NgramProposer

if TYPE_CHECKING:
    from mini.config import EngineConfig
    from mini.spec_decode.config import SpeculativeConfig
    from mini.worker.input_batch import CachedRequestState
    from mini.worker.prepare_inputs import PreparedInputs


class NgramDrafter:
    """Prompt-lookup drafting from each request's own tokens: no network, no KV cache. Only the requests
    that just sampled a token draft (not one in the middle of its prompt)."""

    def __init__(self, proposer: NgramProposer) -> None:
        self.proposer = proposer

    @classmethod
    def from_config(cls, spec: SpeculativeConfig, max_model_len: int, engine_config: EngineConfig | None = None
                    ) -> NgramDrafter:
        proposer_class = roles.resolve(engine_config, NgramProposer)
        return cls(proposer_class(spec.prompt_lookup_min, spec.prompt_lookup_max, spec.num_speculative_tokens,
                                  max_model_len))

    def propose(self, states: list[CachedRequestState], new_token_ids: list[list[int]], is_partial: list[bool],
                inputs: PreparedInputs, hidden: torch.Tensor) -> list[list[int]]:
        drafting = [row for row, (new,
                                  partial) in enumerate(zip(new_token_ids, is_partial,
                                                            strict=False)) if new and not partial]
        drafts: list[list[int]] = [[] for _ in states]
        for row, proposal in zip(drafting,
                                 self.proposer.propose([states[row].all_token_ids for row in drafting]), strict=False):
            drafts[row] = proposal
        return drafts


def build_drafter(config: EngineConfig, target_model: torch.nn.Module, num_blocks: int):
    """The drafter `config.speculative_config` asks for (n-gram, draft model or EAGLE head)."""
    spec = config.speculative_config
    assert spec is not None and config.max_model_len is not None
    if spec.method == "ngram":
        return NgramDrafter.from_config(spec, config.max_model_len, config)
    if spec.method == "draft_model":
        return DraftModelProposer(config, target_model, num_blocks)
    return roles.resolve(config, EagleProposer)(config, target_model, num_blocks)
