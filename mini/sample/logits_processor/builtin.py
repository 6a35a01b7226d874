"""Mirrors vllm/v1/sample/logits_processor/builtin.py: min-p, logit bias and min-tokens.

Each keeps a sparse `{row: setting}` dict (only the requests that use it), follows the batch with
`process_dict_updates` (defined here, as in vLLM), and rebuilds small index tensors only when the dict
changed, so `apply` is a few vectorized ops, or a no-op when no row uses the processor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import torch

from mini.sample.logits_processor.interface import (
    BatchUpdate,
    LogitsProcessor,
    LogitsProcessorConfig,
    MoveDirectionality,
)

if TYPE_CHECKING:
    from mini.sampling_params import SamplingParams

StateT = TypeVar("StateT")


def process_dict_updates(
    entries: dict[int, StateT],
    batch_update: BatchUpdate | None,
    new_state: Callable[[SamplingParams, list[int], list[int]], StateT | None],
) -> bool:
    """Apply removes -> adds -> moves to `{row: state}`; return whether `entries` changed.

    `new_state(params, prompt_ids, output_ids)` returns the row's state, or None if the processor
    is off for that request (then any stale state of the replaced request is dropped).
    """
    if batch_update is None:
        return False
    changed = False
    for index in batch_update.removed:
        changed |= entries.pop(index, None) is not None
    for index, params, prompt_ids, output_ids in batch_update.added:
        state = new_state(params, prompt_ids, output_ids)
        if state is not None:
            entries[index] = state
            changed = True
        else:
            changed |= entries.pop(index, None) is not None
    for a_index, b_index, direction in batch_update.moved:
        a_state = entries.pop(a_index, None)
        b_state = entries.pop(b_index, None)
        if a_state is not None:
            entries[b_index] = a_state
            changed = True
        if b_state is not None:
            changed = True
            if direction is MoveDirectionality.SWAP:
                entries[a_index] = b_state
    return changed


class RowStateLogitsProcessor(LogitsProcessor):
    """A processor that keeps `{row: state}` and follows the batch with `self.process_dict_updates`.

    The built-ins derive from it, so the `LogitsProcessors` container that builds them can hand them the
    engine's chosen `process_dict_updates` (mini/roles.py); alone, they use the reference.
    """

    process_dict_updates = staticmethod(process_dict_updates)


def stop_token_ids_of(params: SamplingParams) -> set[int]:
    """stop_token_ids plus EOS: what min_tokens must hold back."""
    return set(params.all_stop_token_ids)


class MinPLogitsProcessor(RowStateLogitsProcessor):
    """Drop tokens whose probability is below min_p times the row's top probability (argmax-invariant).

    Runs after temperature, as in vLLM, so "probability" means the tempered distribution.
    """

    def __init__(self, vllm_config: LogitsProcessorConfig, device: torch.device, is_pin_memory: bool) -> None:
        self.device = torch.device(device)
        self.min_p_by_row: dict[int, float] = {}
        self._rows: torch.Tensor | None = None
        self._min_p: torch.Tensor | None = None

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        def new_state(params: SamplingParams, prompt_ids: list[int], output_ids: list[int]) -> float | None:
            min_p = params.min_p
            return min_p if min_p > 0.0 else None

        if self.process_dict_updates(self.min_p_by_row, batch_update, new_state):
            rows = sorted(self.min_p_by_row)
            self._rows = torch.tensor(rows, dtype=torch.long, device=self.device)
            self._min_p = torch.tensor([self.min_p_by_row[r] for r in rows], device=self.device).unsqueeze(1)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.min_p_by_row or self._rows is None:
            return logits
        rows_logits = logits.index_select(0, self._rows)
        probs = rows_logits.softmax(dim=-1)
        threshold = probs.amax(dim=-1, keepdim=True) * self._min_p
        logits.index_copy_(0, self._rows, rows_logits.masked_fill_(probs < threshold, -float("inf")))
        return logits


class LogitBiasLogitsProcessor(RowStateLogitsProcessor):
    """Add `logit_bias[token]` to the chosen tokens of each row (may change the argmax)."""

    def __init__(self, vllm_config: LogitsProcessorConfig, device: torch.device, is_pin_memory: bool) -> None:
        self.device = torch.device(device)
        self.vocab_size = vllm_config.vocab_size
        self.bias_by_row: dict[int, dict[int, float]] = {}
        self._index: tuple[torch.Tensor, torch.Tensor] | None = None
        self._bias: torch.Tensor | None = None

    def is_argmax_invariant(self) -> bool:
        return False

    def _new_state(self, params: SamplingParams, prompt_ids: list[int], output_ids: list[int]) -> dict | None:
        logit_bias = params.logit_bias
        if not logit_bias:
            return None
        bad = [t for t in logit_bias if not 0 <= int(t) < self.vocab_size]
        if bad:
            raise ValueError(f"logit_bias token ids must be in [0, {self.vocab_size}), got {bad}")
        return {int(t): float(b) for t, b in logit_bias.items()}

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if self.process_dict_updates(self.bias_by_row, batch_update, self._new_state):
            rows, tokens, biases = [], [], []
            for row, bias in self.bias_by_row.items():
                rows.extend([row] * len(bias))
                tokens.extend(bias)
                biases.extend(bias.values())
            self._index = (torch.tensor(rows, dtype=torch.long, device=self.device),
                           torch.tensor(tokens, dtype=torch.long, device=self.device))
            self._bias = torch.tensor(biases, dtype=torch.float32, device=self.device)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.bias_by_row or self._index is None:
            return logits
        return logits.index_put_(self._index, self._bias.to(logits.dtype), accumulate=True)


class MinTokensLogitsProcessor(RowStateLogitsProcessor):
    """Mask the stop tokens (EOS included) of a row until it has generated `min_tokens` tokens."""

    def __init__(self, vllm_config: LogitsProcessorConfig, device: torch.device, is_pin_memory: bool) -> None:
        self.device = torch.device(device)
        # row -> (min_tokens, live output list, stop token ids)
        self.state_by_row: dict[int, tuple[int, list[int], set[int]]] = {}
        self._index: tuple[torch.Tensor, torch.Tensor] | None = None

    def is_argmax_invariant(self) -> bool:
        return False

    @staticmethod
    def _new_state(params: SamplingParams, prompt_ids: list[int], output_ids: list[int]):
        min_tokens = params.min_tokens
        stop_ids = stop_token_ids_of(params)
        if min_tokens > 0 and stop_ids and len(output_ids) < min_tokens:
            return (min_tokens, output_ids, stop_ids)
        return None

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        changed = self.process_dict_updates(self.state_by_row, batch_update, self._new_state)
        # Output lists grow by reference: a row that reached min_tokens is released.
        done = [row for row, (min_tokens, output_ids, _) in self.state_by_row.items()
                if len(output_ids) >= min_tokens]
        for row in done:
            del self.state_by_row[row]
        if changed or done:
            rows, tokens = [], []
            for row, (_, _, stop_ids) in self.state_by_row.items():
                rows.extend([row] * len(stop_ids))
                tokens.extend(stop_ids)
            self._index = (torch.tensor(rows, dtype=torch.long, device=self.device),
                           torch.tensor(tokens, dtype=torch.long, device=self.device))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.state_by_row or self._index is None:
            return logits
        return logits.index_put_(self._index, torch.tensor(-float("inf"), device=logits.device))
