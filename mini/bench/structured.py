"""Structured output, measured: decode throughput with a JSON schema vs without, compile and mask times.

In the spirit of vLLM's benchmarks/benchmark_serving_structured_output.py, on the shipped model in one
process. 32 requests (by default) sample JSON for one schema (temperature 1, seeded); then the same
prompts run unconstrained with `ignore_eos` and `max_tokens` set to each request's constrained length,
so both runs generate the same tokens in the same batch shapes: the ratio is the cost of structured
output (per-step bitmask, applying it, advancing the FSMs; the first round also compiles). The two runs
alternate for `--rounds` rounds and the best time of each counts.

Compile time: a fresh `MiniBackend` (trie prebuilt) compiling the schema, and a fresh xgrammar
`GrammarCompiler` (tokenizer info prebuilt, cache off). Mask time per step: mini's
`StructuredOutputManager.grammar_bitmask` as measured inside the run, and xgrammar matchers filling a
`[num_requests, ceil(vocab/32)]` bitmask while replaying the same token sequences.
Last line: `throughput_ratio=X.XX mask_ms=Y.YY xgrammar_mask_ms=Z.ZZ compile_s=A.AA xgrammar_compile_s=B.BB`
(xgrammar figures are `nan` when xgrammar is not installed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from mini import LLM, SamplingParams
from mini.sampling_params import StructuredOutputsParams
from mini.structured_output.backend_mini import MiniBackend

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "city": {"enum": ["Paris", "Lima", "Oslo", "Kyoto"]},
        "zip": {"type": "string", "pattern": "[0-9]{5}"},
        "verified": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
    },
    "required": ["name", "city", "zip"],
}


def run_constrained(llm: LLM, prompts: list[str], max_tokens: int) -> tuple[list[int], float, list[float], list]:
    """-> (output lengths, seconds, per-step mask seconds, token id lists)."""
    engine = llm.llm_engine
    for index, prompt in enumerate(prompts):
        params = SamplingParams(temperature=1.0, seed=index, max_tokens=max_tokens,
                                structured_outputs=StructuredOutputsParams(json=SCHEMA))
        engine.add_request(f"c{index}", prompt, params)
    mask_seconds, finals = [], {}

    def record_mask_time(trace) -> None:   # a step observer: the engine times grammar_bitmask for it
        if trace.grammar_mask_seconds is not None:
            mask_seconds.append(trace.grammar_mask_seconds)

    remove_observer = engine.add_step_observer(record_mask_time)
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finals[output.request_id] = list(output.outputs[0].token_ids)
    elapsed = time.perf_counter() - start
    remove_observer()
    token_ids = [finals[f"c{index}"] for index in range(len(prompts))]
    return [len(t) for t in token_ids], elapsed, mask_seconds, token_ids


def run_unconstrained(llm: LLM, prompts: list[str], lengths: list[int]) -> float:
    """The same prompts and output lengths without a grammar, through the same step loop."""
    engine = llm.llm_engine
    for index, (prompt, length) in enumerate(zip(prompts, lengths, strict=False)):
        engine.add_request(f"u{index}", prompt, SamplingParams(temperature=1.0, seed=index,
                                                               max_tokens=max(1, length), ignore_eos=True))
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    return time.perf_counter() - start


def mini_compile_seconds(llm: LLM) -> float:
    engine = llm.llm_engine
    backend = MiniBackend(engine.tokenizer, engine.vocab_size, engine._eos_token_id())
    _ = backend.trie  # the tokenizer's trie is built once per engine, not per grammar
    start = time.perf_counter()
    backend.compile_grammar("json", json.dumps(SCHEMA))
    return time.perf_counter() - start


def xgrammar_figures(llm: LLM, token_ids: list[list[int]]) -> tuple[float, float]:
    """(compile seconds, mean per-step mask seconds) for xgrammar replaying the same outputs."""
    try:
        import xgrammar as xgr
    except ImportError:
        return float("nan"), float("nan")
    engine = llm.llm_engine
    info = xgr.TokenizerInfo.from_huggingface(engine.tokenizer, vocab_size=engine.vocab_size)
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    start = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False, separators=(", ", ": "))
    compile_seconds = time.perf_counter() - start
    matchers = [xgr.GrammarMatcher(compiled) for _ in token_ids]
    bitmask = xgr.allocate_token_bitmask(len(token_ids), engine.vocab_size)
    step_seconds = []
    for step in range(max(len(t) for t in token_ids)):
        active = [row for row, tokens in enumerate(token_ids) if step < len(tokens)]
        start = time.perf_counter()
        for row in active:
            matchers[row].fill_next_token_bitmask(bitmask, row)
        step_seconds.append(time.perf_counter() - start)
        for row in active:
            matchers[row].accept_token(token_ids[row][step])
    return compile_seconds, statistics.mean(step_seconds)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="python -m mini bench structured", description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3, help="constrained/unconstrained pairs; best of each")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: steadiest figures on a shared CPU; 0: torch's default)")
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    # It times the grammar mask through a step observer: the engine core stays in this process.
    os.environ["MINI_ENABLE_V1_MULTIPROCESSING"] = "0"

    llm = LLM(max_num_seqs=args.num_requests)
    prompts = [f"Customer record {index}:" for index in range(args.num_requests)]
    llm.generate(prompts[:2], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
    print(f"{args.num_requests} requests, JSON schema with {len(SCHEMA['properties'])} properties, "
          f"torch threads {torch.get_num_threads()}")
    constrained_runs, unconstrained_runs = [], []
    for _ in range(args.rounds):  # interleaved, best of each: a shared machine's noise hits both alike
        lengths, seconds, mask_seconds, token_ids = run_constrained(llm, prompts, args.max_tokens)
        constrained_runs.append(seconds)
        unconstrained_runs.append(run_unconstrained(llm, prompts, lengths))
    constrained_s, unconstrained_s = min(constrained_runs), min(unconstrained_runs)
    num_tokens = sum(lengths)
    print(f"constrained:   {num_tokens} tokens in {constrained_s:.2f} s = {num_tokens / constrained_s:8.1f} tok/s")
    print(f"unconstrained: {num_tokens} tokens in {unconstrained_s:.2f} s = {num_tokens / unconstrained_s:8.1f} tok/s")
    compile_s = mini_compile_seconds(llm)
    xgrammar_compile_s, xgrammar_mask_s = xgrammar_figures(llm, token_ids)
    summary = {
        "throughput_ratio": unconstrained_s / constrained_s,
        "mask_ms": statistics.mean(mask_seconds) * 1e3,
        "xgrammar_mask_ms": xgrammar_mask_s * 1e3,
        "compile_s": compile_s,
        "xgrammar_compile_s": xgrammar_compile_s,
    }
    print(" ".join(f"{name}={value:.2f}" for name, value in summary.items()))
    return summary


if __name__ == "__main__":
    main()
