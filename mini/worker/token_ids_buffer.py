"""The persistent token buffer: every batch row's token ids in one tensor, kept from step to step.

Mirrors `InputBatch.token_ids_cpu_tensor` / `num_tokens` in vllm/v1/worker/gpu_input_batch.py and the gather
in `GPUModelRunner._prepare_inputs` (vllm/v1/worker/gpu_model_runner.py): the step's input ids are ONE
`torch.index_select` over the flattened buffer at `req_index * width + position`, instead of slicing each
request's Python token list and building a tensor from the concatenation (phase 02's `prepare_inputs`, the
course's reference path, which stays as it is).

Row i holds the tokens of the request in batch row i: its prompt, the tokens it sampled, and, after them,
this step's draft tokens (speculative decoding; rewritten every step, not counted as known tokens). A row is
written whole when a request enters it (new, resumed, or moved there by `InputBatch.condense`) and only the
new tail afterwards (one sampled token per decode step): the same identity-based sync as the persistent
block table (block_table.py), where vLLM moves rows explicitly (`swap_states`, `condense`).

mini differs: int64 (the model's embedding takes it as is; vLLM keeps int32 and copies into an int32 input
buffer), and the width grows by doubling as requests grow, where vLLM allocates `max_model_len` columns up front.
"""

from __future__ import annotations

import numpy as np
import torch

_INITIAL_WIDTH = 256  # token columns; doubled whenever a request outgrows them


class TokenIdsBuffer:
    """`int64 [max_num_reqs, width]` token ids per batch row, with each row's owner and known-token count."""

    def __init__(self, max_num_reqs: int) -> None:
        self.max_num_reqs = max_num_reqs
        self.table = torch.zeros((max_num_reqs, _INITIAL_WIDTH), dtype=torch.int64)
        self._table_np = self.table.numpy()              # the same memory, for cheap small writes and the gather
        self.num_tokens = [0] * max_num_reqs           # known tokens written per row (drafts not counted)
        self.row_owners: list[object | None] = [None] * max_num_reqs   # compared by identity (block_table.py)

    @property
    def width(self) -> int:
        return self.table.shape[1]

    def _ensure_width(self, num_tokens: int) -> None:
        width = self.width
        if num_tokens <= width:
            return
        while width < num_tokens:
            width *= 2
        wider = self.table.new_zeros((self.max_num_reqs, width))
        wider[:, : self.width] = self.table
        self.table = wider
        self._table_np = wider.numpy()

    def sync_row(self, row: int, state) -> None:
        """Make row `row` hold `state`'s tokens (and this step's drafts after them), writing only what is new.

        `state` is the runner's request state (`CachedRequestState`: `all_token_ids`, `spec_token_ids`)."""
        tokens = state.all_token_ids
        num_tokens = len(tokens)
        drafts = state.spec_token_ids
        start = self.num_tokens[row] if self.row_owners[row] is state else 0
        if start > num_tokens:   # the state lost tokens (never in mini): rewrite the row
            start = 0
        if num_tokens + len(drafts) > self.width:
            self._ensure_width(num_tokens + len(drafts))
        if num_tokens - start == 1:       # a decode step: the one token sampled last step
            self._table_np[row, start] = tokens[start]
        elif num_tokens > start:
            self._table_np[row, start:num_tokens] = tokens[start:]
        if drafts:
            self._table_np[row, num_tokens:num_tokens + len(drafts)] = drafts
        self.row_owners[row] = state
        self.num_tokens[row] = num_tokens

    def gather(self, req_indices: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """int64 `[T]`: the token at `positions[t]` of row `req_indices[t]`, one gather over the flattened
        buffer (vLLM: `torch.index_select` over `token_ids_cpu_tensor.flatten()`; mini indexes its NumPy view,
        which costs less than a torch call at decode sizes)."""
        return self._table_np.reshape(-1)[req_indices * self.width + positions]
