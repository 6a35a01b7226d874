"""Mirrors vllm/v1/sample/ops/topk_topp_sampler.py: draw one token per row after top-k / top-p.

Two paths, as vLLM's `TopKTopPSampler` has a native one and a fused (FlashInfer) one:

* native: `apply_top_k_top_p` on the full rows, softmax, then `random_sample`. It is the teachable
  reference, which the sampler (mini/sample/sampler.py: `truncated_probs`, then `random_sample`) runs
  through its own parts when it was built with a part replaced.
* `sample_fused`: for rows that truncate (k or p set) only a window of each row's best tokens can
  survive, so it takes `topk(window)` instead of sorting 32k entries, decides top-k / top-p inside the
  window, and races only the window's tokens. A row whose cut might reach past the window (k-th value
  tied at the window's edge, or a top-p nucleus wider than the window) retries with a 4x window,
  then falls back to the native path, so the kept set is always exactly the native one.

Both draw by the exponential race, argmax(probs / E) with E ~ Exp(1) per token: token j wins with
probability probs[j]. A seeded row draws its V exponentials, in token order, from its own generator
exactly once per step, whichever path it takes, so its token does not depend on the rest of the batch.
"""

from __future__ import annotations

import torch

from mini.sample.ops import topk_topp as topk_topp_ops

FIRST_WINDOW = 32
WINDOW_GROWTH = 4


def exponentials_(out: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Fill `out` with Exp(1) draws as -log(U), U ~ Uniform[0, 1), in place (U = 0 gives +inf: never wins).

    Same distribution as `Tensor.exponential_`, several times faster on CPU for a single row.
    """
    return out.uniform_(generator=generator).log_().neg_()


def random_sample(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """argmax(probs / E) per row; rows listed in `generators` draw E with their own generator.

    Modifies `probs` in place (vllm/v1/sample/ops/topk_topp_sampler.py: random_sample).
    """
    race = torch.empty_like(probs)
    if len(generators) != probs.shape[0]:
        exponentials_(race)
    for row, generator in generators.items():
        exponentials_(race[row], generator)
    return probs.div_(race).argmax(dim=-1).view(-1)


def _race(probs: torch.Tensor, seeded_races: dict[int, torch.Tensor],
          token_ids: torch.Tensor | None) -> torch.Tensor:
    """argmax(probs / E) where seeded rows use their pre-drawn full-vocabulary E (gathered by token id)."""
    race = torch.empty_like(probs)
    if len(seeded_races) != probs.shape[0]:
        exponentials_(race)
    for row, full_race in seeded_races.items():
        race[row] = full_race if token_ids is None else full_race[token_ids[row]]
    return probs.div_(race).argmax(dim=-1)


def _row_mass(logits: torch.Tensor) -> torch.Tensor:
    """sum(exp(logits - row max)) per row: the softmax normalizer on the scale the window uses."""
    row_max = logits.amax(dim=1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, 0.0)
    return (logits - row_max).exp_().sum(dim=1)


def _window_sample(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor, window: int,
                   seeded_races: dict[int, torch.Tensor],
                   row_mass: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample inside each row's top-`window` tokens; also return which rows needed a wider window.

    `row_mass` is `_row_mass` of the full rows; it is used for rows with top-p but no top-k.
    """
    vocab_size = logits.shape[1]
    values, token_ids = logits.topk(window, dim=1)  # sorted, best first
    has_k = k < vocab_size
    kth = values.gather(1, (k.clamp(max=window) - 1).unsqueeze(1)).squeeze(1)
    kth = torch.where(has_k, kth, -float("inf"))
    # The k-th value may be tied beyond the window's edge: we cannot see those tokens.
    # (A -inf edge is harmless: every finite token is then inside the window.)
    edge = values[:, -1]
    needs_wider = has_k & (edge >= kth) & torch.isfinite(edge) & (window < vocab_size)
    values = values.masked_fill(values < kth.unsqueeze(1), -float("inf"))

    row_max = values[:, :1]
    row_max = torch.where(torch.isfinite(row_max), row_max, 0.0)
    weights = (values - row_max).exp_()  # unnormalized probabilities, 0 where masked
    prefix = weights.cumsum(dim=1)
    has_p = p < 1.0
    # Top-p normalizer: the top-k set's mass (it is inside the window), else the whole row's mass.
    p_only = has_p & ~has_k
    total = torch.where(p_only, row_mass, prefix[:, -1])
    # The first token past the window is dropped only if the window already holds mass >= p.
    needs_wider |= p_only & (prefix[:, -1] < p * total) & (window < vocab_size)
    mass_above = prefix - weights
    keep = (mass_above < p.unsqueeze(1) * total.unsqueeze(1)) | ~has_p.unsqueeze(1)
    weights.masked_fill_(~keep, 0.0)
    choice = _race(weights, seeded_races, token_ids)
    return token_ids.gather(1, choice.unsqueeze(1)).squeeze(1), needs_wider


def sample_fused(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None,
                 generators: dict[int, torch.Generator], active: torch.Tensor | None = None) -> torch.Tensor:
    """Same distribution as the native path; rows outside `active` (bool [N], e.g. greedy) get token 0."""
    num_rows, vocab_size = logits.shape
    device = logits.device
    k = (torch.full((num_rows,), vocab_size, device=device) if k is None
         else torch.where((k <= 0) | (k >= vocab_size), vocab_size, k.to(device=device, dtype=torch.long)))
    p = torch.ones(num_rows, device=device) if p is None else p.to(device=device, dtype=torch.float32)
    active = torch.ones(num_rows, dtype=torch.bool, device=device) if active is None else active
    seeded = {row: exponentials_(torch.empty(vocab_size, device=device), generator)
              for row, generator in generators.items() if bool(active[row])}
    sampled = torch.zeros(num_rows, dtype=torch.long, device=device)

    pending = (active & ((k < vocab_size) | (p < 1.0))).nonzero().squeeze(1)
    full_rows = (active & (k >= vocab_size) & (p >= 1.0)).nonzero().squeeze(1)
    # Each row starts with the smallest power-of-two window that can hold its top-k set (+1 to see ties);
    # rows with similar windows share one topk call, and a row that needs more grows its window 4x.
    window = torch.where(k < vocab_size, k + 1, FIRST_WINDOW).clamp(min=FIRST_WINDOW)
    window = 2 ** torch.ceil(torch.log2(window.double())).long()
    row_mass = torch.zeros(num_rows, device=device)
    p_only_rows = (active & (k >= vocab_size) & (p < 1.0)).nonzero().squeeze(1)
    if p_only_rows.numel():
        row_mass[p_only_rows] = _row_mass(logits.index_select(0, p_only_rows))
    too_wide = []
    while pending.numel():
        sizes = window[pending]
        wider = []
        for size in sorted(set(sizes.tolist())):
            rows = pending[sizes == size]
            if size >= vocab_size // 2:
                too_wide.append(rows)
                continue
            sub = logits if rows.numel() == num_rows else logits.index_select(0, rows)
            sub_seeded = {i: seeded[r] for i, r in enumerate(rows.tolist()) if r in seeded}
            tokens, needs_wider = _window_sample(sub, k[rows], p[rows], size, sub_seeded, row_mass[rows])
            sampled[rows] = tokens  # rows needing a wider window are overwritten later
            wider.append(rows[needs_wider])
        pending = torch.cat(wider) if wider else pending[:0]
        window[pending] *= WINDOW_GROWTH
    pending = torch.cat(too_wide) if too_wide else pending

    # Rows that truncate beyond any window: the native masked path. Rows that do not truncate: plain race.
    for rows, truncates in ((pending, True), (full_rows, False)):
        if not rows.numel():
            continue
        sub = logits.index_select(0, rows)
        if truncates:
            sub = topk_topp_ops.apply_top_k_top_p(sub, k[rows], p[rows])
        probs = sub.softmax(dim=-1, dtype=torch.float32)
        sub_seeded = {i: seeded[r] for i, r in enumerate(rows.tolist()) if r in seeded}
        sampled[rows] = _race(probs, sub_seeded, None)
    return sampled
