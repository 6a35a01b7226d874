"""Mirrors vllm/v1/sample/metadata.py: per-request sampling parameters packed as batch-aligned tensors.

Row i of every tensor belongs to the request in row i of the logits. A parameter that no row uses is
None (top_p, top_k, min_p, allowed_token_ids_mask, ...) so the sampler can skip its whole pass; that
is how vLLM keeps a mostly-greedy batch cheap. In vLLM the persistent batch
(vllm/v1/worker/gpu_input_batch.py, `_make_sampling_metadata`) fills these; here
`SamplingMetadata.build` does it from the rows' SamplingParams.

`min_p`, logit bias and min-tokens are applied by the logits processors in `logitsprocs` (as in vLLM);
the `min_p` tensor is kept for inspection only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from mini.sample.logits_processor import LogitsProcessors, build_logitsprocs
from mini.sample.logits_processor.interface import BatchUpdate
from mini.sampling_params import SAMPLING_EPS

if TYPE_CHECKING:
    from mini.sampling_params import SamplingParams



def make_padded_tensor(rows: Sequence[Sequence[int]], pad: int, device: torch.device | str) -> torch.Tensor:
    """int64 [len(rows), max_len] with each row right-padded with `pad` (at least one column)."""
    width = max((len(r) for r in rows), default=0) or 1
    out = torch.full((len(rows), width), pad, dtype=torch.int64)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.as_tensor(row, dtype=torch.int64)
    return out.to(device)


@dataclass(slots=True)
class SamplingMetadata:
    """What the sampler needs for one step, aligned to the rows of the logits."""

    temperature: torch.Tensor | None  # float32 [N] (0 for greedy rows); None when all rows are greedy
    all_greedy: bool
    all_random: bool
    top_p: torch.Tensor | None  # float32 [N]; 1.0 = off; None when no row uses top-p
    top_k: torch.Tensor | None  # int64 [N]; vocab_size = off; None when no row uses top-k
    min_p: torch.Tensor | None  # float32 [N]; informational (MinPLogitsProcessor applies it)
    generators: dict[int, torch.Generator]  # row -> the request's seeded generator
    max_num_logprobs: int | None  # largest `logprobs` in the batch (-1 -> vocab_size); None: none asked
    no_penalties: bool
    prompt_token_ids: torch.Tensor | None  # int64 [N, max_prompt_len] padded with vocab_size
    frequency_penalties: torch.Tensor  # float32 [N]
    presence_penalties: torch.Tensor  # float32 [N]
    repetition_penalties: torch.Tensor  # float32 [N]
    output_token_ids: list[list[int]]  # the rows' live output lists (by reference)
    allowed_token_ids_mask: torch.Tensor | None  # bool [N, V]; True = token NOT allowed (vLLM's convention)
    bad_words_token_ids: dict[int, list[list[int]]]  # row -> banned token sequences
    logitsprocs: LogitsProcessors = field(default_factory=LogitsProcessors)
    num_logprobs: list[int | None] = field(default_factory=list)  # each row's own `logprobs`

    @property
    def num_rows(self) -> int:
        return len(self.output_token_ids)

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        prompt_token_ids: list[list[int]],
        output_token_ids: list[list[int]],
        generators: dict[int, torch.Generator],
        vocab_size: int,
        device: torch.device | str = "cpu",
        logitsprocs: LogitsProcessors | None = None,
    ) -> SamplingMetadata:
        """Pack the rows' params; `output_token_ids` lists are kept by reference.

        `logitsprocs`: the persistent batch's processors (it calls their update_state itself). When
        None, fresh built-in processors are created and told that every row was just added, so a
        one-off call (tests, benchmarks, notebooks) still honours min_p, logit_bias and min_tokens.
        """
        num_rows = len(params)
        if len(prompt_token_ids) != num_rows or len(output_token_ids) != num_rows:
            raise ValueError(
                f"params, prompt_token_ids and output_token_ids must have one entry per row, got "
                f"{num_rows}, {len(prompt_token_ids)}, {len(output_token_ids)}"
            )
        if not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
        bad_rows = [row for row in generators if not 0 <= row < num_rows]
        if bad_rows:
            raise ValueError(f"generators keys must be row indices in [0, {num_rows}), got {bad_rows}")
        device = torch.device(device)

        def floats(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device)

        temperatures = [float(p.temperature) for p in params]
        greedy = [t < SAMPLING_EPS for t in temperatures]
        all_greedy, all_random = all(greedy), not any(greedy)

        top_ps = [float(p.top_p) for p in params]
        top_ks = [int(p.top_k) if 0 < int(p.top_k) < vocab_size else vocab_size for p in params]
        min_ps = [float(p.min_p) for p in params]
        presence = [float(p.presence_penalty) for p in params]
        frequency = [float(p.frequency_penalty) for p in params]
        repetition = [float(p.repetition_penalty) for p in params]
        no_penalties = all(a == 0.0 for a in presence) and all(f == 0.0 for f in frequency) and all(
            r == 1.0 for r in repetition)

        num_logprobs = [None if p.logprobs is None else (vocab_size if p.logprobs == -1 else int(p.logprobs))
                        for p in params]
        requested = [n for n in num_logprobs if n is not None]

        if logitsprocs is None:
            logitsprocs = build_logitsprocs(None, vocab_size, device)
            added = [(row, p, prompt_token_ids[row], output_token_ids[row]) for row, p in enumerate(params)]
            logitsprocs.update_state(BatchUpdate(batch_size=num_rows, removed=[], added=added, moved=[]))

        return cls(
            temperature=None if all_greedy else floats(temperatures),
            all_greedy=all_greedy,
            all_random=all_random,
            top_p=None if all(p >= 1.0 for p in top_ps) else floats(top_ps),
            top_k=None if all(k == vocab_size for k in top_ks) else torch.tensor(top_ks, device=device),
            min_p=None if all(m == 0.0 for m in min_ps) else floats(min_ps),
            generators={row: g for row, g in generators.items() if not greedy[row]},
            max_num_logprobs=max(requested) if requested else None,
            no_penalties=no_penalties,
            prompt_token_ids=(None if no_penalties
                              else make_padded_tensor(prompt_token_ids, vocab_size, device)),
            frequency_penalties=floats(frequency),
            presence_penalties=floats(presence),
            repetition_penalties=floats(repetition),
            output_token_ids=output_token_ids,
            allowed_token_ids_mask=_allowed_token_ids_mask(params, vocab_size, device),
            bad_words_token_ids={row: list(p.bad_words_token_ids) for row, p in enumerate(params)
                                 if p.bad_words_token_ids},
            logitsprocs=logitsprocs,
            num_logprobs=num_logprobs,
        )


def _allowed_token_ids_mask(
    params: list[SamplingParams], vocab_size: int, device: torch.device
) -> torch.Tensor | None:
    """bool [N, V], True where a row's `allowed_token_ids` excludes the token; None if no row restricts."""
    rows = [(row, p.allowed_token_ids) for row, p in enumerate(params) if p.allowed_token_ids is not None]
    if not rows:
        return None
    mask = torch.zeros((len(params), vocab_size), dtype=torch.bool)
    for row, allowed in rows:
        out_of_range = [t for t in allowed if not 0 <= t < vocab_size]
        if out_of_range:
            raise ValueError(f"allowed_token_ids must be token ids in [0, {vocab_size}), got {out_of_range}")
        mask[row] = True
        mask[row, allowed] = False
    return mask.to(device)
