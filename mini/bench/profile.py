"""`python -m mini bench profile`: where the time of one engine run goes, per step part and per tensor op.

vLLM profiles with torch.profiler around the engine's steps (vllm/profiler/, `VLLM_TORCH_PROFILER_DIR`) and
reads the step's phases from its own timers (vllm/v1/metrics/). This does both on the workload of
`python -m mini bench` (same prompts, seed and engine arguments), in two passes:

1. **Step parts, by wall time.** A timer around each part of `LLMEngine.step`: the scheduler, the runner's
   request bookkeeping (`update_states`), the flat inputs (`prepare_inputs`), the model's forward (hooks on
   the module), the LM head, sampling metadata and the sampler, the scheduler's `update_from_output` and the
   output processor (detokenization, `RequestOutput`s). "other" is the rest of the step.
2. **Inside the forward, by op.** torch.profiler's self CPU time per aten op, grouped: matmuls, attention
   (SDPA, the KV gather `index_select`, the KV store `index_copy_`), element-wise (RMSNorm, RoPE, SiLU,
   residual adds), and everything else (views, allocation, small copies).

Timers cost about a microsecond each; the profiler pass runs separately so its overhead touches only part 2.
Last line: `model_share=X engine_ms_per_step=Y attention_share_of_model=Z`.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import Counter
from collections.abc import Callable

import torch

from mini.bench.workload import REAL_MODEL_SIZE, SHIPPED_MODEL_SIZE, Workload, make_workload, run_mini
from mini.config import ATTENTION_BACKENDS
from mini.entrypoints.llm import LLM

PARTS = ("schedule", "update_states", "prepare_inputs", "model forward", "lm head", "sampling metadata",
         "sampler", "update_from_output", "process_outputs", "other")
OP_GROUPS = {
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul"),
    "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::index_select", "aten::index_copy_",
                  "aten::_scaled_dot_product_attention_math"),
    "element-wise": ("aten::mul", "aten::add", "aten::pow", "aten::mean", "aten::rsqrt", "aten::silu",
                     "aten::neg", "aten::cat", "aten::sub", "aten::div", "aten::div_", "aten::sum", "aten::exp",
                     "aten::cos", "aten::sin", "aten::embedding", "aten::masked_fill_"),
}


class StepTimers:
    """Wall time per step part, collected by wrapping the engine's objects (instance attributes only)."""

    def __init__(self) -> None:
        self.seconds: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()

    def wrap(self, obj: object, name: str, part: str) -> None:
        original: Callable = getattr(obj, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - start
                self.calls[part] += 1

        setattr(obj, name, timed)

    def time_module(self, module: torch.nn.Module, part: str) -> None:
        starts: list[float] = []
        module.register_forward_pre_hook(lambda *_: starts.append(time.perf_counter()))

        def done(*_):
            self.seconds[part] += time.perf_counter() - starts.pop()
        module.register_forward_hook(done)


def install_timers(llm) -> StepTimers:
    engine = llm.llm_engine
    runner = engine.model_runner
    timers = StepTimers()
    timers.wrap(engine.scheduler, "schedule", "schedule")
    timers.wrap(engine.scheduler, "update_from_output", "update_from_output")
    timers.wrap(engine.output_processor, "process_outputs", "process_outputs")
    timers.wrap(runner, "update_states", "update_states")
    timers.wrap(runner, "_prepare_inputs", "prepare_inputs")
    timers.wrap(runner, "_sampling_metadata", "sampling metadata")
    timers.wrap(runner.model, "compute_logits", "lm head")
    timers.time_module(runner.model, "model forward")
    timers.time_module(runner.sampler, "sampler")
    timers.wrap(engine, "step", "step")
    return timers


def group_ops(key_averages) -> dict[str, float]:
    """Self CPU seconds per op group (see OP_GROUPS), plus "other"."""
    seconds: Counter[str] = Counter()
    for event in key_averages:
        group = next((name for name, ops in OP_GROUPS.items() if event.key in ops), "other")
        seconds[group] += event.self_cpu_time_total / 1e6
    return dict(seconds)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mini bench profile", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="local HF folder, .gguf file or offline hub id")
    parser.add_argument("--num-prompts", type=int, default=None, help="default: as `python -m mini bench`")
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(16, 256), metavar=("MIN", "MAX"))
    parser.add_argument("--output-len", type=int, nargs=2, default=(16, 256), metavar=("MIN", "MAX"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-num-seqs", type=int, default=128)
    parser.add_argument("--max-num-batched-tokens", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--attention-backend", default=None, choices=ATTENTION_BACKENDS)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--quantization", default=None, help="as LLM(quantization=...) (mini/model/quantization/)")
    parser.add_argument("--top-ops", type=int, default=12, help="also list this many single ops (0: none)")
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # It reads the model runner (attention backend, timers): the engine core stays in this process.
    os.environ["MINI_ENABLE_V1_MULTIPROCESSING"] = "0"
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.num_prompts is None:
        args.num_prompts = (SHIPPED_MODEL_SIZE if args.model is None else REAL_MODEL_SIZE)["num_prompts"]
    llm = LLM(model=args.model, attention_backend=args.attention_backend, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, seed=args.seed, dtype=args.dtype,
              quantization=args.quantization)
    workload = make_workload(llm.get_tokenizer(), args.num_prompts, tuple(args.prompt_len),
                             tuple(args.output_len), args.seed)
    run_mini(llm, Workload(workload.prompts[:4], [4] * 4))  # warm-up
    backend = llm.llm_engine.model_runner.attention_backend
    print(f"workload: {args.num_prompts} prompts, {workload.num_prompt_tokens} prompt tokens, "
          f"{workload.num_output_tokens} output tokens; attention backend {backend}; torch threads "
          f"{torch.get_num_threads()}")

    timers = install_timers(llm)
    total, _ = run_mini(llm, workload)
    num_steps = max(1, timers.calls["step"])
    parts = dict(timers.seconds)
    step_seconds = parts.pop("step")
    parts["other"] = max(0.0, step_seconds - sum(parts.values()))
    print(f"\n1. step parts ({total:.2f} s in {num_steps} steps, wall time)")
    print(f"{'part':22s} {'seconds':>8s} {'share':>7s} {'ms/step':>8s}")
    for part in PARTS:
        seconds = parts.get(part, 0.0)
        print(f"{part:22s} {seconds:8.3f} {seconds / step_seconds:7.1%} {seconds / num_steps * 1000:8.2f}")

    from torch.profiler import ProfilerActivity, profile

    # Only the forward's ops: profile a replay of the run's steps (the model alone, as `bench`'s ceiling).
    _, recorded = run_mini(llm, workload, record_steps=True)
    runner = llm.llm_engine.model_runner
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        for step_inputs in recorded:
            runner.replay_forward(step_inputs)
    averages = prof.key_averages()
    groups = group_ops(averages)
    model_total = sum(groups.values())
    print(f"\n2. inside the forward + LM head (torch.profiler, self CPU time of {len(recorded)} replayed steps)")
    for name in (*OP_GROUPS, "other"):
        print(f"{name:22s} {groups.get(name, 0.0):8.3f} {groups.get(name, 0.0) / model_total:7.1%}")
    if args.top_ops:
        print(f"\ntop {args.top_ops} ops by self CPU time")
        for event in sorted(averages, key=lambda e: -e.self_cpu_time_total)[:args.top_ops]:
            print(f"  {event.key:52s} {event.self_cpu_time_total / 1e6:7.3f} s  {event.count:7d} calls")

    model_seconds = parts.get("model forward", 0.0) + parts.get("lm head", 0.0)
    engine_ms = (step_seconds - model_seconds) / num_steps * 1000
    print(f"model_share={model_seconds / step_seconds:.2f} engine_ms_per_step={engine_ms:.2f} "
          f"attention_share_of_model={groups.get('attention', 0.0) / model_total:.2f}")
    return 0
