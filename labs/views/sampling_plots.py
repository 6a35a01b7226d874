"""The sampling pipeline of one row, stage by stage: what each step of the sampler does to the distribution.

Mirrors no single vllm/v1 file; it replays, for one row, the order of `Sampler.forward` in
vllm/v1/sample/sampler.py (mini: mini/sample/sampler.py):

    raw -> logit bias / min tokens -> penalties -> temperature -> min-p -> top-k / top-p

- `sampling_pipeline_stages(logits, params, ...)` -> list of `PipelineStage`: plain data (unit-tested);
  each stage calls mini's op through its module at call time, so a plugged learner op is what is drawn;
- `sampled_frequencies(logits, params, num_draws)`: the real `Sampler` on `num_draws` copies of the row
  in ONE call (vectorized), so the histogram can be set against the last stage's probabilities;
- `plot_sampling_pipeline(stages)` / `plot_frequencies(stage, counts)`: static matplotlib figures.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

STAGE_NAMES = ("raw", "logit bias / min tokens", "penalties", "temperature", "min-p", "top-k / top-p")


@dataclass(slots=True)
class PipelineStage:
    """The row after one step of the pipeline."""

    name: str
    note: str  # the parameters that acted, e.g. "T=0.7" or "k=5, p=0.9"
    logits: list[float]  # -inf = masked
    probs: list[float]  # softmax(logits); 0 where masked

    @property
    def kept(self) -> list[int]:
        """Token ids still possible (finite logit)."""
        return [token for token, value in enumerate(self.logits) if value != float("-inf")]

    @property
    def num_kept(self) -> int:
        return len(self.kept)

    def top(self, count: int) -> list[int]:
        """The `count` most likely token ids of this stage, best first."""
        order = sorted(range(len(self.probs)), key=lambda token: -self.probs[token])
        return order[:count]


@dataclass(slots=True)
class SampledFrequencies:
    counts: list[int]
    num_draws: int
    tokens: list[int] = field(default_factory=list)  # the draws, in row order

    def frequencies(self) -> list[float]:
        return [count / self.num_draws for count in self.counts]


def _stage(name: str, note: str, logits: torch.Tensor) -> PipelineStage:
    row = logits[0].detach().to(torch.float32)
    finite = torch.isfinite(row)
    probs = row.softmax(dim=-1) if bool(finite.any()) else torch.zeros_like(row)
    return PipelineStage(name, note, row.tolist(), torch.nan_to_num(probs, nan=0.0).tolist())


def _history_tensor(token_ids: Sequence[int], vocab_size: int) -> torch.Tensor:
    values = list(token_ids) or [vocab_size]
    return torch.tensor([values], dtype=torch.int64)


def sampling_pipeline_stages(
    logits: torch.Tensor | Sequence[float],
    params: Any,
    prompt_token_ids: Sequence[int] = (),
    output_token_ids: Sequence[int] = (),
) -> list[PipelineStage]:
    """The row's distribution after each step of mini's sampler, for these SamplingParams.

    A greedy row (temperature 0) stops after the penalties with a one-hot "greedy argmax" stage.
    """
    from mini import roles
    from mini.config import EngineConfig
    from mini.sample.logits_processor import BatchUpdate, build_logitsprocs
    from mini.sample.sampler import Sampler
    from mini.sampling_params import SAMPLING_EPS

    config = EngineConfig(parts=roles.pending())   # what an engine built here would use (parts of a `plug` block)
    ops = roles.resolve(config, Sampler)           # the sampler's parts, as class attributes

    row = torch.as_tensor(logits, dtype=torch.float32).reshape(1, -1).clone()
    vocab_size = row.shape[1]
    stages = [_stage("raw", "the model's logits", row)]

    processors = build_logitsprocs(None, vocab_size, engine_config=config)
    outputs = list(output_token_ids)
    processors.update_state(
        BatchUpdate(batch_size=1, removed=[], added=[(0, params, list(prompt_token_ids), outputs)], moved=[])
    )
    for processor in processors.non_argmax_invariant:
        row = processor.apply(row)
    bias = params.logit_bias or {}
    min_tokens = int(params.min_tokens)
    stages.append(_stage(STAGE_NAMES[1], f"bias on {len(bias)} token(s), min_tokens={min_tokens}", row))

    repetition = float(params.repetition_penalty)
    presence, frequency = float(params.presence_penalty), float(params.frequency_penalty)
    if repetition != 1.0 or presence != 0.0 or frequency != 0.0:
        row = ops.apply_all_penalties(
            row,
            _history_tensor(prompt_token_ids, vocab_size),
            _history_tensor(outputs, vocab_size),
            torch.tensor([presence]),
            torch.tensor([frequency]),
            torch.tensor([repetition]),
        )
    stages.append(_stage(STAGE_NAMES[2], f"rep={repetition:g} pres={presence:g} freq={frequency:g}", row))

    temperature = float(params.temperature)
    if temperature < SAMPLING_EPS:
        greedy = torch.full_like(row, -float("inf"))
        greedy[0, int(row.argmax())] = 0.0
        stages.append(_stage("greedy argmax", "temperature=0: the argmax, no sampling", greedy))
        return stages
    row = ops.apply_temperature(row, torch.tensor([temperature]), True)
    stages.append(_stage(STAGE_NAMES[3], f"T={temperature:g}", row))

    for processor in processors.argmax_invariant:
        row = processor.apply(row)
    stages.append(_stage(STAGE_NAMES[4], f"min_p={float(params.min_p):g}", row))

    top_k, top_p = int(params.top_k), float(params.top_p)
    k = torch.tensor([top_k]) if 0 < top_k < vocab_size else None
    p = torch.tensor([top_p]) if top_p < 1.0 else None
    row = ops.apply_top_k_top_p(row, k, p)
    stages.append(
        _stage(
            STAGE_NAMES[5],
            f"k={top_k if k is not None else 'off'}, p={top_p if p is not None else 'off'}",
            row,
        )
    )
    return stages


def sampled_frequencies(
    logits: torch.Tensor | Sequence[float],
    params: Any,
    num_draws: int = 4000,
    prompt_token_ids: Sequence[int] = (),
    output_token_ids: Sequence[int] = (),
    seed: int = 0,
) -> SampledFrequencies:
    """Draw `num_draws` tokens with mini's `Sampler`: the row repeated `num_draws` times, in one call."""
    from mini import roles
    from mini.config import EngineConfig
    from mini.sample.metadata import SamplingMetadata
    from mini.sample.sampler import Sampler

    row = torch.as_tensor(logits, dtype=torch.float32).reshape(1, -1)
    vocab_size = row.shape[1]
    metadata = SamplingMetadata.build(
        params=[params] * num_draws,
        prompt_token_ids=[list(prompt_token_ids)] * num_draws,
        output_token_ids=[list(output_token_ids) for _ in range(num_draws)],
        generators={},
        vocab_size=vocab_size,
    )
    torch.manual_seed(seed)
    sampler = roles.resolve(EngineConfig(parts=roles.pending()), Sampler)()   # with an enclosing `plug` block's parts
    tokens = sampler(row.repeat(num_draws, 1), metadata).sampled_token_ids
    counts = torch.bincount(tokens, minlength=vocab_size).tolist()
    return SampledFrequencies(counts=counts, num_draws=num_draws, tokens=tokens.tolist())


def _labels(tokens: Sequence[int], token_label: Callable[[int], str] | None) -> list[str]:
    return [repr(token_label(t))[1:-1] if token_label else str(t) for t in tokens]


def plot_sampling_pipeline(
    stages: Sequence[PipelineStage],
    top: int = 12,
    token_label: Callable[[int], str] | None = None,
    axes: Any = None,
) -> Any:
    """One bar chart per stage over the raw distribution's `top` tokens (same x order in every panel).

    Masked tokens are drawn as a grey x; the title gives the stage, its parameters and how many tokens of
    the whole vocabulary are still possible.
    """
    import matplotlib.pyplot as plt

    tokens = stages[0].top(top)
    labels = _labels(tokens, token_label)
    if axes is None:
        _, axes = plt.subplots(1, len(stages), figsize=(2.9 * len(stages), 2.8), sharey=True)
    axes = list(axes) if hasattr(axes, "__iter__") else [axes]
    for ax, stage in zip(axes, stages, strict=False):
        heights = [stage.probs[t] for t in tokens]
        masked = [stage.logits[t] == float("-inf") for t in tokens]
        ax.bar(range(len(tokens)), heights, color=["#bab0ac" if m else "#4e79a7" for m in masked])
        for x, is_masked in enumerate(masked):
            if is_masked:
                ax.text(x, 0.01, "x", ha="center", va="bottom", color="#777", fontsize=8)
        ax.set_xticks(range(len(tokens)), labels, rotation=90, fontsize=7)
        ax.set_title(f"{stage.name}\n{stage.note}\n{stage.num_kept} token(s) left", fontsize=7)
    axes[0].set_ylabel("probability")
    return axes


def plot_frequencies(
    stage: PipelineStage,
    sampled: SampledFrequencies,
    top: int = 12,
    token_label: Callable[[int], str] | None = None,
    ax: Any = None,
) -> Any:
    """The last stage's probabilities (bars) against the sampler's empirical frequencies (dots)."""
    import matplotlib.pyplot as plt

    tokens = stage.top(top)
    if ax is None:
        _, ax = plt.subplots(figsize=(0.5 * len(tokens) + 2, 2.8))
    frequencies = sampled.frequencies()
    ax.bar(range(len(tokens)), [stage.probs[t] for t in tokens], color="#4e79a7", label="target probability")
    ax.plot(
        range(len(tokens)),
        [frequencies[t] for t in tokens],
        "o",
        color="#e15759",
        label=f"sampled frequency ({sampled.num_draws} draws)",
    )
    ax.set_xticks(range(len(tokens)), _labels(tokens, token_label), rotation=90, fontsize=7)
    ax.legend(fontsize=7)
    ax.set_title(f"after {stage.name}: target vs sampled", fontsize=8)
    return ax


def chi_square(stage: PipelineStage, sampled: SampledFrequencies) -> tuple[float, int]:
    """Pearson's statistic of the draws against the stage's probabilities, and its degrees of freedom.

    A token the stage masks (probability 0) but the sampler drew makes the statistic infinite.
    """
    statistic, cells = 0.0, 0
    for token, count in enumerate(sampled.counts):
        expected = stage.probs[token] * sampled.num_draws
        if expected == 0.0:
            if count:
                return float("inf"), cells
            continue
        statistic += (count - expected) ** 2 / expected
        cells += 1
    return statistic, max(cells - 1, 0)
