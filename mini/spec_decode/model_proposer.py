"""What the draft-model and EAGLE drafters share: a small network on its own paged KV cache.

Mirrors `SpecDecodeBaseProposer` in vllm/v1/spec_decode/llm_base_proposer.py (vLLM's eagle.py and
draft_model.py build on it). The drafter's cache has the target's block table: the same block ids and slots,
in tensors of its own. The
scheduler reserves k lookahead slots on every step that reaches a request's last token (the steps after
which it drafts), so the drafts' keys and values always have a place.

Each step, after the target has sampled:
  1. the first pass: one flat pass over every position the target computed this step that is now part of
     its request (a rejected draft's position is not), so the drafter's cache never misses a token (EAGLE
     builds it with `prepare_eagle_inputs`, mini/spec_decode/eagle.py);
  2. the output at each decoding request's last position gives its first draft (argmax: vLLM drafts
     greedily too, so the drafts are deterministic and the rejection test uses q = one-hot);
  3. k - 1 more passes of one token per request, each feeding the draft just made one position further
     (`compute_draft_slots`: their positions and K/V slots).
Subclasses say which tokens (and, for EAGLE, which target hidden states) a pass reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from mini.attention.metadata import build_attention_metadata
from mini.worker import prepare_inputs as batch_inputs

if TYPE_CHECKING:
    from mini.config import EngineConfig
    from mini.worker.input_batch import CachedRequestState
    from mini.worker.prepare_inputs import PreparedInputs

PADDING_SLOT_ID = -1   # vLLM's name (vllm/v1/spec_decode/utils.py): "write this token's K/V nowhere"


def compute_draft_slots(last_positions: torch.Tensor, block_table: torch.Tensor, block_size: int, num_steps: int,
                        max_model_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the drafter's `num_steps` further passes run -> (positions, slot_mapping), both int64 `[B, num_steps]`.

    Pass j (0-based) feeds request b's newest draft at position `last_positions[b] + 1 + j` and writes its K/V
    to that position's slot in the request's blocks (`block_table[b]`, as the target's slot mapping). A
    position at or past `max_model_len` has no slot: position 0 and slot PADDING_SLOT_ID (-1), as vLLM's
    `eagle_step_slot_mapping_metadata_kernel` (vllm/v1/spec_decode/utils.py), which also never reads past the
    last column of the block table.
    """
    last = torch.as_tensor(last_positions, dtype=torch.int64).reshape(-1, 1)
    positions = last + torch.arange(1, num_steps + 1, dtype=torch.int64)
    past_end = positions >= max_model_len
    positions = torch.where(past_end, torch.zeros_like(positions), positions)
    table = torch.as_tensor(block_table).long()
    block_numbers = (positions // block_size).clamp_max(table.shape[1] - 1)
    slots = table.gather(1, block_numbers) * block_size + positions % block_size
    return positions, torch.where(past_end, torch.full_like(slots, PADDING_SLOT_ID), slots)


class FirstPass(NamedTuple):
    """The drafter's first pass of a step: its output rows, and per batch row where its last input sits."""

    out: torch.Tensor              # [N, H] hidden states (what `compute_logits` reads)
    last_indices: list[int]        # per batch row: its last input's row in `out`
    last_positions: list[int]      # per batch row: that input's position


class ModelDrafterBase:
    """k greedy drafts per decoding request from a network that runs on its own paged KV cache."""

    reads_target_hidden = False   # EAGLE: the first pass reads the target's hidden state at each position
    compute_draft_slots = staticmethod(compute_draft_slots)

    def __init__(self, config: EngineConfig, target_model: torch.nn.Module, num_blocks: int) -> None:
        spec = config.speculative_config
        assert spec is not None and spec.model is not None
        self.k = spec.num_speculative_tokens
        self.block_size = int(config.block_size)
        self.max_model_len = int(config.max_model_len) if config.max_model_len is not None else 1 << 62
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
        """(first position, number of positions) of the first pass for one request (the draft model's)."""
        raise NotImplementedError

    def catch_up_tokens(self, state: CachedRequestState, first: int, count: int) -> list[int]:
        raise NotImplementedError

    def forward(self, input_ids: torch.Tensor, hidden_in: torch.Tensor | None, inputs: PreparedInputs
                ) -> torch.Tensor:
        """One pass over a flat batch -> hidden states `[T, H]` (what `compute_logits` reads)."""
        raise NotImplementedError

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # -------------------------------------------------------------- the first pass
    def assemble(self, tokens: list[int], firsts: list[int], counts: list[int], block_table: torch.Tensor
                 ) -> PreparedInputs:
        """A flat batch on the drafter's device: `counts[b]` tokens of request b from position `firsts[b]`."""
        return batch_inputs.assemble_inputs(tokens, firsts, counts, block_table.cpu(), self.block_size
                                            ).to(self.device)

    def first_pass(self, states: list[CachedRequestState], new_token_ids: list[list[int]], is_partial: list[bool],
                   inputs: PreparedInputs, hidden: torch.Tensor) -> FirstPass:
        """One flat pass over every position the target computed this step that is now part of its request
        (a rejected draft's position is not), so the drafter's cache never misses a token."""
        query_start_loc = inputs.query_start_loc.tolist()
        firsts, counts, tokens, hidden_rows = [], [], [], []
        for row, state in enumerate(states):
            num_scheduled = query_start_loc[row + 1] - query_start_loc[row]
            first, count = self.catch_up_span(state, num_scheduled, is_partial[row])
            firsts.append(first)
            counts.append(count)
            tokens.extend(self.catch_up_tokens(state, first, count))
            start = query_start_loc[row] + first - state.num_computed_tokens
            hidden_rows.extend(range(start, start + count))
        batch = self.assemble(tokens, firsts, counts, inputs.block_table)
        hidden_in = hidden[torch.as_tensor(hidden_rows, device=hidden.device)] if self.reads_target_hidden else None
        out = self.forward(batch.input_ids, hidden_in, batch)
        last_indices = batch.logits_indices.tolist()
        return FirstPass(out, last_indices, [first + count - 1 for first, count in zip(firsts, counts, strict=False)])

    # -------------------------------------------------------------- the shared loop
    @torch.inference_mode()
    def propose(self, states: list[CachedRequestState], new_token_ids: list[list[int]], is_partial: list[bool],
                inputs: PreparedInputs, hidden: torch.Tensor) -> list[list[int]]:
        if not states:
            return []
        first = self.first_pass(states, new_token_ids, is_partial, inputs, hidden)
        drafting = [row for row, state in enumerate(states) if not is_partial[row] and new_token_ids[row]]
        drafts: list[list[int]] = [[] for _ in states]
        if not drafting:
            return drafts
        last_rows = torch.as_tensor([first.last_indices[row] for row in drafting], device=first.out.device)
        prev_hidden = first.out[last_rows]                             # [n, H], one per drafting request
        for entry, token in enumerate(self.compute_logits(prev_hidden).argmax(dim=-1).tolist()):
            drafts[drafting[entry]].append(int(token))
        if self.k == 1:
            return drafts
        # Each further draft is fed one position after the previous input; its K/V goes to that position's
        # slot (the scheduler reserved k lookahead slots). A request whose next position has no slot (past
        # max_model_len, or past the blocks it holds) stops drafting: mini's choice; vLLM runs the pass with
        # a padding slot and the scheduler drops the drafts that do not fit.
        block_table = inputs.block_table.cpu()
        rows_table = block_table[torch.as_tensor(drafting)]
        positions, slots = self.compute_draft_slots(
            torch.tensor([first.last_positions[row] for row in drafting], dtype=torch.int64), rows_table,
            self.block_size, self.k - 1, self.max_model_len)
        positions, slots = torch.as_tensor(positions).tolist(), torch.as_tensor(slots).tolist()
        capacity = [int((rows_table[entry] != 0).sum()) * self.block_size for entry in range(len(drafting))]
        active = list(range(len(drafting)))
        for step_index in range(self.k - 1):
            active = [entry for entry in active if slots[entry][step_index] != PADDING_SLOT_ID
                      and positions[entry][step_index] < capacity[entry]]
            if not active:
                break
            rows = [drafting[entry] for entry in active]
            step = self.assemble([drafts[row][-1] for row in rows], [positions[entry][step_index] for entry in active],
                                 [1] * len(active), rows_table[torch.as_tensor(active)])
            step.slot_mapping = torch.tensor([slots[entry][step_index] for entry in active], dtype=torch.int64,
                                             device=self.device)
            index = torch.as_tensor(active, device=prev_hidden.device)
            new_hidden = self.forward(step.input_ids, prev_hidden[index], step)
            prev_hidden[index] = new_hidden
            for entry, token in zip(active, self.compute_logits(new_hidden).argmax(dim=-1).tolist(), strict=False):
                drafts[drafting[entry]].append(int(token))
        return drafts

    @staticmethod
    def metadata(inputs: PreparedInputs):
        return build_attention_metadata(inputs)
