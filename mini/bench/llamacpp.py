"""`python -m mini bench --model HuggingFaceTB/SmolLM2-135M-Instruct --peer llamacpp`: mini against llama.cpp.

llama.cpp (through `llama-cpp-python`, an optional extra built from its source package: `pip install -e
'.[llamacpp]'`, several minutes of C++ compilation on 2 cores) is what a user who wants fast CPU inference of a
small model would pick. Both systems run the same weights. SmolLM2 ships only as a Q4_1 GGUF file: 4-bit blocks,
each with a scale and a minimum. mini dequantizes that file once into float32 (mini/model/gguf_loader.py) and
computes in float32. llama.cpp can run two versions of it:
- `--llamacpp-weights f32`: a float32 copy of the file whose tensors are exactly the values mini computes
  with (mini/bench/gguf_float32.py). Same weights, same precision: the comparison is of the two programs.
- `bf16`, `q8_0`, `q4_0`: the same copy with its matrices in that llama.cpp type, made from those float32 values:
  the peers of mini's `--dtype bfloat16`, `--quantization int8_per_channel_weight_only` and `--quantization gptq`
  (4-bit groups of 32, as Q4_0's blocks). `match` (default) picks the one matching mini's precision.
- `--llamacpp-weights gguf`: the file as shipped. llama.cpp multiplies the 4-bit blocks as stored, with activations
  quantized to 8 bits, so it reads 8x fewer bytes per weight than mini does.

The workload is `bench engine`'s: same prompts as token ids, same output lengths, greedy, EOS ignored. The batch
is the same too:
- `--llamacpp-batching batched` (default) decodes all the requests together in one llama.cpp context, one
  sequence each (mini/bench/llamacpp_batch.py), as mini's continuous batching does when they all fit;
- `sequential` runs them one after another, which is what llama-cpp-python's `Llama.generate` gives its users.

Reported, as median (min-max) of alternating rounds:
- output tokens per second;
- time to first token of one request alone (a 1-token generation of each of the first prompts);
- how many of the greedy outputs agree token for token (they may part after a near-tie, since the order of the
  arithmetic differs).
Last line: `speedup_vs_llamacpp=X.XX ttft_ratio=Y.YY` (mini's TTFT / llama.cpp's).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mini.bench.workload import Workload, generate_greedy, machine_line, make_workload, spread

INSTALL_HINT = ("llama-cpp-python is not installed: `pip install -e '.[llamacpp]'` builds it from its source "
                "package (a C++ compiler and cmake are needed; about 10 minutes on 2 cores)")


def gguf_file_for(model: str | None) -> str:
    """The GGUF file behind `--model`: a .gguf path, or a packaged model such as SmolLM2 (mini/model/registry.py)."""
    from mini.model import registry

    if model is not None and model.endswith(".gguf"):
        return model
    packaged = registry.find_packaged_model(model) if model is not None else None
    path = packaged.locate() if packaged is not None else None
    if path is None:
        raise SystemExit(f"--peer llamacpp needs a GGUF model (a .gguf file or one of "
                         f"{registry.installed_packaged_models()}); got --model {model!r}")
    return str(path)


def matching_llamacpp_weights(args: argparse.Namespace) -> str:
    """The llama.cpp type of the same precision as mini's run: q4_0, q8_0, bf16 or f32; for mini's `gguf`, the
    file as stored (both then multiply the same blocks)."""
    quantization = getattr(args, "quantization", None)
    if quantization == "gguf":
        return "gguf"
    if quantization == "gptq":
        return "q4_0"
    if quantization in ("int8_per_channel_weight_only", "int8_per_token"):
        return "q8_0"
    return "bf16" if args.dtype == "bfloat16" else "f32"


def run_llamacpp(llama, workload: Workload) -> tuple[float, list[list[int]]]:
    """Greedy generation of each request in turn, exactly `output_len` tokens (EOS ignored)."""
    outputs: list[list[int]] = []
    start = time.perf_counter()
    for prompt, out_len in zip(workload.prompts, workload.output_lens, strict=False):
        tokens: list[int] = []
        for token in llama.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                                    reset=True):
            tokens.append(token)
            if len(tokens) == out_len:
                break
        outputs.append(tokens)
    return time.perf_counter() - start, outputs


def agreement(a: list[list[int]], b: list[list[int]]) -> int:
    return sum(x == y for x, y in zip(a, b, strict=False))


def compare(args: argparse.Namespace) -> int:
    try:
        from llama_cpp import Llama
    except ImportError:
        print(f"error: {INSTALL_HINT}")
        return 2
    from mini import LLM
    from mini.bench.gguf_float32 import requantized_gguf
    from mini.bench.llamacpp_batch import BatchedLlamaCpp

    gguf_path = gguf_file_for(args.model)
    kind = matching_llamacpp_weights(args) if args.llamacpp_weights == "match" else args.llamacpp_weights
    llama_path = gguf_path if kind == "gguf" else str(requantized_gguf(gguf_path, kind))
    threads = torch.get_num_threads()
    llm = LLM(model=args.model, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              seed=args.seed, attention_backend=args.attention_backend, dtype=args.dtype or "float32",
              quantization=getattr(args, "quantization", None))
    workload = make_workload(llm.get_tokenizer(), args.num_prompts, tuple(args.prompt_len),
                             tuple(args.output_len), args.seed)
    longest = max(args.prompt_len) + max(args.output_len) + 8
    llama = Llama(model_path=llama_path, n_ctx=longest, n_threads=threads, n_threads_batch=threads,
                  n_batch=512, verbose=False, seed=args.seed)
    batched = BatchedLlamaCpp(llama, len(workload.prompts), longest) if args.llamacpp_batching == "batched" else None

    def run_peer(work: Workload) -> tuple[float, list[list[int]]]:
        return batched.generate(work) if batched is not None else run_llamacpp(llama, work)

    first_prompts = Workload(workload.prompts[:4], [1] * 4)
    weights = ("as stored (Q4_1 blocks for SmolLM2, 8-bit activations)" if kind == "gguf" else
               f"a copy of it with {kind} matrices, made from the float32 values mini starts from")
    print(machine_line(threads, "cpu"))
    print(f"workload: {args.num_prompts} prompts, {workload.num_prompt_tokens} prompt tokens, "
          f"{workload.num_output_tokens} output tokens (greedy, ignore_eos); weights: {gguf_path}; llama.cpp runs "
          f"{weights}, {args.llamacpp_batching}; mini computes in {args.dtype or 'float32'} with quantization="
          f"{getattr(args, 'quantization', None)}, continuous batching")
    generate_greedy(llm, Workload(workload.prompts[:2], [4, 4]))        # warm-up, both
    run_peer(Workload(workload.prompts[:2], [4, 4]))
    times: dict[str, list[float]] = {"mini": [], "llamacpp": [], "mini_ttft": [], "llamacpp_ttft": []}
    same = 0
    try:
        for round_index in range(args.rounds):
            mini_time, mini_out = generate_greedy(llm, workload)
            llama_time, llama_out = run_peer(workload)
            times["mini"].append(mini_time)
            times["llamacpp"].append(llama_time)
            times["mini_ttft"].append(statistics.median(
                generate_greedy(llm, Workload([p], [1]))[0] for p in first_prompts.prompts))
            times["llamacpp_ttft"].append(statistics.median(
                run_peer(Workload([p], [1]))[0] for p in first_prompts.prompts))
            same = agreement(mini_out, llama_out)
            print(f"round {round_index}: mini {mini_time:.2f}s, llama.cpp {llama_time:.2f}s; time to first token "
                  f"mini {times['mini_ttft'][-1] * 1e3:.0f} ms, llama.cpp {times['llamacpp_ttft'][-1] * 1e3:.0f} ms")
    finally:
        if batched is not None:
            batched.close()
    tokens = workload.num_output_tokens
    print(f"mini:       {spread([tokens / t for t in times['mini']])} output tok/s (continuous batching)")
    print(f"llama.cpp:  {spread([tokens / t for t in times['llamacpp']])} output tok/s ({args.llamacpp_batching})")
    print(f"time to first token, one request alone: mini {spread([t * 1e3 for t in times['mini_ttft']])} ms, "
          f"llama.cpp {spread([t * 1e3 for t in times['llamacpp_ttft']])} ms")
    print(f"greedy outputs identical token for token: {same} of {len(workload.prompts)}")
    speedup = statistics.median(times["llamacpp"]) / statistics.median(times["mini"])
    ttft_ratio = statistics.median(times["mini_ttft"]) / statistics.median(times["llamacpp_ttft"])
    print(f"speedup_vs_llamacpp={speedup:.2f} ttft_ratio={ttft_ratio:.2f}")
    return 0
