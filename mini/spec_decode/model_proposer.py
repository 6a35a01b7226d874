"""What the draft-model and EAGLE drafters share: a small network on its own paged KV cache.

Mirrors `SpecDecodeBaseProposer` in vllm/v1/spec_decode/llm_base_proposer.py (vLLM's eagle.py and
draft_model.py build on it). The drafter's cache has the target's block table: the same block ids and slots,
in tensors of its own. The
scheduler reserves k lookahead slots on every step that reaches a request's last token (the steps after
which it drafts), so the drafts' keys and values always have a place.

Each step, after the target has sampled:
  1. catch up: one flat pass over every position the target computed this step that is now part of its
     request (a rejected draft's position is not), so the drafter's cache never misses a token;
  2. the output at each decoding request's last position gives its first draft (argmax: vLLM drafts
     greedily too, so the drafts are deterministic and the rejection test uses q = one-hot);
  3. k - 1 more passes of one token per request, each feeding the draft just made.
Subclasses say which tokens (and, for EAGLE, which target hidden states) a pass reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from mini.attention.metadata import build_attention_metadata
from mini.worker import prepare_inputs as batch_inputs

if TYPE_CHECKING:
    from mini.config import EngineConfig
    from mini.worker.input_batch import CachedRequestState
    from mini.worker.prepare_inputs import PreparedInputs


class ModelDrafterBase:
    """k greedy drafts per decoding request from a network that runs on its own paged KV cache."""

    reads_target_hidden = False   # EAGLE: the catch-up pass reads the target's hidden state at each position

    def __init__(self, config: EngineConfig, target_model: torch.nn.Module, num_blocks: int) -> None:
        spec = config.speculative_config
        assert spec is not None and spec.model is not None
        self.k = spec.num_speculative_tokens
        self.block_size = int(config.block_size)
        self.device = torch.device(config.device)
        self.target_model = target_model
        self.net = self.load(spec.model, config, target_model)
        dtype = next(target_model.parameters()).dtype
        self.kv_caches = [torch.zeros(self.net.kv_cache_shape(num_blocks, self.block_size), dtype=dtype,
                                      device=self.device) for _ in range(self.num_layers())]

    # -------------------------------------------------------------- what a subclass provides
    def load(self, folder: str, config: EngineConfig, target_model: torch.nn.Module) -> torch.nn.Module:
        raise NotImplementedError

    def num_layers(self) -> int:
        raise NotImplementedError

    def catch_up_span(self, state: CachedRequestState, num_scheduled: int, partial: bool) -> tuple[int, int]:
        """(first position, number of positions) of the catch-up pass for one request."""
        raise NotImplementedError

    def catch_up_tokens(self, state: CachedRequestState, first: int, count: int) -> list[int]:
        raise NotImplementedError

    def forward(self, input_ids: torch.Tensor, hidden_in: torch.Tensor | None, inputs: PreparedInputs
                ) -> torch.Tensor:
        """One pass over a flat batch -> hidden states `[T, H]` (what `compute_logits` reads)."""
        raise NotImplementedError

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # -------------------------------------------------------------- the shared loop
    @torch.inference_mode()
    def propose(self, states: list[CachedRequestState], new_token_ids: list[list[int]], is_partial: list[bool],
                inputs: PreparedInputs, hidden: torch.Tensor) -> list[list[int]]:
        if not states:
            return []
        query_start_loc = inputs.query_start_loc.tolist()
        block_table = inputs.block_table
        firsts, counts, tokens, hidden_rows = [], [], [], []
        for row, state in enumerate(states):
            num_scheduled = query_start_loc[row + 1] - query_start_loc[row]
            first, count = self.catch_up_span(state, num_scheduled, is_partial[row])
            firsts.append(first)
            counts.append(count)
            tokens.extend(self.catch_up_tokens(state, first, count))
            start = query_start_loc[row] + first - state.num_computed_tokens
            hidden_rows.extend(range(start, start + count))
        batch = batch_inputs.assemble_inputs(tokens, firsts, counts, block_table.cpu(), self.block_size
                                             ).to(self.device)
        hidden_in = hidden[torch.as_tensor(hidden_rows, device=hidden.device)] if self.reads_target_hidden else None
        out = self.forward(batch.input_ids, hidden_in, batch)

        drafting = [row for row, state in enumerate(states) if not is_partial[row] and new_token_ids[row]]
        drafts: list[list[int]] = [[] for _ in states]
        if not drafting:
            return drafts
        last_rows = torch.as_tensor([int(batch.logits_indices[row]) for row in drafting], device=out.device)
        prev_hidden = out[last_rows]                                   # [n, H], one per drafting request
        for entry, token in enumerate(self.compute_logits(prev_hidden).argmax(dim=-1).tolist()):
            drafts[drafting[entry]].append(int(token))
        # The next draft is fed at the position after the catch-up pass; its KV needs a slot there.
        positions = [firsts[row] + counts[row] for row in drafting]
        capacity = [int((block_table[row] != 0).sum()) * self.block_size for row in drafting]
        active = list(range(len(drafting)))
        for _ in range(self.k - 1):
            active = [entry for entry in active if positions[entry] < capacity[entry]]
            if not active:
                break
            rows = [drafting[entry] for entry in active]
            step = batch_inputs.assemble_inputs(
                [drafts[row][-1] for row in rows], [positions[entry] for entry in active], [1] * len(active),
                block_table[torch.as_tensor(rows, device=block_table.device)].cpu(), self.block_size
            ).to(self.device)
            index = torch.as_tensor(active, device=prev_hidden.device)
            new_hidden = self.forward(step.input_ids, prev_hidden[index], step)
            prev_hidden[index] = new_hidden
            for entry, token in zip(active, self.compute_logits(new_hidden).argmax(dim=-1).tolist()):
                drafts[drafting[entry]].append(int(token))
                positions[entry] += 1
        return drafts

    @staticmethod
    def metadata(inputs: PreparedInputs):
        return build_attention_metadata(inputs)
