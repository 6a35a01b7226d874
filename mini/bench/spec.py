"""`python -m mini bench spec`: speculative decoding vs none, at batch sizes 1, 4 and 32, greedy.

In the spirit of vLLM's benchmarks/benchmark_throughput.py with `--speculative-config` (and its
`spec_decode` metrics): the shipped model completes code (windows cut from the Python standard library,
the text it was trained on), once without speculation and once per drafter (n-gram, the 2-layer draft
model, the EAGLE head), in one process, the configurations alternating round by round. Reported per batch
size and method: output tokens/s, speedup over no speculation, tokens per target pass (vLLM's mean
acceptance length: 1 + accepted drafts per verified draft run) and whether every output is token-identical
to the run without speculation (it must be: greedy verification is exact).

Last line: `ngram_tokens_per_pass=X.XX eagle_tokens_per_pass=Y.YY best_speedup_bs1=Z.ZZ identical=True`
(tokens per pass at batch size 1; the best method's speedup at batch size 1).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from mini import LLM, SamplingParams
from mini.bench.workload import load_corpus_text

METHODS = {
    "none": None,
    "ngram": {"method": "ngram", "prompt_lookup_max": 4, "prompt_lookup_min": 2},
    "draft_model": {"method": "draft_model"},
    "eagle": {"method": "eagle"},
}


def code_prompts(tokenizer, num_prompts: int, prompt_len: int, seed: int = 0) -> list[dict]:
    """Token windows of the stdlib's source, each starting at a line start (deterministic for a seed)."""
    rng = random.Random(seed)
    text = load_corpus_text()
    starts = [i + 1 for i, ch in enumerate(text) if ch == "\n"]
    prompts = []
    while len(prompts) < num_prompts:
        start = rng.choice(starts)
        ids = tokenizer.encode(text[start: start + 8 * prompt_len])[:prompt_len]
        if len(ids) == prompt_len:
            prompts.append({"prompt_token_ids": ids})
    return prompts


def run_once(llm: LLM, prompts: list[dict], params: SamplingParams) -> tuple[float, list[list[int]], float]:
    """Seconds for the batch, every output's token ids, and the engine's mean acceptance length so far."""
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    stats = llm.llm_engine.get_scheduler_stats().spec_decoding_stats
    return seconds, [list(o.outputs[0].token_ids) for o in outputs], stats.mean_acceptance_length


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mini bench spec", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", default="1,4,32", help="comma-separated batch sizes (default 1,4,32)")
    parser.add_argument("--methods", default="ngram,draft_model,eagle")
    parser.add_argument("--num-speculative-tokens", "-k", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per batch size (median kept)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    methods = ["none", *[m for m in args.methods.split(",") if m]]
    for method in methods:
        if method not in METHODS:
            parser.error(f"--methods: unknown method {method!r}; choose from {sorted(set(METHODS) - {'none'})}")
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    engines = {}
    for method in methods:
        spec = METHODS[method]
        if spec is not None:
            spec = {**spec, "num_speculative_tokens": args.num_speculative_tokens}
        engines[method] = LLM(speculative_config=spec, max_num_seqs=max(batch_sizes))
    tokenizer = engines["none"].get_tokenizer()
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    print(f"shipped model, greedy, k={args.num_speculative_tokens}, prompt {args.prompt_len} tokens, "
          f"{args.max_tokens} output tokens each, {args.rounds} alternating rounds (median), "
          f"torch threads {torch.get_num_threads()}")
    print(f"{'batch':>5} {'method':>12} {'tokens/s':>10} {'speedup':>8} {'tokens/pass':>12} {'identical':>10}")
    identical_all = True
    tokens_per_pass_bs1: dict[str, float] = {}
    speedups_bs1: dict[str, float] = {}
    for batch_size in batch_sizes:
        prompts = code_prompts(tokenizer, batch_size, args.prompt_len, seed=batch_size)
        times: dict[str, list[float]] = {m: [] for m in methods}
        outputs: dict[str, list[list[int]]] = {}
        acceptance: dict[str, float] = {}
        for method in methods:   # warm-up (first-call allocations), not timed
            engines[method].generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
        for _ in range(args.rounds):
            for method in methods:
                engine = engines[method]
                before = engine.llm_engine.get_scheduler_stats().spec_decoding_stats
                seconds, outs, _ = run_once(engine, prompts, params)
                after = engine.llm_engine.get_scheduler_stats().spec_decoding_stats
                times[method].append(seconds)
                outputs[method] = outs
                drafts = after.num_drafts - before.num_drafts
                accepted = after.num_accepted_tokens - before.num_accepted_tokens
                acceptance[method] = 1.0 + accepted / drafts if drafts else 1.0
        base = statistics.median(times["none"])
        num_tokens = batch_size * args.max_tokens
        for method in methods:
            seconds = statistics.median(times[method])
            same = outputs[method] == outputs["none"]
            identical_all &= same
            print(f"{batch_size:>5} {method:>12} {num_tokens / seconds:>10.1f} {base / seconds:>8.2f} "
                  f"{acceptance[method]:>12.2f} {same!s:>10}")
            if batch_size == 1 and method != "none":
                tokens_per_pass_bs1[method] = acceptance[method]
                speedups_bs1[method] = base / seconds
    best = max(speedups_bs1.values(), default=float("nan"))
    print(f"ngram_tokens_per_pass={tokens_per_pass_bs1.get('ngram', float('nan')):.2f} "
          f"eagle_tokens_per_pass={tokens_per_pass_bs1.get('eagle', float('nan')):.2f} "
          f"best_speedup_bs1={best:.2f} identical={identical_all}")
    return 0 if identical_all else 1


if __name__ == "__main__":
    raise SystemExit(main())
